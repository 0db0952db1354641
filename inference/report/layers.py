"""Per-layer view of a variational posterior: signal-to-noise, log α and sparsity.

For a weight with variational mean μ and sd σ the dropout rate parameter is
α = σ² / μ² (Kingma et al. 2015; Molchanov et al. 2017, eq. 8), so
log α = −2 log(|μ|/σ).  Sparse variational dropout prunes weights with log α > 3
(|μ|/σ < e^{−3/2} ≈ 0.22): such a weight's posterior is mostly noise.
(μ, σ) come from the guide when it exposes them — a ``site_loc_scale(name)`` hook or
Pyro's ``AutoNormal`` — and are otherwise estimated from posterior draws.
"""
from __future__ import annotations

import numpy as np
import torch

from . import plots
from .html import image, note, paragraph, table
from .rundata import NotApplicable, Run

__all__ = ["variational_layers", "loc_scale", "LOG_ALPHA_THRESHOLD"]

LOG_ALPHA_THRESHOLD = 3.0
ESTIMATE_DRAWS = 400


def loc_scale(posterior, num_draws: int = ESTIMATE_DRAWS) -> tuple[dict, str]:
    """``{site: (μ [n], σ [n])}`` (flattened) over the random *weight* sites, and their source."""
    from pyro.infer.autoguide import AutoNormal

    names = [s.name for s in posterior.bnn.sites]
    guide = getattr(posterior, "guide", None)
    hook = getattr(guide, "site_loc_scale", None)
    out = {}
    with torch.no_grad():
        if callable(hook):
            for name in names:
                loc, scale = hook(name)
                out[name] = (loc.reshape(-1).numpy(), scale.reshape(-1).numpy())
            return out, "the guide's variational parameters"
        if isinstance(guide, AutoNormal):
            for name in names:
                loc, scale = guide._get_loc_and_scale(name)
                out[name] = (loc.detach().reshape(-1).numpy(), scale.detach().reshape(-1).numpy())
            return out, "the guide's variational parameters (AutoNormal)"
        draws = posterior.sample_params(num_draws, seed=0)
    for name in names:
        flat = draws[name].reshape(draws[name].shape[0], -1)
        out[name] = (flat.mean(0).numpy(), flat.std(0).numpy())
    return out, f"{num_draws} posterior draws (mean and sd per weight)"


def _sparsity_rows(record) -> list:
    """Rows (layer, value) from a pruning / sparsity record: a number or a per-layer mapping."""
    if isinstance(record, (int, float)):
        return [("overall", record)]
    if isinstance(record, dict):
        rows = []
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append((key, value))
            elif isinstance(value, dict):
                rows += [(f"{key}: {k}", v) for k, v in value.items() if isinstance(v, (int, float, str))]
        return rows
    return []


def variational_layers(run: Run) -> str:
    if run.metrics.get("num_random", 1) == 0:
        raise NotApplicable("the model has no random parameters")
    posterior = run.posterior
    if posterior.kind != "variational":
        raise NotApplicable(f"{run.backend!r} gives draws, not a variational posterior with per-weight (μ, σ)")
    if not posterior.bnn.sites:
        raise NotApplicable("no random weights (only likelihood latents are random)")
    values, source = loc_scale(posterior)
    log_alpha, rows = {}, []
    for name, (loc, scale) in values.items():
        snr = np.abs(loc) / np.maximum(scale, 1e-30)
        log_alpha[name] = -2.0 * np.log(np.maximum(snr, 1e-30))
        rows.append((name, loc.size, float(np.median(snr)), float(np.median(log_alpha[name])),
                     float(np.mean(log_alpha[name] > LOG_ALPHA_THRESHOLD))))
    parts = [paragraph(f"(μ, σ) from {source}. log α = −2 log(|μ|/σ); the share with log α > "
                       f"{LOG_ALPHA_THRESHOLD:g} is what threshold (principled) pruning would remove."),
             table(rows, ["site", "weights", "median |μ|/σ", "median log α", f"share log α > {LOG_ALPHA_THRESHOLD:g}"])]
    recorded = _sparsity_rows(posterior.info.get("sparsity")) + _sparsity_rows(run.config.get("prune"))
    if recorded:
        parts += ["<h3>Recorded sparsity / pruning</h3>", table(recorded, ["layer / field", "value"])]
    else:
        parts.append(note("no pruning was recorded for this run (fit with --prune principled|random to prune)."))
    parts.append(image(plots.histograms_png(log_alpha, "log α", threshold=LOG_ALPHA_THRESHOLD), "log alpha histograms"))
    return "\n".join(parts)
