"""The interface every observation model implements (:class:`Likelihood`) and shared helpers.

Shapes: ``S`` draws, ``N`` points, ``T`` targets per point, ``P = heads · T`` network outputs
per point (``heads`` is 1 for a location-only model, 2 when the network also predicts a
scale).  Regression quantities are in standardised target units; ``target_loc`` /
``target_scale`` ``[T]`` (``y = loc + scale · y_std``) convert targets, densities and CDFs to
original units (log densities gain ``-Σ_t log scale_t``, the change-of-units Jacobian).
"""
from __future__ import annotations

from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from torch.distributions import constraints

from .mixture import PredictiveMixture

__all__ = ["Likelihood", "draw_device", "standardise"]


class Likelihood:
    """Base class of observation models p(y | f, θ) for network outputs ``f`` and latents θ.

    Attributes:
        name: the registry name (:data:`zoo.likelihoods.LIKELIHOODS`).
        task: ``"regression"`` or ``"classification"``.
        heads: network outputs per target (``P = heads · T``).
    """

    name: str = ""
    task: str = ""
    heads: int = 1

    def options(self) -> dict:
        """The constructor keyword arguments that rebuild this likelihood (JSON-serialisable)."""
        return {}

    def latent_priors(
        self, target_dim: int, dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None
    ) -> dict[str, dist.Distribution]:
        """Priors of the likelihood's own latent sites (e.g. the noise precision), event shape ``[T]``.

        Their tensors have ``dtype`` / ``device`` (default: torch's default dtype, CPU).
        """
        return {}

    def distribution(self, f: torch.Tensor, latents: dict) -> dist.Distribution:
        """p(y | f) with batch shape ``[..., N, T]`` (regression) for outputs ``f`` ``[..., N, P]``
        and latents with the same leading dims as ``f`` (``{name: [..., T]}``)."""
        raise NotImplementedError

    def training_log_prob(self, f: torch.Tensor, y: torch.Tensor, latents: dict) -> torch.Tensor:
        """``[S, N]`` per-point objective that optimisers (SVI, MAP, pretraining) maximise, in
        standardised units.  The honest :meth:`log_prob` unless the likelihood re-weights its
        training loss (β-NLL of :class:`HeteroscedasticGaussianLikelihood`); samplers always
        use :meth:`log_prob`."""
        return self.log_prob(f, y, latents)

    def observe(self, f: torch.Tensor, y: Optional[torch.Tensor], latents: dict) -> torch.Tensor:
        """Pyro ``sample("obs", ...)`` of one network output ``f`` ``[n, P]`` (inside a data plate);
        observed targets score with :meth:`training_log_prob`."""
        base = self.distribution(f, latents)
        if y is None or type(self).training_log_prob is Likelihood.training_log_prob:
            return pyro.sample("obs", base.to_event(1), obs=y)
        score = self.training_log_prob(f.unsqueeze(0), y, {k: v.unsqueeze(0) for k, v in latents.items()})[0]
        return pyro.sample("obs", _Scored(base.to_event(1), score), obs=y)

    def log_prob(self, f, y, latents, target_loc=None, target_scale=None) -> torch.Tensor:
        """Pointwise log density ``[S, N]`` of targets ``y`` ``[N, T]`` under draws ``f`` ``[S, N, P]``,
        summed over targets; in original units when ``target_loc`` / ``target_scale`` are given."""
        y, jacobian = standardise(y, target_loc, target_scale)
        return self.distribution(f, latents).log_prob(y.unsqueeze(0)).sum(-1) - jacobian

    def sample(self, f, latents, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """One observation per output draw: ``f`` ``[S, N, P]`` gives ``[S, N, T]`` (regression,
        standardised units) or ``[S, N]`` int64 class labels (classification)."""
        raise NotImplementedError

    def cdf(self, f, y, latents, target_loc=None, target_scale=None) -> torch.Tensor:
        """Predictive CDF ``[N, T]`` of ``y`` under the mixture of the ``S`` draws (the PIT): the
        :class:`~zoo.likelihoods.mixture.PredictiveMixture` of :meth:`mixture_params`."""
        y, _ = standardise(y, target_loc, target_scale)
        return PredictiveMixture(**self.mixture_params(f, latents)).cdf(y)

    def predictive_mean(self, f: torch.Tensor, latents: dict) -> torch.Tensor:
        """E[y | f, θ] ``[S, N, T]`` (standardised units; class probabilities for classification)."""
        raise NotImplementedError

    def noise_variance(self, f: torch.Tensor, latents: dict) -> torch.Tensor:
        """Var[y | f, θ] ``[S, N or 1, T]`` in standardised units (regression)."""
        raise NotImplementedError

    def mixture_params(self, f: torch.Tensor, latents: dict) -> dict[str, torch.Tensor]:
        """Per-draw parameters of p(y | f, θ) as location-scale components (regression), standardised
        units: ``{"loc": [S, N, T], "scale": [S, N or 1, T]}`` and, for a Student-t, ``"df"``
        ``[S, 1, T]``; ``PredictiveMixture(**params)`` is the posterior predictive mixture
        (:class:`~zoo.likelihoods.mixture.PredictiveMixture`)."""
        raise NotImplementedError(f"{type(self).__name__} has no location-scale predictive mixture")

    def output_fisher(self, f: torch.Tensor, latents: dict) -> torch.Tensor:
        """``[N, P, P]``: the Fisher information E_y[−∂² log p(y | f)/∂f²] of each point's ``P``
        network outputs, at one draw ``f`` ``[N, P]`` and latents without a sample dimension
        (``{name: [T]}``), held fixed.  The GGN of the negative log-likelihood is
        ``Σ_n J_nᵀ F_n J_n`` with ``J_n`` the output Jacobian (Martens 2020)."""
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({args})"


def standardise(y, target_loc, target_scale) -> tuple[torch.Tensor, torch.Tensor | float]:
    """``(y in standardised units, Σ log target_scale)``; unchanged and 0 without a scale."""
    if target_scale is None:
        return y, 0.0
    return (y - target_loc) / target_scale, torch.log(target_scale).sum()


def draw_device(generator: Optional[torch.Generator], like: torch.Tensor) -> torch.device:
    """Where random draws are made: on the generator's device (a CPU generator gives the same
    draws whatever device the model is on), else on ``like``'s."""
    return like.device if generator is None else generator.device


def check_positive(owner: str, **values) -> None:
    """``ValueError`` naming the option of ``owner`` that is not a positive finite number."""
    for label, value in values.items():
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not (0 < float(value) < float("inf")):
            raise ValueError(f"{owner} option {label} must be positive and finite, got {value!r}")


class _Scored(dist.TorchDistribution):
    """``base`` for sampling, but an observed value scores the given per-point ``score`` ``[n]``
    (the training objective) instead of ``base.log_prob``."""

    arg_constraints: dict = {}

    def __init__(self, base: dist.TorchDistribution, score: torch.Tensor):
        self.base, self.score = base, score
        super().__init__(base.batch_shape, base.event_shape, validate_args=False)

    @property
    def support(self):
        return constraints.real

    def sample(self, sample_shape=torch.Size()):
        return self.base.sample(sample_shape)

    def log_prob(self, value):
        return self.score
