"""Weight priors.

A prior maps a :class:`~zoo.stochastic.StochasticSite` to a Pyro distribution whose
event shape is the site's shape (``to_event`` over all site dims), so every site is one
joint sample statement.  All priors here are factorised over weights.

* :class:`NormalPrior` — iid ``Normal(0, σ)``.
* :class:`FanInNormalPrior` — ``Normal(0, σ / sqrt(fan_in))`` (He/LeCun-style scaling,
  keeps pre-activation variance independent of width).
* :class:`LaplacePrior` — iid ``Laplace(0, b)``.
* :class:`StudentTPrior` — iid ``StudentT(ν, 0, s)``.
* :class:`PretrainedNormalPrior` — ``Normal(w₀, σ)`` centred at the weights the model
  was built from (seed 000 uses σ = 0.5 around pretrained LSTM weights).
"""
from __future__ import annotations

import math

import pyro.distributions as dist
import torch

from .stochastic import StochasticSite

__all__ = [
    "Prior",
    "NormalPrior",
    "FanInNormalPrior",
    "LaplacePrior",
    "StudentTPrior",
    "PretrainedNormalPrior",
    "PRIORS",
    "make_prior",
]


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"prior {name} must be a positive finite number, got {value}")
    return value


class Prior:
    """Base class: ``prior(site) -> Distribution`` with ``event_shape == site.shape``."""

    def site_distribution(self, site: StochasticSite) -> dist.Distribution:
        return self._base(site).to_event(len(site.shape))

    def _base(self, site: StochasticSite) -> dist.Distribution:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, site: StochasticSite) -> dist.Distribution:
        return self.site_distribution(site)


class NormalPrior(Prior):
    """iid ``Normal(0, scale)`` on every random weight."""

    def __init__(self, scale: float = 1.0):
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        zeros = torch.zeros(site.shape)
        return dist.Normal(zeros, torch.full(site.shape, self.scale))

    def __repr__(self):
        return f"NormalPrior(scale={self.scale})"


class FanInNormalPrior(Prior):
    """``Normal(0, scale / sqrt(fan_in))``: variance scaled by the layer's fan-in."""

    def __init__(self, scale: float = 1.0):
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        sd = self.scale / math.sqrt(max(site.fan_in, 1))
        return dist.Normal(torch.zeros(site.shape), torch.full(site.shape, sd))

    def __repr__(self):
        return f"FanInNormalPrior(scale={self.scale})"


class LaplacePrior(Prior):
    """iid ``Laplace(0, scale)``: a sparsity-promoting prior (no analytic KL to a Normal guide)."""

    def __init__(self, scale: float = 1.0):
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        return dist.Laplace(torch.zeros(site.shape), torch.full(site.shape, self.scale))

    def __repr__(self):
        return f"LaplacePrior(scale={self.scale})"


class StudentTPrior(Prior):
    """iid ``StudentT(df, 0, scale)``: heavy-tailed."""

    def __init__(self, df: float = 3.0, scale: float = 1.0):
        self.df = _check_positive("df", df)
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        return dist.StudentT(torch.full(site.shape, self.df), torch.zeros(site.shape), torch.full(site.shape, self.scale))

    def __repr__(self):
        return f"StudentTPrior(df={self.df}, scale={self.scale})"


class PretrainedNormalPrior(Prior):
    """``Normal(w₀, scale)`` centred at the site's reference (pretrained) weights ``w₀``."""

    def __init__(self, scale: float = 0.5):
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        return dist.Normal(site.reference_value().detach(), torch.full(site.shape, self.scale))

    def __repr__(self):
        return f"PretrainedNormalPrior(scale={self.scale})"


PRIORS = {
    "normal": NormalPrior,
    "fan-in": FanInNormalPrior,
    "laplace": LaplacePrior,
    "student-t": StudentTPrior,
    "pretrained": PretrainedNormalPrior,
}


def make_prior(name: str, scale: float | None = None, **kwargs) -> Prior:
    """Build a prior from its registry name (``normal``, ``fan-in``, ``laplace``, ``student-t``, ``pretrained``)."""
    if isinstance(name, Prior):
        return name
    try:
        cls = PRIORS[name]
    except KeyError:
        raise ValueError(f"unknown prior {name!r}; valid priors: {', '.join(PRIORS)}") from None
    if scale is not None:
        kwargs["scale"] = scale
    return cls(**kwargs)
