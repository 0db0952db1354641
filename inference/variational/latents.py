"""Shared pieces of the variational guides: Normal prior parameters and mean-field factors for
constrained likelihood latents (e.g. the Gaussian noise precision).

A constrained latent z (support ≠ ℝ) gets a Normal factor on u = T⁻¹(z), ``T = biject_to(support)``,
exactly like Pyro's ``AutoNormal``: the guide samples the auxiliary site ``name + "_unconstrained"``
and emits ``name`` as a ``Delta`` carrying ``−log|dT/du|``, so :mod:`inference.variational.elbo` estimates
its KL by Monte Carlo.  The fused training path uses :meth:`LatentFactors.rsample_with_kl`
for the same one-sample estimate log q(z) − log p(z) without Pyro.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional

import pyro
import pyro.distributions as dist
import torch
from torch import nn
from torch.distributions import biject_to, constraints

__all__ = ["normal_prior_params", "LatentFactors", "sample_unconstrained", "is_real_support", "unconstrained_draw"]


def is_real_support(support) -> bool:
    """Whether a support is the real line (possibly reinterpreted over event dims)."""
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def normal_prior_params(prior, site: str):
    """``(loc, scale)`` of a factorised Normal prior, as floats when constant else tensors.

    Raises a ``ValueError`` naming the site when ``prior`` is not a (reinterpreted) Normal.
    """
    base = prior
    while hasattr(base, "base_dist"):
        base = base.base_dist
    if not isinstance(base, torch.distributions.Normal):
        raise ValueError(
            f"site {site!r} has a {type(base).__name__} prior; this family's analytic KL needs a Normal prior "
            f"(use NormalPrior/FanInNormalPrior/PretrainedNormalPrior, or set prior_mean/prior_sd)"
        )
    return _constant_or_tensor(base.loc), _constant_or_tensor(base.scale)


def _constant_or_tensor(value: torch.Tensor):
    flat = value.detach().reshape(-1)
    if flat.numel() == 0 or bool((flat == flat[0]).all()):
        return float(flat[0]) if flat.numel() else 0.0
    return value.detach()


def sample_unconstrained(name: str, loc: torch.Tensor, scale: torch.Tensor, support, event_dim: int):
    """Pyro statements of a Normal factor on ``T⁻¹(z)`` (the ``AutoNormal`` pattern); returns z."""
    transform = biject_to(support)
    unconstrained = pyro.sample(
        name + "_unconstrained",
        dist.Normal(loc, scale).to_event(loc.dim()),
        infer={"is_auxiliary": True},
    )
    value = transform(unconstrained)
    log_density = transform.inv.log_abs_det_jacobian(value, unconstrained)
    log_density = log_density.reshape(*log_density.shape[: log_density.dim() - loc.dim()], -1).sum(-1)
    return pyro.sample(name, dist.Delta(value, log_density=log_density, event_dim=event_dim))


def unconstrained_draw(loc: torch.Tensor, scale: torch.Tensor, prior) -> tuple[torch.Tensor, torch.Tensor]:
    """One reparameterised draw z = T(u), u ~ N(loc, scale²), and the one-sample KL estimate log q(z) − log p(z).

    ``T = biject_to(prior.support)``; log q(z) = log N(u; loc, scale²) − log|dT/du| (what the Pyro
    statements of :func:`sample_unconstrained` score).  Returns ``(z, estimate)``, z shaped like ``loc``.
    """
    u = loc + scale * torch.randn_like(loc)
    transform = biject_to(prior.support)
    z = transform(u)
    log_q = torch.distributions.Normal(loc, scale, validate_args=False).log_prob(u).sum()
    log_q = log_q - transform.log_abs_det_jacobian(u, z).sum()
    return z, log_q - prior.log_prob(z).sum()


class LatentFactors(nn.Module):
    """Mean-field Normal factors (unconstrained space) for a model's likelihood latents, or point masses.

    Args:
        priors: ``{site: prior distribution}`` (e.g. ``bnn.latent_priors()``).
        init_scale: initial sd of every unconstrained factor.
        init_values: ``{site: value}`` (constrained space) where a factor's mean starts, e.g. the
            latents' MAP that deterministic pretraining ends with
            (:func:`inference.optim.training.pretrain`); a site it lacks starts at its prior mean.
        fixed: sites held at their ``init_values`` as point masses z* (a buffer, not a trained parameter):
            every draw is z*, and its term of the KL is −log p(z*) (Pyro's ``AutoDelta`` convention: a
            constant, so the weights' factors train against the likelihood at z*).

    Raises:
        ValueError: a ``fixed`` name that is not a latent site.
    """

    def __init__(self, priors: Mapping[str, torch.distributions.Distribution], init_scale: float,
                 init_values: Optional[Mapping[str, torch.Tensor]] = None, fixed: Iterable[str] = ()):
        super().__init__()
        self.priors = dict(priors)
        self.fixed = tuple(fixed)
        unknown = [name for name in self.fixed if name not in self.priors]
        if unknown:
            raise ValueError(f"fixed latents {unknown} are not latent sites of the likelihood; its latents: "
                             f"{', '.join(self.priors) or 'none'}")
        self.loc = nn.ParameterDict()
        self.log_scale = nn.ParameterDict()
        init_values = init_values or {}
        for name, prior in self.priors.items():
            start = init_values.get(name)
            start = prior.mean if start is None else torch.as_tensor(start).to(prior.mean).expand_as(prior.mean)
            init = biject_to(prior.support).inv(start.detach())
            if name in self.fixed:
                self.register_buffer(_fixed_buffer(name), init.clone())
            else:
                self.loc[name] = nn.Parameter(init.clone())
                self.log_scale[name] = nn.Parameter(torch.full_like(init, math.log(init_scale)))

    def fixed_value(self, name: str) -> torch.Tensor:
        """z* of fixed latent ``name`` (constrained space)."""
        return biject_to(self.priors[name].support)(getattr(self, _fixed_buffer(name)))

    def pyro_sample(self) -> dict:
        """Pyro sample statements of every latent (use inside a guide)."""
        values = {}
        for name, prior in self.priors.items():
            if name in self.fixed:
                values[name] = pyro.sample(name, dist.Delta(self.fixed_value(name), event_dim=len(prior.event_shape)))
            else:
                values[name] = sample_unconstrained(
                    name, self.loc[name], self.log_scale[name].exp(), prior.support, len(prior.event_shape))
        return values

    def rsample_with_kl(self) -> tuple[dict, torch.Tensor]:
        """One reparameterised draw ``{site: value}`` and the estimate Σ log q(z) − log p(z) (−log p(z*) for a
        fixed latent)."""
        values, kl = {}, torch.zeros(())
        for name, prior in self.priors.items():
            if name in self.fixed:
                values[name] = self.fixed_value(name)
                estimate = -prior.log_prob(values[name]).sum()
            else:
                values[name], estimate = unconstrained_draw(self.loc[name], self.log_scale[name].exp(), prior)
            kl = kl + estimate
        return values, kl


def _fixed_buffer(name: str) -> str:
    """The buffer holding fixed latent ``name``'s unconstrained value (a name without dots)."""
    return "fixed_" + name.replace(".", "_")
