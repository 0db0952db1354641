"""Convergence diagnostics on quantities that are meaningful for neural networks.

Per-weight R-hat is uninformative for neural networks: neuron permutations make the
posterior multimodal with functionally identical modes, so chains in different modes
disagree on every weight while agreeing on every prediction.  We therefore report
ArviZ's rank-normalised split R-hat and bulk/tail ESS (Vehtari et al. 2021) of the
*predictive mean at test points* (``f_mean``) and of the *log joint density*
(``log_joint``), both written by :mod:`inference.evaluation.arviz_export`.
"""
from __future__ import annotations

from typing import Optional

import arviz as az
import numpy as np
import torch

from inference.evaluation.arviz_export import quiet_arviz

__all__ = ["PREDICTIVE_VARS", "RHAT_WARNING", "predictive_summary", "convergence_metrics", "convergence_warning",
           "tree_depth_saturation", "MIN_DRAWS_PER_CHAIN", "draws_convergence", "convergence_row"]

PREDICTIVE_VARS = ("f_mean", "log_joint")

#: ``rhat_max`` above this means the chains disagree (a lenient bar for runs of a few hundred
#: draws per chain; Vehtari et al. 2021 recommend 1.01 for final inferences from long chains)
RHAT_WARNING = 1.05

#: split R-hat and ESS split each chain in two halves and need a few draws in each
MIN_DRAWS_PER_CHAIN = 4


def predictive_summary(idata: az.InferenceData):
    """ArviZ summary (mean, sd, MCSE, ESS bulk/tail, R-hat) of the predictive quantities.

    With a single chain (e.g. independent draws from a variational posterior) R-hat is
    undefined and its column is left out.
    """
    single_chain = idata.posterior.sizes["chain"] < 2
    with quiet_arviz():
        summary = az.summary(idata, var_names=list(PREDICTIVE_VARS), kind="all")
    return summary.drop(columns=["r_hat"]) if single_chain else summary


def convergence_metrics(idata: az.InferenceData) -> dict:
    """``rhat_max``, ``ess_bulk_min``, ``ess_tail_min`` over predictive quantities, and ``divergences``.

    R-hat needs at least two chains; with a single chain (independent variational draws)
    ``rhat_max`` is ``None``.  R-hat and ESS need at least :data:`MIN_DRAWS_PER_CHAIN` draws per
    chain: point-mass members (MAP, deep-ensemble members: one draw per chain) have neither, so
    all three are ``None``.  Chains that are the members of a mixture (``idata.attrs["chains"] == "members"``:
    MultiSWAG, ensembles) sit in different modes by design (Wilson & Izmailov 2020), so R-hat and ESS between
    them would report a failure to mix that is the method itself: all three are ``None`` and
    ``chains_are_members`` is ``True`` (the members' spread is ``member_disagreement``).
    """
    num_chains, num_draws = int(idata.posterior.sizes["chain"]), int(idata.posterior.sizes["draw"])
    members = idata.attrs.get("chains") == "members"
    out = {"rhat_max": None, "ess_bulk_min": None, "ess_tail_min": None,
           "num_chains": num_chains, "num_draws": num_draws, **({"chains_are_members": True} if members else {})}
    if num_draws >= MIN_DRAWS_PER_CHAIN and not members:
        summary = predictive_summary(idata)
        out["rhat_max"] = float(np.nanmax(summary["r_hat"].to_numpy())) if "r_hat" in summary else None
        out["ess_bulk_min"] = float(np.nanmin(summary["ess_bulk"].to_numpy()))
        out["ess_tail_min"] = float(np.nanmin(summary["ess_tail"].to_numpy()))
    stats = getattr(idata, "sample_stats", None)
    if stats is not None and "diverging" in stats:
        out["divergences"] = int(stats["diverging"].values.sum())
    max_depth = idata.attrs.get("max_tree_depth")
    if stats is not None and "tree_depth" in stats and max_depth:
        out["tree_depth_saturated"] = tree_depth_saturation(stats["tree_depth"].values, max_depth)
    return out


