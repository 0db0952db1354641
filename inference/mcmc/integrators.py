"""The leapfrog integrator over a batch of chains (Neal 2011, eqs. 5.18–5.20).

    p ← p + (ε/2) ∇log π(z);   z ← z + ε M⁻¹ p;   p ← p + (ε/2) ∇log π(z)

It is time-reversible (negating p and ε retraces the step) and volume-preserving, and its
energy error after a fixed integration time is O(ε²) (Neal 2011, §5.2.3.3), which is what
lets HMC and NUTS accept most proposals.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from inference.mcmc.mass_matrix import kinetic_energy, velocity

__all__ = ["IntegratorState", "leapfrog", "energy", "energy_error"]


class IntegratorState(NamedTuple):
    """A point of the Hamiltonian flow for ``C`` chains.

    Attributes:
        z: positions ``[C, D]`` (unconstrained coordinates).
        p: momenta ``[C, D]``.
        log_density: log π(z) ``[C]``.
        grad: ∇ log π(z) ``[C, D]``.
    """

    z: torch.Tensor
    p: torch.Tensor
    log_density: torch.Tensor
    grad: torch.Tensor


def leapfrog(
    value_and_grad: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    inv_mass: torch.Tensor,
    state: IntegratorState,
    step_size: torch.Tensor,
) -> IntegratorState:
    """One leapfrog step of signed per-chain size ``step_size`` ``[C, 1]`` (negative: backwards in time).

    ``value_and_grad(z [C, D]) -> (log π [C], ∇ log π [C, D])``; ``inv_mass`` ``[C, D]`` or ``[C, D, D]``.
    """
    p = state.p + (0.5 * step_size) * state.grad
    z = state.z + step_size * velocity(inv_mass, p)
    log_density, grad = value_and_grad(z)
    p = p + (0.5 * step_size) * grad
    return IntegratorState(z, p, log_density, grad)


def energy(inv_mass: torch.Tensor, state: IntegratorState) -> torch.Tensor:
    """The Hamiltonian H = K(p) − log π(z), ``[C]``."""
    return kinetic_energy(inv_mass, state.p) - state.log_density


def energy_error(energy: torch.Tensor, energy0: torch.Tensor) -> torch.Tensor:
    """H − H₀ ``[C]``, with NaN (a failed evaluation) mapped to +∞ so that it counts as divergent."""
    delta = energy - energy0
    return torch.where(torch.isnan(delta), torch.full_like(delta, math.inf), delta)
