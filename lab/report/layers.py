"""Per-layer view of a variational posterior: signal-to-noise, log α and sparsity.

For a weight with variational mean μ and sd σ the dropout rate parameter is
α = σ² / μ² (Kingma et al. 2015; Molchanov et al. 2017, eq. 8), so
log α = −2 log(|μ|/σ): one number for every family.  Each family prunes by its own rule
(:mod:`inference.variational.pruning`): sparse VD log α > 3, Kingma VD log α ≥ 0, Graves and
Radial |μ|/σ < λ = 0.83 (log α > −2 log λ).  (μ, σ) come from the guide — the
mean-field families' ``site_params`` and ``family.sigma``, the Radial guide's marginal sd
σ/√D, Pyro's ``AutoNormal`` — and are otherwise estimated from posterior draws.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from . import plots
from .html import image, note, paragraph, table
from .rundata import NotApplicable, Run

__all__ = ["variational_layers", "loc_scale", "family_rule"]

#: log α threshold of sparse variational dropout (Molchanov et al. 2017), used when the guide has no rule
LOG_ALPHA_THRESHOLD = 3.0
ESTIMATE_DRAWS = 400


def loc_scale(posterior, num_draws: int = ESTIMATE_DRAWS) -> tuple[dict, str]:
    """``{site: (μ [n], σ [n])}`` (flattened numpy) over the random *weight* sites, and their source."""
    from pyro.infer.autoguide import AutoNormal

    names = [s.name for s in posterior.bnn.sites]
    guide = getattr(posterior, "guide", None)
    out = {}
    with torch.no_grad():
        if hasattr(guide, "radial_site_names"):  # inference.variational.AutoRadial
            for name in names:
                loc, log_scale = guide.site_params(name)
                sd = log_scale.exp() / math.sqrt(max(1, loc.numel()))  # marginal sd: E ξ_i² = 1/D
                out[name] = (loc.reshape(-1).numpy(), sd.reshape(-1).numpy())
            return out, "the Radial guide (marginal sd σ/√D)"
        if hasattr(guide, "site_params") and hasattr(guide, "family"):  # inference.variational.MeanFieldGuide
            for name in names:
                loc, s = guide.site_params(name)
                out[name] = (loc.reshape(-1).numpy(), guide.family.sigma(loc, s).reshape(-1).numpy())
            return out, f"the {guide.family.name} guide's variational parameters"
        if isinstance(guide, AutoNormal):
            for name in names:
                loc, scale = guide._get_loc_and_scale(name)
                out[name] = (loc.reshape(-1).numpy(), scale.reshape(-1).numpy())
            return out, "the AutoNormal guide's variational parameters"
        draws = posterior.sample_params(num_draws, seed=0)
    for name in names:
        flat = draws[name].reshape(draws[name].shape[0], -1)
        out[name] = (flat.mean(0).numpy(), flat.std(0).numpy())
    return out, f"{num_draws} posterior draws (mean and sd per weight)"


def family_rule(posterior):
    """``(per-site prunable fraction, rule text, log-α threshold)`` of the guide's own pruning rule.

    Falls back to sparse VD's log α > 3 for guides without one (e.g. ``AutoNormal``).
    """
    try:
        from inference.variational.pruning import sparsity

        report = sparsity(posterior)
    except (ImportError, ValueError):
        return None, f"log α > {LOG_ALPHA_THRESHOLD:g} (sparse VD's rule; this guide has none)", LOG_ALPHA_THRESHOLD
    family = getattr(getattr(posterior, "guide", None), "family", None)
    threshold = float(report["threshold"])
    if not hasattr(family, "log_alpha"):  # an SNR rule: |μ|/σ < λ  ⇔  log α > −2 log λ
        threshold = -2.0 * math.log(threshold)
    return report["layers"], report["rule"], threshold


def _median(values: np.ndarray) -> float:
    """Median of the finite entries (NaN when there are none, e.g. a fully pruned site)."""
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("nan")


def _pruning_rows(record: dict) -> list:
    sizes, pruned = record.get("sizes", {}), record.get("pruned", {})
    return [(site, sizes.get(site, ""), pruned.get(site, ""), fraction) for site, fraction in record.get("layers", {}).items()]


def variational_layers(run: Run) -> str:
    if run.metrics.get("num_random", 1) == 0:
        raise NotApplicable("the model has no random parameters")
    posterior = run.posterior
    if posterior.kind != "variational":
        raise NotApplicable(f"{run.backend!r} gives draws, not a variational posterior with per-weight (μ, σ)")
    if not posterior.bnn.sites:
        raise NotApplicable("no random weights (only likelihood latents are random)")
    values, source = loc_scale(posterior)
    fractions, rule, threshold = family_rule(posterior)
    log_alpha, rows = {}, []
    for name, (loc, scale) in values.items():
        removed = (loc == 0) & (scale == 0)  # pruned weights: exactly zero in every draw
        with np.errstate(divide="ignore", invalid="ignore"):
            snr = np.where(removed, np.nan, np.abs(loc) / scale)
            log_alpha[name] = -2.0 * np.log(snr)
        share = fractions.get(name) if fractions else float(np.mean(removed | (log_alpha[name] > threshold)))
        rows.append((name, loc.size, int(removed.sum()), _median(snr), _median(log_alpha[name]), share))
    parts = [paragraph(f"(μ, σ) from {source}. log α = −2 log(|μ|/σ). Pruning rule: {rule}; the last column is "
                       "the share of each site's weights the rule marks as prunable (or already pruned); pruned weights "
                       "(μ = σ = 0) are left out of the medians and histograms."),
             table(rows, ["site", "weights", "pruned", "median |μ|/σ", "median log α", "share prunable"])]
    record = posterior.info.get("pruning") or run.config.get("prune")
    if record and record.get("mode", "none") != "none":
        parts += [f"<h3>Pruned: {record['mode']}</h3>",
                  paragraph(f"Pruned {record.get('num_pruned', '?')} of {record.get('num_weights', '?')} weights "
                            f"(sparsity {record.get('sparsity', 0):.3f}; the rule alone marks "
                            f"{record.get('learned_sparsity', float('nan')):.3f})."),
                  table(_pruning_rows(record), ["site", "weights", "pruned", "fraction"])]
    else:
        parts.append(note("no pruning was applied to this run (fit with --prune principled|random to prune)."))
    parts.append(image(plots.histograms_png(log_alpha, "log α", threshold=threshold), "log alpha histograms"))
    return "\n".join(parts)
