"""Convergence of a reference on what it stores: R-hat and ESS of every predictive quantity.

Per-weight diagnostics say little about a neural network's posterior (hidden units can be permuted
and signs flipped without changing a prediction); a reference is judged where it is used, on every
stored predictive quantity — each test and grid point's predictive location and the noise scale
(regression), each point's class probabilities (classification) — with ArviZ's rank-normalised
split R-hat and bulk / tail ESS (Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021) over the
chains of one reference half.  A quantity that does not vary over the draws (a probability that
is 1 to float32 precision in every draw) has neither and is counted apart.

A half is several independent NUTS fits; the same diagnostics over the chains of each fit alone
(``within_fits``) tell the two ways a half can fail apart: chains that do not mix within a fit (the
within-fit R-hat is high too), or fits that each mix but settle in different modes (the within-fit R-hat
is near 1 while the half's is not).  Neither makes a pooled half a sample of the posterior: fits in
different modes are pooled in proportion to how many landed in each, not to the modes' posterior mass.
"""
from __future__ import annotations

from typing import Optional

import arviz as az
import numpy as np

from inference.evaluation.arviz_export import quiet_arviz

__all__ = ["predictive_diagnostics"]


def _quantity_diagnostics(values: np.ndarray) -> dict:
    """``values`` ``[C, S, ...]``: the worst R-hat and ESS over its trailing entries."""
    chains, draws = values.shape[:2]
    flat = values.reshape(chains, draws, -1).astype(np.float64)
    constant = np.ptp(flat, axis=(0, 1)) == 0
    varying = flat[:, :, ~constant]
    out = {"quantities": int(flat.shape[-1]), "constant": int(constant.sum())}
    if not varying.shape[-1]:
        return {**out, "rhat_max": None, "ess_bulk_min": None, "ess_tail_min": None}
    with quiet_arviz():
        dataset = az.convert_to_dataset({"q": varying})
        rhat = az.rhat(dataset, method="rank")["q"].values
        bulk = az.ess(dataset, method="bulk")["q"].values
        tail = az.ess(dataset, method="tail")["q"].values
    return {**out, "rhat_max": float(np.nanmax(rhat)), "ess_bulk_min": float(np.nanmin(bulk)),
            "ess_tail_min": float(np.nanmin(tail)), "rhat_above_1.01": int((rhat > 1.01).sum()),
            "ess_bulk_below_1000": int((bulk < 1000).sum())}


def _summary(by_quantity: dict) -> dict:
    measured = [d for d in by_quantity.values() if d["rhat_max"] is not None]
    return {key: (pick(d[key] for d in measured) if measured else None)
            for key, pick in (("rhat_max", max), ("ess_bulk_min", min), ("ess_tail_min", min))}


def predictive_diagnostics(arrays: dict, chains_per_fit: Optional[int] = None) -> dict:
    """``{"rhat_max", "ess_bulk_min", "ess_tail_min", "chains", "draws", "by_quantity": {name: {...}}}`` over
    every array of one reference half (``{"test/loc": [C, S, N, T], "grid/probs": [C, S, G, K], ...}``), and
    with ``chains_per_fit`` (the half's C chains are C / chains_per_fit fits' chains, one fit after another)
    ``"within_fits"``: per fit, ``rhat_max``, ``ess_bulk_min`` and ``ess_tail_min`` over that fit's chains alone
    (module docstring).

    Needs at least two chains of at least four draws each (two per fit with ``chains_per_fit``)."""
    shapes = {value.shape[:2] for value in arrays.values()}
    if len(shapes) != 1:
        raise ValueError(f"the arrays of one half must share [chains, draws], got {sorted(shapes)}")
    chains, draws = shapes.pop()
    if chains < 2 or draws < 4:
        raise ValueError(f"R-hat and ESS need at least 2 chains of 4 draws, got {chains} chains of {draws}")
    if chains_per_fit is not None and (chains_per_fit < 2 or chains % chains_per_fit):
        raise ValueError(f"chains_per_fit must be at least 2 and divide the {chains} chains, got {chains_per_fit}")
    by_quantity = {name: _quantity_diagnostics(value) for name, value in sorted(arrays.items())}
    out = {"chains": int(chains), "draws": int(draws), **_summary(by_quantity), "by_quantity": by_quantity}
    if chains_per_fit is not None:
        out["within_fits"] = [
            _summary({name: _quantity_diagnostics(value[start:start + chains_per_fit]) for name, value in arrays.items()})
            for start in range(0, chains, chains_per_fit)]
    return out
