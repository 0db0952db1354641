"""Observation models p(y | f, θ) for network outputs ``f``.

Every likelihood works in two places:

* inside the Pyro model (:meth:`Likelihood.observe`), on one draw of the network
  output, with the minibatch scaled to the full data size by the caller's plate;
* on stacks of posterior draws (:meth:`Likelihood.log_prob`, :meth:`Likelihood.sample`,
  :meth:`Likelihood.cdf`) with a leading sample dimension ``S`` — vectorised, no loops.

Draws with a ``torch.Generator`` are made on the generator's device and moved to the
outputs' (a CPU generator reproduces the same draws on any device).  Regression outputs
are modelled in standardised target units; ``target_loc`` /
``target_scale`` (``y = loc + scale · y_std``) convert draws, densities and intervals to
original units (log densities gain ``-Σ log scale``).

* :class:`GaussianLikelihood` — ``y ~ Normal(f, σ)``, σ fixed, or learned with a
  ``Gamma(a, b)`` prior on the precision ``τ = 1/σ²`` per output (the standard UCI BNN
  set-up of Hernández-Lobato & Adams 2015), sample site ``"noise_precision"``.
* :class:`CategoricalLikelihood` — ``y ~ Categorical(logits=f)``.
"""
from __future__ import annotations

import math
from typing import Optional

import pyro
import pyro.distributions as dist
import torch

__all__ = ["Likelihood", "GaussianLikelihood", "CategoricalLikelihood", "LIKELIHOODS", "make_likelihood"]


