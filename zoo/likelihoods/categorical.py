"""``y ~ Categorical(logits=f)`` for classification."""
from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch

from .base import Likelihood, draw_device

__all__ = ["CategoricalLikelihood"]


class CategoricalLikelihood(Likelihood):
    """``y ~ Categorical(logits=f)``; ``y`` int64 class labels ``[N]``, ``f`` ``[..., N, K]`` logits."""

    name = "categorical"
    task = "classification"

    def __repr__(self):
        return "CategoricalLikelihood()"

    def distribution(self, f, latents):
        return dist.Categorical(logits=f)

    def observe(self, f, y, latents):
        return pyro.sample("obs", self.distribution(f, latents), obs=y)

    def log_prob(self, f, y, latents, target_loc=None, target_scale=None):
        logp = torch.log_softmax(f, dim=-1)
        index = y.long().view(1, -1, 1).expand(logp.shape[0], -1, 1)
        return logp.gather(-1, index).squeeze(-1)

    def sample(self, f, latents, generator=None):
        probs = torch.softmax(f, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1]).to(draw_device(generator, f))
        return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1]).to(f.device)

    def cdf(self, f, y, latents, target_loc=None, target_scale=None):
        raise ValueError("class labels have no predictive CDF (PIT); it is defined for regression likelihoods")

    def predictive_mean(self, f, latents):
        """Class probabilities ``[S, N, K]``."""
        return torch.softmax(f, dim=-1)

    def noise_variance(self, f, latents):
        raise ValueError("noise_variance is defined for regression likelihoods, not categorical")

    def output_fisher(self, f, latents):
        """``diag(p) − p pᵀ`` ``[N, K, K]`` with ``p = softmax(f)``."""
        p = torch.softmax(f, dim=-1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
