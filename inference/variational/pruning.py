"""Sparsity, principled vs random pruning, and repeated Monte Carlo evaluation.

Everything here reads a guide through :class:`~inference.variational.protocol.PrunableGuide`
(per-site mean and sd, the family's rule, in-place pruning), never its type:

* :func:`sparsity` — per-layer (per weight site) and overall fraction of weights that the
  family's principled rule marks as prunable, or that are already pruned: Graves |μ|/σ < λ = 0.83
  (Graves 2011 eq. 19), sparse VD log α > 3 (Molchanov, Ashukha & Vetrov 2017), Kingma VD
  log α ≥ 0 (α at its cap, see :mod:`inference.variational.families`), Radial |μ|/sd < λ with
  the marginal sd σ/√D of a D-entry tensor (E ξ_i² = 1/D).
* :func:`prune` — returns a *new* posterior in which the chosen weights are exactly zero: their
  mean and sd are set to 0 (σ through log σ = −∞), so every draw has w = 0 and they contribute
  exactly nothing to any output.  ``"principled"`` prunes by the rule; ``"random"`` prunes, in
  every layer, as many weights as the rule would, chosen uniformly at random (the control: does
  the learned sparsity beat chance?); ``"none"`` returns the posterior unchanged (sparsity 0) and
  works for any posterior.
* :func:`evaluate_repeated` — test accuracy (RMSE for regression) of the predictive mean over T
  posterior draws, repeated n times with fresh draws: mean ± sd.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch

from inference.evaluation.metrics import accuracy, rmse
from inference.variational.protocol import PrunableGuide, rule_mask

__all__ = ["PRUNE_MODES", "sparsity", "prune", "evaluate_repeated", "guide_sparsity"]

#: the pruning modes of :func:`prune` (the one definition; the CLI and grids use it)
PRUNE_MODES = ("none", "principled", "random")


def _weight_sites(guide, bnn) -> list[str]:
    """The guide's weight sites when it has a pruning rule, else ``[]``."""
    if not isinstance(guide, PrunableGuide) or guide.pruning_rule() is None:
        return []
    weights = set(bnn.site_names)
    return [name for name in guide.sites() if name in weights]


def _sites_of(posterior, action: str) -> list[str]:
    sites = _weight_sites(getattr(posterior, "guide", None), posterior.bnn)
    if not sites:
        backend = posterior.info.get("backend", "unknown") if hasattr(posterior, "info") else "unknown"
        raise ValueError(
            f"cannot {action}: the posterior (backend {backend!r}) has no variational-family weight sites; "
            f"fit the model with stochastic weights and a backend among 'graves', 'svi-lrt', 'sparse-vd', "
            f"'kingma-vd', 'radial'"
        )
    return sites


def _report(sites, masks, rule, threshold) -> dict:
    layers = {name: float(m.float().mean()) if m.numel() else 0.0 for name, m in zip(sites, masks)}
    counts = {name: int(m.sum()) for name, m in zip(sites, masks)}
    sizes = {name: int(m.numel()) for name, m in zip(sites, masks)}
    total = sum(sizes.values())
    pruned = sum(counts.values())
    return {
        "family": rule.family,
        "rule": rule.text,
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
    sites = _weight_sites(guide, bnn)
    if not sites:
        return {}
    return _rule_report(guide, sites, threshold)


def _rule_report(guide, sites, threshold) -> dict:
    rule = guide.pruning_rule()
    threshold = rule.check_threshold(threshold)
    return _report(sites, [rule_mask(guide, name, threshold) for name in sites], rule, threshold)


def sparsity(posterior, threshold: Optional[float] = None) -> dict:
    """Learned sparsity of a variational posterior.

    Args:
        posterior: a :class:`~inference.variational.posterior.VariationalPosterior` from one of the
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
    return _rule_report(posterior.guide, _sites_of(posterior, "compute sparsity"), threshold)


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
        learned = guide_sparsity(getattr(posterior, "guide", None), posterior.bnn, threshold)
        if learned:
            report["learned_sparsity"] = learned["sparsity"]
        return posterior, report
    sites = _sites_of(posterior, "prune")
    rule = posterior.guide.pruning_rule()
    threshold = rule.check_threshold(threshold)
    rule_masks = [rule_mask(posterior.guide, name, threshold) for name in sites]
    learned = _report(sites, rule_masks, rule, threshold)["sparsity"]
    if mode == "random":
        generator = torch.Generator().manual_seed(int(seed))
        masks = []
        for mask in rule_masks:
            flat = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
            flat[torch.randperm(mask.numel(), generator=generator)[: int(mask.sum())]] = True
            masks.append(flat.view(mask.shape))
    else:
        masks = rule_masks
    guide = copy.deepcopy(posterior.guide)
    for name, mask in zip(sites, masks):
        guide.prune_(name, mask)
    report = {"mode": mode, **_report(sites, masks, rule, threshold), "learned_sparsity": learned}
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