class Likelihood:
    """Base class of observation models."""

    task: str = ""

    def latent_priors(
        self, output_dim: int, dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None
    ) -> dict[str, dist.Distribution]:
        """Priors of the likelihood's own latent sites (e.g. the noise precision).

        Their tensors have ``dtype`` / ``device`` (default: torch's default dtype, CPU).
        """
        return {}

    def observe(self, f: torch.Tensor, y: Optional[torch.Tensor], latents: dict) -> torch.Tensor:
        """Pyro ``sample("obs", ...)`` of one network output ``f`` [n, O] (inside a data plate)."""
        raise NotImplementedError

    def log_prob(self, f, y, latents) -> torch.Tensor:
        """Pointwise log density ``[S, N]`` of targets ``y`` under draws ``f`` [S, N, O]."""
        raise NotImplementedError

    def sample(self, f, latents, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """One draw of the observations per output draw: ``f [S, N, O]`` gives ``[S, N, O]``
        (regression, standardised units) or ``[S, N]`` int64 class labels (classification)."""
        raise NotImplementedError


class GaussianLikelihood(Likelihood):
    """Homoscedastic Gaussian noise, fixed or learned.

    Args:
        noise_sd: fixed noise standard deviation in standardised target units; ignored
            when ``learn_noise``.
        learn_noise: put a ``Gamma(precision_concentration, precision_rate)`` prior on
            the noise precision of each output and infer it with the weights.
        precision_concentration, precision_rate: Gamma prior parameters (shape, rate).
    """

    task = "regression"

    def __init__(
        self,
        noise_sd: float = 0.1,
        learn_noise: bool = False,
        precision_concentration: float = 1.0,
        precision_rate: float = 0.01,
    ):
        for label, value in [
            ("noise_sd", noise_sd),
            ("precision_concentration", precision_concentration),
            ("precision_rate", precision_rate),
        ]:
            if not math.isfinite(float(value)) or float(value) <= 0:
                raise ValueError(f"GaussianLikelihood {label} must be positive and finite, got {value}")
        self.noise_sd = float(noise_sd)
        self.learn_noise = bool(learn_noise)
        self.precision_concentration = float(precision_concentration)
        self.precision_rate = float(precision_rate)

    def __repr__(self):
        if self.learn_noise:
            return (
                f"GaussianLikelihood(learned noise, precision ~ Gamma({self.precision_concentration}, "
                f"{self.precision_rate}))"
            )
        return f"GaussianLikelihood(noise_sd={self.noise_sd})"

    def latent_priors(self, output_dim, dtype=None, device=None):
        if not self.learn_noise:
            return {}
        shape, like = (output_dim,), {"dtype": dtype, "device": device}
        prior = dist.Gamma(
            torch.full(shape, self.precision_concentration, **like), torch.full(shape, self.precision_rate, **like)
        ).to_event(1)
        return {"noise_precision": prior}

    def noise_sd_of(self, latents: dict, f: torch.Tensor) -> torch.Tensor:
        """Noise sd broadcastable against ``f`` [..., N, O] (standardised units)."""
        if not self.learn_noise:
            return torch.full((), self.noise_sd, dtype=f.dtype, device=f.device)
        precision = latents["noise_precision"]  # [..., O]
        return precision.rsqrt().unsqueeze(-2)

    def observe(self, f, y, latents):
        sd = self.noise_sd_of(latents, f)
        return pyro.sample("obs", dist.Normal(f, sd).to_event(1), obs=y)

    def log_prob(self, f, y, latents, target_loc=None, target_scale=None):
        """``[S, N]`` log N(y | f, σ²) summed over outputs, in the units of ``y``.

        ``f`` is standardised; with ``target_loc``/``target_scale`` given, ``y`` is in
        original units and the density includes the change-of-units Jacobian.
        """
        sd = self.noise_sd_of(latents, f)
        if target_scale is not None:
            y = (y - target_loc) / target_scale
        lp = dist.Normal(f, sd).log_prob(y.unsqueeze(0)).sum(-1)
        if target_scale is not None:
            lp = lp - torch.log(target_scale).sum()
        return lp

    def sample(self, f, latents, generator=None):
        sd = self.noise_sd_of(latents, f)
        noise = torch.randn(f.shape, generator=generator, dtype=f.dtype, device=_draw_device(generator, f))
        return f + sd * noise.to(f.device)

    def cdf(self, f, y, latents, target_loc=None, target_scale=None):
        """Predictive CDF ``[N, O]`` of ``y`` under the mixture of the ``S`` draws (the PIT)."""
        sd = self.noise_sd_of(latents, f)
        if target_scale is not None:
            y = (y - target_loc) / target_scale
        return dist.Normal(f, sd).cdf(y.unsqueeze(0)).mean(0)


class CategoricalLikelihood(Likelihood):
    """``y ~ Categorical(logits=f)`` for classification; ``y`` int64 [N]."""

    task = "classification"

    def __repr__(self):
        return "CategoricalLikelihood()"

    def observe(self, f, y, latents):
        return pyro.sample("obs", dist.Categorical(logits=f), obs=y)

    def log_prob(self, f, y, latents, target_loc=None, target_scale=None):
        logp = torch.log_softmax(f, dim=-1)
        index = y.long().view(1, -1, 1).expand(logp.shape[0], -1, 1)
        return logp.gather(-1, index).squeeze(-1)

    def sample(self, f, latents, generator=None):
        probs = torch.softmax(f, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1]).to(_draw_device(generator, f))
        return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1]).to(f.device)


def _draw_device(generator: Optional[torch.Generator], like: torch.Tensor) -> torch.device:
    """Where random draws are made: on the generator's device (a CPU generator gives the same
    draws whatever device the model is on), else on ``like``'s."""
    return like.device if generator is None else generator.device


LIKELIHOODS = {"gaussian": GaussianLikelihood, "categorical": CategoricalLikelihood}


def make_likelihood(name: str, **kwargs) -> Likelihood:
    """Build a likelihood from its registry name (``gaussian`` or ``categorical``)."""
    try:
        cls = LIKELIHOODS[name]
    except KeyError:
        raise ValueError(f"unknown likelihood {name!r}; valid likelihoods: {', '.join(LIKELIHOODS)}") from None
    return cls(**kwargs)
