"""Per-layer view of a variational posterior: signal-to-noise, log α and sparsity.

For a weight with variational mean μ and sd σ the dropout rate parameter is
α = σ² / μ² (Kingma, Salimans & Welling 2015; Molchanov, Ashukha & Vetrov 2017), so
log α = −2 log(|μ|/σ): one number for every family.  Each family prunes by its own rule
(:mod:`inference.variational.pruning`): sparse VD log α > 3, Kingma VD log α ≥ 0, Graves and
Radial |μ|/σ < λ = 0.83 (log α > −2 log λ).  (μ, σ) and the rule come from the guide through
:class:`inference.variational.VariationalGuide` (for the Radial guide σ is the marginal sd σ/√D);
for other posteriors they are estimated from posterior draws.
"""
from __future__ import annotations

import numpy as np
import torch

from inference.variational import VariationalGuide, get_family, sparsity

from . import plots
from .html import heading, image, join, note, paragraph, table
from .rundata import NotApplicable, ReportRun

__all__ = ["variational_layers", "loc_scale", "family_rule"]

#: the rule shown for guides without one: sparse variational dropout's log α > 3 (Molchanov et al. 2017)
FALLBACK_RULE = get_family("sparse-vd").pruning_rule
ESTIMATE_DRAWS = 400


def _protocol_guide(posterior):
    """The posterior's guide when it follows :class:`VariationalGuide` over every random weight site."""
    guide = getattr(posterior, "guide", None)
    if isinstance(guide, VariationalGuide) and {s.name for s in posterior.bnn.sites} <= set(guide.sites()):
        return guide
    return None


def loc_scale(posterior, num_draws: int = ESTIMATE_DRAWS) -> tuple[dict, str]:
    """``{site: (μ [n], σ [n])}`` (flattened numpy) over the random *weight* sites, and their source."""
    names = [s.name for s in posterior.bnn.sites]
    guide = _protocol_guide(posterior)
    if guide is not None:
        out = {}
        for name in names:
            loc, scale = guide.site_loc_scale(name)
            out[name] = (loc.reshape(-1).numpy(), scale.reshape(-1).numpy())
        return out, f"the {posterior.guide_name!r} guide's variational parameters (marginal mean and sd per weight)"
    with torch.no_grad():
        draws = posterior.sample_params(num_draws, seed=0)
    out = {}
    for name in names:
        flat = draws[name].reshape(draws[name].shape[0], -1)
        out[name] = (flat.mean(0).numpy(), flat.std(0).numpy())
    return out, f"{num_draws} posterior draws (mean and sd per weight)"


def family_rule(posterior):
    """``(per-site prunable fraction, rule text, log-α threshold)`` of the guide's own pruning rule.

    Falls back to sparse VD's log α > 3 for guides without one (e.g. ``AutoNormal``).
    """
    guide = _protocol_guide(posterior)
    rule = guide.pruning_rule() if guide is not None else None
    if rule is None:
        threshold = FALLBACK_RULE.default_threshold
        return None, f"log α > {threshold:g} (sparse VD's rule; this guide has none)", threshold
    report = sparsity(posterior)
    return report["layers"], report["rule"], rule.log_alpha_threshold(report["threshold"])


def _median(values: np.ndarray) -> float:
    """Median of the finite entries (NaN when there are none, e.g. a fully pruned site)."""
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("nan")


def _pruning_rows(record: dict) -> list:
    sizes, pruned = record.get("sizes", {}), record.get("pruned", {})
    return [(site, sizes.get(site, ""), pruned.get(site, ""), fraction) for site, fraction in record.get("layers", {}).items()]


def variational_layers(run: ReportRun) -> str:
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
        parts += [heading(f"Pruned: {record['mode']}"),
                  paragraph(f"Pruned {record.get('num_pruned', '?')} of {record.get('num_weights', '?')} weights "
                            f"(sparsity {record.get('sparsity', 0):.3f}; the rule alone marks "
                            f"{record.get('learned_sparsity', float('nan')):.3f})."),
                  table(_pruning_rows(record), ["site", "weights", "pruned", "fraction"])]
    else:
        parts.append(note("no pruning was applied to this run (fit with --prune principled|random to prune)."))
    parts.append(image(plots.histograms_png(log_alpha, "log α", threshold=threshold), "log alpha histograms"))
    return join(parts)
