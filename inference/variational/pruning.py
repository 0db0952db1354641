"""Sparsity, principled vs random pruning, and repeated Monte Carlo evaluation (seed 002 §3.3, §4.2).

* :func:`sparsity` — per-layer (per weight site) and overall fraction of weights that the
  family's principled rule marks as prunable, or that are already pruned: Graves |μ|/σ < λ = 0.83
  (Graves 2011 eq. 19), sparse VD log α > 3 (Molchanov et al. 2017), Kingma VD log α ≥ 0 (α at
  its cap, see :mod:`inference.variational.families`), Radial |μ|/sd < λ with the marginal
  sd σ/√D of a D-entry tensor (E ξ_i² = 1/D).
* :func:`prune` — returns a *new* posterior in which the chosen weights are exactly zero: their
  mean and sd are set to 0 (σ through log σ = −∞, seed 002 eq. 3.21), so every draw has w = 0
  and they contribute exactly nothing to any output.  ``"principled"`` prunes by the rule;
  ``"random"`` prunes, in every layer, as many weights as the rule would, chosen uniformly at
  random (seed 002 §4.2: does the learned sparsity beat chance?); ``"none"`` returns the
  posterior unchanged (sparsity 0) and works for any posterior.
* :func:`evaluate_repeated` — test accuracy (RMSE for regression) of the predictive mean over T
  posterior draws, repeated n times with fresh draws: mean ± sd (seed 002 Table 4.3 procedure).
"""
from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from .families import GaussianFamily
from .meanfield import MeanFieldGuide
from .radial import AutoRadial

__all__ = ["PRUNE_MODES", "sparsity", "prune", "evaluate_repeated", "guide_sparsity"]

PRUNE_MODES = ("none", "principled", "random")
_SNR_RULE = GaussianFamily()


class _SiteView:
    """Uniform access to one weight site of a variational guide: rule mask and in-place pruning.

    ``offset`` is added to ``spread`` before the rule is applied (the Radial family's marginal sd
    per weight is σ/√D, i.e. log σ − ½ log D).
    """

    def __init__(self, name, loc, spread, family, offset=0.0):
        self.name, self.loc, self.spread, self.family, self.offset = name, loc, spread, family, offset

    def pruned(self) -> torch.Tensor:
        return (self.loc == 0) & (self.family.sigma(self.loc, self.spread) == 0)

    def prunable(self, threshold) -> torch.Tensor:
        with torch.no_grad():
            return self.pruned() | self.family.prune_mask(self.loc, self.spread + self.offset, threshold)

    def prune_(self, mask: torch.Tensor) -> None:
        with torch.no_grad():
            self.loc[mask] = 0.0
            if self.family.param_name == "log_sigma":
                self.spread[mask] = -math.inf


def _site_views(guide, bnn) -> tuple[list[_SiteView], object]:
    if isinstance(guide, MeanFieldGuide):
        views = []
        for name in guide.site_names:
            loc, spread = guide.site_params(name)
            views.append(_SiteView(name, loc, spread, guide.family))
        return views, guide.family
    if isinstance(guide, AutoRadial):
        weight_sites = {s.name for s in bnn.sites}
        views = []
        for name in guide.radial_site_names:
            if name in weight_sites:
                loc, log_scale = guide.site_params(name)
                offset = -0.5 * math.log(max(1, loc.numel()))
                views.append(_SiteView(name, loc.data, log_scale.data, _SNR_RULE, offset))
        return views, _SNR_RULE
    return [], None


def _views_of(posterior, action: str):
    guide = getattr(posterior, "guide", None)
    views, family = _site_views(guide, posterior.bnn)
    if not views:
        backend = posterior.info.get("backend", "unknown") if hasattr(posterior, "info") else "unknown"
        raise ValueError(
            f"cannot {action}: the posterior (backend {backend!r}) has no variational-family weight sites; "
            f"fit the model with stochastic weights and a backend among 'graves', 'svi-lrt', 'sparse-vd', "
            f"'kingma-vd', 'radial'"
        )
    return views, family


def _report(views, masks, family, threshold) -> dict:
    layers = {v.name: float(m.float().mean()) if m.numel() else 0.0 for v, m in zip(views, masks)}
    counts = {v.name: int(m.sum()) for v, m in zip(views, masks)}
    sizes = {v.name: int(m.numel()) for v, m in zip(views, masks)}
    total = sum(sizes.values())
    pruned = sum(counts.values())
    return {
        "family": family.name,
        "rule": family.rule,
        "threshold": threshold,
        "layers": layers,
        "pruned": counts,
        "sizes": sizes,
        "num_pruned": pruned,
        "num_weights": total,
        "sparsity": pruned / total if total else 0.0,
    }


