"""Weight priors.

A prior maps a :class:`~zoo.stochastic.StochasticSite` to a Pyro distribution whose
event shape is the site's shape (``to_event`` over all site dims), so every site is one
joint sample statement.  All priors here are factorised over weights.

* :class:`NormalPrior` — iid ``Normal(0, σ)``.
* :class:`FanInNormalPrior` — ``Normal(0, σ / sqrt(fan_in))`` (the width scaling of
  Neal 1996: keeps the pre-activation variance independent of the layer's fan-in).
* :class:`LaplacePrior` — iid ``Laplace(0, b)``.
* :class:`StudentTPrior` — iid ``StudentT(ν, 0, s)``.
* :class:`PretrainedNormalPrior` — ``Normal(w₀, σ)`` centred at the weights the model
  was built from (the reference code of Bagga et al. 2025 puts ``Normal(w₀, 0.5)`` on the
  heads of a pretrained multi-head LSTM).

Every prior builds its tensors with the dtype and device of the site's reference weights
(``site.reference``), so the priors that ``BayesianNetwork.double()`` or ``.to(device)``
rebuild follow the network.
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


def _like(site: StochasticSite) -> dict:
    """``dtype`` / ``device`` keywords of the site's reference weights, for new prior tensors."""
    return {"dtype": site.reference.dtype, "device": site.reference.device}


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
        like = _like(site)
        return dist.Normal(torch.zeros(site.shape, **like), torch.full(site.shape, self.scale, **like))

    def __repr__(self):
        return f"NormalPrior(scale={self.scale})"


class FanInNormalPrior(Prior):
    """``Normal(0, scale / sqrt(fan_in))``: variance scaled by the layer's fan-in."""

    def __init__(self, scale: float = 1.0):
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        sd = self.scale / math.sqrt(max(site.fan_in, 1))
        like = _like(site)
        return dist.Normal(torch.zeros(site.shape, **like), torch.full(site.shape, sd, **like))

    def __repr__(self):
        return f"FanInNormalPrior(scale={self.scale})"


class LaplacePrior(Prior):
    """iid ``Laplace(0, scale)``: a sparsity-promoting prior (no analytic KL to a Normal guide)."""

    def __init__(self, scale: float = 1.0):
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        like = _like(site)
        return dist.Laplace(torch.zeros(site.shape, **like), torch.full(site.shape, self.scale, **like))

    def __repr__(self):
        return f"LaplacePrior(scale={self.scale})"


class StudentTPrior(Prior):
    """iid ``StudentT(df, 0, scale)``: heavy-tailed."""

    def __init__(self, df: float = 3.0, scale: float = 1.0):
        self.df = _check_positive("df", df)
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        like = _like(site)
        return dist.StudentT(
            torch.full(site.shape, self.df, **like),
            torch.zeros(site.shape, **like),
            torch.full(site.shape, self.scale, **like),
        )

    def __repr__(self):
        return f"StudentTPrior(df={self.df}, scale={self.scale})"


class PretrainedNormalPrior(Prior):
    """``Normal(w₀, scale)`` centred at the site's reference (pretrained) weights ``w₀``."""

    def __init__(self, scale: float = 0.5):
        self.scale = _check_positive("scale", scale)

    def _base(self, site):
        return dist.Normal(site.reference_value().detach(), torch.full(site.shape, self.scale, **_like(site)))

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
