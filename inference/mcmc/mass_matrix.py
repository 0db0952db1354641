"""Euclidean metrics: kinetic energy, momentum sampling and velocity, per chain.

A metric is the inverse mass matrix M⁻¹ of each chain, ``[C, D]`` (diagonal) or
``[C, D, D]`` (dense): kinetic energy K(p) = ½ pᵀ M⁻¹ p, momenta p ~ N(0, M), velocity
dz/dt = M⁻¹ p (Neal 2011, §5.2).  The functions are pure, so the
compiled integrator can inline them.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

__all__ = [
    "Metric", "euclidean_metric", "identity_metric", "random_like", "sample_momentum", "velocity", "kinetic_energy",
]  # fmt: skip


class Metric(NamedTuple):
    """A Euclidean metric for ``C`` chains.

    Attributes:
        inv_mass: M⁻¹, ``[C, D]`` (diagonal) or ``[C, D, D]`` (dense).
        momentum_factor: maps ε ~ N(0, I) to p ~ N(0, M): the sd M^{½} ``[C, D]``
            (diagonal), or L⁻¹ ``[C, D, D]`` with M⁻¹ = L Lᵀ (dense; p = L⁻ᵀ ε as a row
            vector ε L⁻¹).
    """

    inv_mass: torch.Tensor
    momentum_factor: torch.Tensor

    @property
    def dense(self) -> bool:
        return self.inv_mass.dim() == 3


def euclidean_metric(inv_mass: torch.Tensor) -> Metric:
    """The metric of inverse mass ``[C, D]`` (diagonal) or ``[C, D, D]`` (dense, symmetric positive definite)."""
    if inv_mass.dim() == 3:
        chol = torch.linalg.cholesky(inv_mass)  # M⁻¹ = L Lᵀ, so p = L⁻ᵀ ε ~ N(0, M)
        eye = torch.eye(inv_mass.shape[-1], dtype=inv_mass.dtype, device=inv_mass.device).expand_as(inv_mass)
        return Metric(inv_mass, torch.linalg.solve_triangular(chol, eye, upper=False))
    if inv_mass.dim() != 2:
        raise ValueError(f"inv_mass must be [C, D] or [C, D, D], got shape {tuple(inv_mass.shape)}")
    return Metric(inv_mass, inv_mass.rsqrt())


def identity_metric(num_chains: int, dim: int, dense: bool, like: Optional[torch.Tensor] = None) -> Metric:
    """M = I for every chain, stored diagonal ``[C, D]`` or dense ``[C, D, D]``, with ``like``'s dtype and device."""
    options = {} if like is None else {"dtype": like.dtype, "device": like.device}
    if dense:
        return euclidean_metric(torch.eye(dim, **options).expand(num_chains, dim, dim).clone())
    return euclidean_metric(torch.ones(num_chains, dim, **options))


def random_like(draw, shape, generator: torch.Generator, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """``draw(shape)`` (``torch.rand`` / ``torch.randn``) from ``generator``, on ``like``'s device.

    The draw is made on the generator's device and then moved, so a CPU generator gives the
    same stream whatever device the chains are on.
    """
    out = draw(shape, generator=generator, dtype=dtype, device=generator.device)
    return out.to(like.device)


def sample_momentum(metric: Metric, generator: torch.Generator) -> torch.Tensor:
    """p ~ N(0, M) per chain, ``[C, D]``."""
    inv_mass = metric.inv_mass
    eps = random_like(torch.randn, inv_mass.shape[:2], generator, inv_mass, dtype=inv_mass.dtype)
    if metric.dense:
        return (eps.unsqueeze(1) @ metric.momentum_factor).squeeze(1)
    return eps * metric.momentum_factor


def velocity(inv_mass: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """M⁻¹ p, ``[C, D]``."""
    return (p.unsqueeze(1) @ inv_mass).squeeze(1) if inv_mass.dim() == 3 else p * inv_mass


def kinetic_energy(inv_mass: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """K(p) = ½ pᵀ M⁻¹ p, ``[C]``."""
    return 0.5 * (p * velocity(inv_mass, p)).sum(-1)