def draws_convergence(quantities: dict) -> dict:
    """R-hat and ESS of per-draw quantities, overall and per quantity, from arrays (no ``InferenceData`` needed).

    Args:
        quantities: ``{name: [C, S, ...]}`` numpy arrays or tensors, ``C`` chains of ``S`` draws (e.g.
            ``f_mean`` ``[C, S, P, O]``, ``log_joint`` ``[C, S]``, a likelihood latent).
    Returns:
        ``{"rhat_max", "ess_bulk_min", "ess_tail_min", "by_quantity": {name: {"rhat_max", "ess_bulk_min",
        "ess_tail_min"}}}``: ArviZ's rank-normalised split R-hat and bulk / tail ESS (Vehtari et al. 2021), the
        worst over each quantity's elements and over all quantities.  R-hat is ``None`` with one chain and
        everything is ``None`` below :data:`MIN_DRAWS_PER_CHAIN` draws; a quantity constant over the draws
        (R-hat undefined) is left out of the maxima.
    """
    arrays = {name: np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
              for name, value in quantities.items()}
    empty = {"rhat_max": None, "ess_bulk_min": None, "ess_tail_min": None}
    shapes = {a.shape[:2] for a in arrays.values()}
    if not arrays or len(shapes) != 1:
        raise ValueError(f"quantities need one shared [chains, draws] shape, got {sorted(shapes)}")
    chains, draws = shapes.pop()
    if draws < MIN_DRAWS_PER_CHAIN:
        return {**empty, "by_quantity": {}}
    by_quantity = {}
    with quiet_arviz():
        for name, array in arrays.items():
            data = az.convert_to_dataset({name: array})
            row = {"rhat_max": _worst(az.rhat(data)[name].values, np.nanmax) if chains > 1 else None,
                   "ess_bulk_min": _worst(az.ess(data, method="bulk")[name].values, np.nanmin),
                   "ess_tail_min": _worst(az.ess(data, method="tail")[name].values, np.nanmin)}
            by_quantity[name] = row
    out = {key: _worst([row[key] for row in by_quantity.values() if row[key] is not None],
                       np.nanmax if key == "rhat_max" else np.nanmin) for key in empty}
    return {**out, "by_quantity": by_quantity}


def _worst(values, reduce):
    """``reduce`` over the finite entries of ``values`` as a float, ``None`` when there are none."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    values = values[np.isfinite(values)]
    return float(reduce(values)) if values.size else None


def tree_depth_saturation(tree_depth, max_tree_depth: int) -> float:
    """Fraction of NUTS transitions whose tree reached ``max_tree_depth`` (Stan's tree-depth warning).

    ``tree_depth``: per-draw depths, any array shape (numpy, or torch on any device).
    """
    if isinstance(tree_depth, torch.Tensor):
        tree_depth = tree_depth.cpu()
    return float(np.mean(np.asarray(tree_depth) >= int(max_tree_depth)))


def convergence_warning(metrics: dict):
    """A one-line explanation when ``rhat_max`` says the chains have not mixed, else ``None``."""
    rhat = metrics.get("rhat_max")
    if rhat is None or not rhat > RHAT_WARNING:
        return None
    saturated = metrics.get("tree_depth_saturated") or 0.0
    cause = (
        f"; {saturated:.0%} of the NUTS trajectories hit the maximum tree depth, a sign of a badly conditioned posterior"
        if saturated > 0.5
        else ""
    )
    return (
        f"rhat_max {rhat:.3g} > {RHAT_WARNING}: the chains disagree on the predictive means or the log joint, so the "
        f"draws do not yet represent one posterior{cause}; run longer chains, sample fewer weights (e.g. "
        f"stochastic='last') or see docs/mcmc.md, 'When NUTS does not mix'"
    )


def convergence_row(info: dict) -> Optional[tuple]:
    """The posterior summary's ``("convergence", ...)`` row from the fit's record in ``info``
    (:func:`inference.mcmc.convergence.chain_convergence`), or ``None`` without one."""
    record = info.get("convergence")
    if not isinstance(record, dict) or info.get("ess_bulk_min") is None:
        return None
    names = ", ".join(record.get("quantities", {}))
    rhat = info.get("rhat_max")
    text = (f"R-hat max {rhat:.3g}, " if rhat is not None else "R-hat n/a (1 chain), ") + \
        f"bulk ESS min {info['ess_bulk_min']:.0f}, tail ESS min {info.get('ess_tail_min') or 0:.0f} ({names})"
    if rhat is not None and rhat > RHAT_WARNING:
        text += f"; above {RHAT_WARNING}: the chains have not mixed"
    return "convergence", text
