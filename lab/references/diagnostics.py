"""Convergence of a reference on what it stores: R-hat and ESS of every predictive quantity.

Per-weight diagnostics say little about a neural network's posterior (hidden units can be permuted
and signs flipped without changing a prediction); a reference is judged where it is used, on every
stored predictive quantity — each test and grid point's predictive location and the noise scale
(regression), each point's class probabilities (classification) — with ArviZ's rank-normalised
split R-hat and bulk / tail ESS (Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021) over the
chains of one reference half.  A quantity that does not vary over the draws (a probability that
is 1 to float32 precision in every draw) has neither and is counted apart.
"""
from __future__ import annotations

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


def predictive_diagnostics(arrays: dict) -> dict:
    """``{"rhat_max", "ess_bulk_min", "ess_tail_min", "chains", "draws", "by_quantity": {name: {...}}}`` over
    every array of one reference half (``{"test/loc": [C, S, N, T], "grid/probs": [C, S, G, K], ...}``).

    Needs at least two chains of at least four draws each."""
    shapes = {value.shape[:2] for value in arrays.values()}
    if len(shapes) != 1:
        raise ValueError(f"the arrays of one half must share [chains, draws], got {sorted(shapes)}")
    chains, draws = shapes.pop()
    if chains < 2 or draws < 4:
        raise ValueError(f"R-hat and ESS need at least 2 chains of 4 draws, got {chains} chains of {draws}")
    by_quantity = {name: _quantity_diagnostics(value) for name, value in sorted(arrays.items())}
    measured = [d for d in by_quantity.values() if d["rhat_max"] is not None]
    return {"chains": int(chains), "draws": int(draws),
            "rhat_max": max(d["rhat_max"] for d in measured) if measured else None,
            "ess_bulk_min": min(d["ess_bulk_min"] for d in measured) if measured else None,
            "ess_tail_min": min(d["ess_tail_min"] for d in measured) if measured else None,
            "by_quantity": by_quantity}
