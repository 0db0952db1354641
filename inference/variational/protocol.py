"""The one interface of every variational guide, its pruning rule, and Pyro's module-local parameter mode.

:class:`VariationalGuide` is what pruning (:mod:`inference.variational.pruning`) and the report
(``lab.report.layers``) read; no caller switches on the guide's type or reaches into Pyro's
private helpers:

* ``sites()`` — the site names with a per-entry location and scale;
* ``site_loc_scale(name)`` — the *marginal* posterior mean and sd of every entry of that site,
  site-shaped, detached (for the Radial family the marginal sd σ/√D of a D-entry tensor, since
  E ξ_i² = 1/D);
* ``pruning_rule()`` — the family's principled :class:`PruningRule`, or ``None`` where the guide
  defines none (the stock ``AutoNormal`` adapter).

A guide with a rule is a :class:`PrunableGuide`: it also gives ``log_alpha(name)`` — the family's own
log α where it defines one (the dropout families, clipped as in their KLs), else −2 log(|μ|/σ) — and
``prune_(name, mask)`` (set the chosen entries' mean and sd to exactly 0).

Pyro guides built from :class:`~pyro.nn.PyroModule` keep their parameters in the module itself
only under Pyro's ``module_local_params`` setting; otherwise every call registers them in Pyro's
one global parameter store, where two fitted posteriors with the same site names would share —
and overwrite — each other's parameters.  :class:`ModuleLocalParams` turns the setting on for the
guide's construction and for each call only (:func:`module_local_params` restores the previous
value), so several posteriors coexist and a user's own stock Pyro code in the same process keeps
the global store.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Protocol, runtime_checkable

import pyro
import torch

__all__ = [
    "PruningRule",
    "SNR_RULE",
    "VariationalGuide",
    "PrunableGuide",
    "module_local_params",
    "ModuleLocalParams",
    "rule_mask",
]


@dataclass(frozen=True)
class PruningRule:
    """A family's principled pruning rule on a per-weight statistic.

    Attributes:
        family: the family's name (``"graves"``, ``"sparse-vd"``, ``"kingma-vd"``).
        text: the rule in words, with its source.
        statistic: ``"snr"`` — prune where |μ|/σ < t (Graves 2011 eq. 19) — or ``"log_alpha"`` —
            prune where log α > t (≥ t when ``inclusive``) (Molchanov, Ashukha & Vetrov 2017).
        default_threshold: t when none is given (λ = 0.83, log α = 3 or 0).
        threshold_range: closed range of valid thresholds.
        inclusive: the log-α rule prunes at equality (Kingma VD: α at its cap).
    """

    family: str
    text: str
    statistic: str
    default_threshold: float
    threshold_range: tuple[float, float]
    inclusive: bool = False

    def check_threshold(self, threshold: Optional[float]) -> float:
        """The threshold to use (default when ``None``); a clear error when out of range."""
        if threshold is None:
            return self.default_threshold
        threshold = float(threshold)
        lo, hi = self.threshold_range
        if not (math.isfinite(threshold) and lo <= threshold <= hi):
            raise ValueError(
                f"pruning threshold {threshold} is out of range for the {self.family!r} family "
                f"(rule: {self.text}); choose a value in [{lo}, {hi}] (default {self.default_threshold})"
            )
        return threshold

    def mask(self, statistic: torch.Tensor, threshold: Optional[float] = None) -> torch.Tensor:
        """Boolean mask, ``True`` where the rule prunes, from the rule's statistic (|μ|/σ or log α)."""
        t = self.check_threshold(threshold)
        if self.statistic == "snr":
            return statistic < t
        return statistic >= t if self.inclusive else statistic > t

    def log_alpha_threshold(self, threshold: Optional[float] = None) -> float:
        """The rule's threshold on log α = −2 log(|μ|/σ): |μ|/σ < λ  ⇔  log α > −2 log λ."""
        t = self.check_threshold(threshold)
        return -2.0 * math.log(t) if self.statistic == "snr" else t


#: the signal-to-noise rule of Graves (2011, eq. 19), shared by the Gaussian and Radial families
SNR_RULE = PruningRule("graves", "|mu|/sigma < lambda (Graves 2011 eq. 19)", "snr", 0.83, (1e-6, 1e6))


@runtime_checkable
class VariationalGuide(Protocol):
    """Per-site location and scale of a variational guide, and its pruning rule (see the module docstring)."""

    def sites(self) -> list[str]:
        """Names of the sites with a per-entry (location, scale), in the model's order."""
        ...

    def site_loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginal posterior mean and sd of every entry of site ``name``: two detached site-shaped tensors."""
        ...

    def pruning_rule(self) -> Optional[PruningRule]:
        """The family's principled pruning rule, ``None`` where it defines none."""
        ...


@runtime_checkable
class PrunableGuide(VariationalGuide, Protocol):
    """A :class:`VariationalGuide` whose ``pruning_rule()`` is not ``None``."""

    def log_alpha(self, name: str) -> torch.Tensor:
        """log α of every entry of site ``name``, detached, site-shaped (see the module docstring)."""
        ...

    def prune_(self, name: str, mask: torch.Tensor) -> None:
        """In place: the entries of site ``name`` where ``mask`` holds get mean 0 and sd 0 (w = 0 in every draw)."""
        ...


def rule_mask(guide: PrunableGuide, name: str, threshold: Optional[float] = None) -> torch.Tensor:
    """Entries of site ``name`` that ``guide``'s rule marks as prunable or that are already pruned (μ = σ = 0)."""
    rule = guide.pruning_rule()
    loc, scale = guide.site_loc_scale(name)
    with torch.no_grad():
        statistic = loc.abs() / scale if rule.statistic == "snr" else guide.log_alpha(name)
        return ((loc == 0) & (scale == 0)) | rule.mask(statistic, threshold)


@contextmanager
def module_local_params() -> Iterator[None]:
    """Within the block Pyro's ``module_local_params`` setting is on; the previous value is restored."""
    previous = pyro.settings.get("module_local_params")
    pyro.settings.set(module_local_params=True)
    try:
        yield
    finally:
        pyro.settings.set(module_local_params=previous)


class ModuleLocalParams:
    """Mixin (before a ``PyroModule`` base): construction and every call run under :func:`module_local_params`.

    The parameter context a ``PyroModule`` creates at construction holds its own parameter state
    only when the setting is on, and each call reads the setting again, so both are wrapped.
    """

    def __init__(self, *args, **kwargs):
        with module_local_params():
            super().__init__(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        with module_local_params():
            return super().__call__(*args, **kwargs)