def guide_sparsity(guide, bnn, threshold: Optional[float] = None) -> dict:
    """:func:`sparsity` of a guide (used for tracking during training); ``{}`` without weight sites."""
    views, family = _site_views(guide, bnn)
    if not views:
        return {}
    threshold = family.check_threshold(threshold)
    return _report(views, [v.prunable(threshold) for v in views], family, threshold)


def sparsity(posterior, threshold: Optional[float] = None) -> dict:
    """Learned sparsity of a variational posterior.

    Args:
        posterior: a :class:`~inference.posterior.VariationalPosterior` from one of the
            variational-family backends.
        threshold: the rule's threshold (λ for Graves/Radial, log α for the dropout families);
            default: the family's (0.83, 3, 0).
    Returns:
        ``{"layers": {site: fraction}, "sparsity": overall fraction, "pruned": {site: count},
        "sizes": {site: count}, "num_pruned", "num_weights", "family", "rule", "threshold"}``;
        a weight counts when the rule marks it or it is already pruned.
    Raises:
        ValueError: no variational-family weight sites, or a threshold out of range.
    """
    views, family = _views_of(posterior, "compute sparsity")
    threshold = family.check_threshold(threshold)
    return _report(views, [v.prunable(threshold) for v in views], family, threshold)


def prune(posterior, mode: str = "principled", seed: int = 0, threshold: Optional[float] = None):
    """Prune a variational posterior; returns ``(new posterior, report)``.

    Args:
        posterior: as for :func:`sparsity` (any posterior when ``mode="none"``).
        mode: ``"principled"``, ``"random"`` (same per-layer counts, uniformly chosen) or ``"none"``.
        seed: seeds the random choice.
        threshold: the rule's threshold (default: the family's).
    Returns:
        the pruned posterior (the input is not modified) and a report: the :func:`sparsity` keys
        for the weights actually pruned (``"sparsity"`` = pruned fraction of the random weights,
        ``"layers"`` per site), plus ``"mode"`` and ``"learned_sparsity"`` (the rule's fraction).
    Raises:
        ValueError: unknown mode, threshold out of range, or no variational-family weight sites.
    """
    if mode not in PRUNE_MODES:
        raise ValueError(f"unknown pruning mode {mode!r}; valid modes: {', '.join(PRUNE_MODES)}")
    if mode == "none":
        report = {"mode": "none", "layers": {}, "num_pruned": 0, "sparsity": 0.0}
        views, family = _site_views(getattr(posterior, "guide", None), posterior.bnn)
        if views:
            report["learned_sparsity"] = guide_sparsity(posterior.guide, posterior.bnn, threshold)["sparsity"]
        return posterior, report
    views, family = _views_of(posterior, "prune")
    threshold = family.check_threshold(threshold)
    rule_masks = [v.prunable(threshold) for v in views]
    learned = _report(views, rule_masks, family, threshold)["sparsity"]
    if mode == "random":
        generator = torch.Generator().manual_seed(int(seed))
        masks = []
        for mask in rule_masks:
            flat = torch.zeros(mask.numel(), dtype=torch.bool)
            flat[torch.randperm(mask.numel(), generator=generator)[: int(mask.sum())]] = True
            masks.append(flat.view(mask.shape))
    else:
        masks = rule_masks
    guide = copy.deepcopy(posterior.guide)
    new_views, _ = _site_views(guide, posterior.bnn)
    for view, mask in zip(new_views, masks):
        view.prune_(mask)
    report = {"mode": mode, **_report(new_views, masks, family, threshold), "learned_sparsity": learned}
    info = {**posterior.info, "pruning": report}
    pruned = type(posterior)(posterior.bnn, guide, posterior.guide_name, posterior.guide_kwargs, info)
    return pruned, report


def evaluate_repeated(posterior, x: torch.Tensor, y: torch.Tensor, T: int, n: int, seed: int = 0) -> dict:
    """Accuracy (classification) or RMSE (regression) of the T-draw predictive mean, repeated n times.

    Args:
        posterior: any posterior.
        x: test inputs; y: class labels ``[N]`` or regression targets in original units.
        T: posterior draws per evaluation (≥ 1); n: repetitions with fresh draws (≥ 1).
        seed: repetition r uses prediction seed ``seed + r``.
    Returns:
        ``{"metric", "T", "n", "values": [n floats], "mean", "sd"}`` (sd with n − 1; 0 when n = 1).
    """
    from ..metrics import accuracy, rmse

    for label, value in (("T", T), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    classification = posterior.bnn.likelihood.task == "classification"
    values = []
    for r in range(n):
        pred = posterior.predict(x, num_samples=T, seed=int(seed) + r)
        values.append(accuracy(pred, y) if classification else rmse(pred, y))
    tensor = torch.tensor(values, dtype=torch.float64)
    return {
        "metric": "accuracy" if classification else "rmse",
        "T": T,
        "n": n,
        "values": values,
        "mean": float(tensor.mean()),
        "sd": float(tensor.std()) if n > 1 else 0.0,
    }
