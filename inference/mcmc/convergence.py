"""Every chain-based backend reports its own convergence: R-hat and ESS of what identifies a network posterior.

Per-weight R-hat says little for a neural network (neuron permutations give functionally identical
modes, :mod:`inference.evaluation.diagnostics`), so after sampling every chain backend (``hmc``,
``nuts``, ``sgld``, ``psgld``, ``sghmc``, ``csgmcmc``) evaluates, per kept draw,

* ``f_mean`` — the network's output (class probabilities for classification) at up to
  :data:`MAX_POINTS` evenly spaced training rows, ``[C, S, P, O]``;
* ``log_joint`` — log p(w, θ) + (N/m) Σ log p(y_n | x_n, w, θ) over m training rows (all of them up to
  :data:`MAX_ROWS`, else that many evenly spaced ones; a DataLoader fit: its first batch; HMC and NUTS:
  all rows, from the log density they keep per draw), ``[C, S]``;
* the likelihood's latents (e.g. ``noise_precision``),

and ArviZ's rank-normalised split R-hat and bulk / tail ESS of them
(:func:`~inference.evaluation.diagnostics.draws_convergence`).  :func:`chain_convergence` returns the
record that goes into ``post.info`` (``rhat_max``, ``ess_bulk_min``, ``ess_tail_min`` and
``convergence``, per quantity; for reference also per weight site, when the weights number at most
:data:`MAX_SITE_VALUES`, without entering the maxima or the warning) and warns, as the command line's run check does
(:func:`~inference.evaluation.diagnostics.convergence_warning`), when ``rhat_max`` >
:data:`~inference.evaluation.diagnostics.RHAT_WARNING`; the posterior's summary shows it
(:func:`~inference.evaluation.diagnostics.convergence_row`).
"""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch

from inference.evaluation.diagnostics import convergence_warning, draws_convergence
from inference.optim.potential import Potential

__all__ = ["MAX_POINTS", "MAX_ROWS", "DRAW_CHUNK", "MAX_SITE_VALUES", "draw_quantities", "chain_convergence"]

#: training rows the predictive means are diagnosed at (as :meth:`inference.posterior.Posterior.to_arviz`'s 16)
MAX_POINTS = 16
#: training rows the log joint is evaluated on (scaled by N/m)
MAX_ROWS = 1024
#: draws evaluated in one batched pass
DRAW_CHUNK = 64
#: random weights up to which R-hat / ESS are also reported per weight site
MAX_SITE_VALUES = 2000


def _evenly_spaced(n: int, count: int) -> torch.Tensor:
    return torch.as_tensor(np.unique(np.linspace(0, n - 1, min(count, n)).round().astype(np.int64)))


@torch.no_grad()
def draw_quantities(potential: Potential, z: torch.Tensor, log_density: Optional[torch.Tensor] = None,
                    batch: Optional[tuple] = None) -> tuple[dict, dict]:
    """``({name: [C, S, ...]}, {"points": P, "rows": m})``: the diagnosed quantities of the draws ``z`` ``[C, S, D]``.

    The rows are the potential's training rows (evaluated as :meth:`~inference.optim.potential.Potential.log_density`
    and :meth:`~inference.optim.potential.Potential.outputs` do: on cached output-module features where
    they are active), or ``batch`` ``(x, y)`` (a DataLoader fit's first batch).  ``log_density`` ``[C, S]``: log
    π(z) on all training rows where the sampler has it (HMC, NUTS: its ``lp`` statistic), turned into the
    log joint by removing the log-Jacobian of the latents' transforms; else it is evaluated on the rows.
    """
    bnn = potential.bnn
    chains, draws, dim = z.shape
    flat = z.reshape(chains * draws, dim)
    n = potential.num_data if batch is None else batch[0].shape[0]
    device = z.device
    points, rows = _evenly_spaced(n, MAX_POINTS).to(device), _evenly_spaced(n, MAX_ROWS).to(device)
    classify = bnn.likelihood.task == "classification"
    outputs, log_dets, joints, latents = [], [], [], {name: [] for name in bnn.latent_priors()}
    for chunk in flat.split(DRAW_CHUNK):
        values, log_det = potential.unpack(chunk)
        f = potential.outputs(chunk, points) if batch is None else bnn.forward_draws(values, batch[0][points])
        outputs.append(f.softmax(-1) if classify else f)
        log_dets.append(log_det)
        if log_density is None:  # log π(z) on the rows, less the latents' log-Jacobian
            lp = potential.log_density(chunk, rows) if batch is None else \
                potential.batch_log_density(chunk, batch[0][rows], batch[1][rows])
            joints.append(lp - log_det)
        for name in latents:
            latents[name].append(values[name])
    if log_density is None:
        log_joint = torch.cat(joints).reshape(chains, draws)
    else:
        log_joint = log_density - torch.cat(log_dets).reshape(chains, draws)
    quantities = {"f_mean": torch.cat(outputs).reshape(chains, draws, *outputs[0].shape[1:]), "log_joint": log_joint}
    quantities.update({name: torch.cat(parts).reshape(chains, draws, *parts[0].shape[1:]) for name, parts in latents.items()})
    return quantities, {"points": int(points.numel()), "rows": int(n if log_density is not None else rows.numel())}


def chain_convergence(name: str, potential: Potential, z: torch.Tensor, log_density: Optional[torch.Tensor] = None,
                      batch: Optional[tuple] = None, tree_depth_saturated: float = 0.0, stacklevel: int = 2) -> dict:
    """The convergence record of a sampler's draws ``z`` ``[C, S, D]`` for ``post.info``, with its warning.

    Returns ``{"rhat_max", "ess_bulk_min", "ess_tail_min", "convergence": {"quantities": {name: {...}},
    "points": P, "rows": m, "sites": {weight site: {"rhat_max", "ess_bulk_min"}} (up to
    :data:`MAX_SITE_VALUES` weights), "warning": text or None}}`` (:func:`draw_quantities`,
    :func:`~inference.evaluation.diagnostics.draws_convergence`).  A ``RuntimeWarning`` (``stacklevel`` above
    the caller) when ``rhat_max`` > :data:`~inference.evaluation.diagnostics.RHAT_WARNING`; its text is
    :func:`~inference.evaluation.diagnostics.convergence_warning`'s, which names saturated NUTS trees
    (``tree_depth_saturated``, a fraction) as the likely cause.
    """
    quantities, where = draw_quantities(potential, z, log_density, batch)
    result = draws_convergence(quantities)
    weights = [b for b in potential.blocks if b.name in potential.bnn._site_by_name]
    if weights and sum(b.stop - b.start for b in weights) <= MAX_SITE_VALUES:
        sites = draws_convergence({b.name: z[..., b.start:b.stop] for b in weights})["by_quantity"]
        where["sites"] = {site: {k: row[k] for k in ("rhat_max", "ess_bulk_min")} for site, row in sites.items()}
    text = convergence_warning({"rhat_max": result["rhat_max"], "tree_depth_saturated": tree_depth_saturated})
    if text:
        warnings.warn(f"{name}: {text}", RuntimeWarning, stacklevel=stacklevel + 1)
    return {"rhat_max": result["rhat_max"], "ess_bulk_min": result["ess_bulk_min"], "ess_tail_min": result["ess_tail_min"],
            "convergence": {"quantities": result["by_quantity"], **where, "warning": text}}
