"""Stochastic-gradient MCMC kernels for ``C`` chains: ``build(...) -> Kernel(init, update)``.

Each kernel samples π(z) from a gradient *estimator* ``value_and_grad(z [C, D]) ->
(log π̃ [C], ∇ log π̃ [C, D])`` — usually a fresh minibatch per call with the likelihood
scaled by N/n — and keeps an explicit NamedTuple state: the current ``z``, the estimate
``log_density`` / ``grad`` at ``z``, the number of steps taken ``step`` and the kernel's
auxiliary variables.  ``init(z)`` evaluates the estimator at the start; ``update(state,
generator, noise=True)`` takes one step and evaluates it at the new point; ``noise=False``
gives the kernel's optimiser (SGD, or momentum SGD for SGHMC), which cyclical SG-MCMC uses
to explore.  ``step_size`` is a float or a schedule ``t -> ε_t`` (t = steps taken); ξ ~ N(0, I).

* :func:`sgld` — Welling & Teh 2011, eq. 4: z ← z + (ε_t/2) g + √ε_t ξ.
* :func:`psgld` — Li et al. 2016, Alg. 1: V ← αV + (1−α) ḡ⊙ḡ with ḡ = g/N (V starts at the
  mean ḡ⊙ḡ of ``warm_start`` estimates at the start), G = 1 ⊘ (λ + √V),
  z ← z + (ε_t/2) G⊙g + √(ε_t G) ξ; the Γ(θ) correction is
  omitted, as the authors recommend (its bias vanishes as α → 1).
* :func:`sghmc` — Chen et al. 2014, eq. 15 with M = I and β̂ = 0: v ← (1−α) v + η g +
  √(2αη) ξ, z ← z + v (``step_size`` η, ``friction`` α); this is Chen et al.'s
  p ← (1−Dh)p − h∇Ũ + √(2Dh) ξ, θ ← θ + hp with η = h², α = Dh.
* :func:`cyclical` — Zhang et al. 2020, Alg. 1: the cosine schedule :func:`cosine_cycle`;
  while mod(t, L)/L < β the inner kernel steps without noise (exploration), afterwards with
  it (sampling).  The SGLD inner step is z ← z + α_t g + √(2α_t) ξ (SGLD with ε = 2α_t), the
  SGHMC one uses η = α_t.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Union

import torch

from inference.mcmc.mass_matrix import random_like
from inference.sgmcmc.step_sizes import rms_preconditioner

__all__ = [
    "Kernel", "StepSize", "SGLDState", "PSGLDState", "SGHMCState", "sgld", "psgld", "sghmc", "cyclical",
    "as_schedule", "polynomial_decay", "cosine_cycle",
]  # fmt: skip

StepSize = Union[float, Callable[[int], float]]
ValueAndGrad = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Kernel(NamedTuple):
    """``init(z [C, D]) -> state``, ``update(state, generator, noise=True) -> state`` and the
    ``step_size`` schedule t -> ε_t that ``update`` applies at step t (for the record)."""

    init: Callable
    update: Callable
    step_size: Callable[[int], float]


# ---------------------------------------------------------------------- schedules
def as_schedule(step_size: StepSize) -> Callable[[int], float]:
    """A schedule ``t -> ε_t`` from a constant or a schedule."""
    if callable(step_size):
        return step_size
    value = float(step_size)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"step_size must be a positive number or a schedule, got {step_size}")
    return lambda t: value


def polynomial_decay(step_size: float, offset: float, decay: float) -> Callable[[int], float]:
    """ε_t = ε₀ (1 + t/b)^−γ, i.e. Welling & Teh 2011's a (b + t)^−γ with a = ε₀ b^γ."""
    return lambda t: step_size * (1 + t / offset) ** (-decay)


def cosine_cycle(step_size: float, cycle_length: int) -> Callable[[int], float]:
    """α_t = (α₀/2) [cos(π mod(t, L)/L) + 1] (Zhang et al. 2020, eq. 1, with t = k − 1)."""
    return lambda t: step_size / 2 * (math.cos(math.pi * (t % cycle_length) / cycle_length) + 1)


# ---------------------------------------------------------------------- kernels
class SGLDState(NamedTuple):
    """``z`` ``[C, D]``, ``log_density`` ``[C]`` and ``grad`` ``[C, D]`` (estimates at z), ``step`` t."""

    z: torch.Tensor
    log_density: torch.Tensor
    grad: torch.Tensor
    step: int


class PSGLDState(NamedTuple):
    """:class:`SGLDState` and ``square_avg`` V ``[C, D]`` (the RMSprop average)."""

    z: torch.Tensor
    log_density: torch.Tensor
    grad: torch.Tensor
    step: int
    square_avg: torch.Tensor


class SGHMCState(NamedTuple):
    """:class:`SGLDState` and the ``momentum`` v ``[C, D]`` (zero at the start)."""

    z: torch.Tensor
    log_density: torch.Tensor
    grad: torch.Tensor
    step: int
    momentum: torch.Tensor


def _noise(z: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return random_like(torch.randn, z.shape, generator, z, dtype=z.dtype)


def sgld(value_and_grad: ValueAndGrad, step_size: StepSize) -> Kernel:
    """SGLD (Welling & Teh 2011, eq. 4); see the module docstring."""
    schedule = as_schedule(step_size)

    def init(z: torch.Tensor) -> SGLDState:
        return SGLDState(z, *value_and_grad(z), 0)

    def update(state: SGLDState, generator: torch.Generator, noise: bool = True) -> SGLDState:
        eps = schedule(state.step)
        z = state.z + (0.5 * eps) * state.grad
        if noise:
            z = z + math.sqrt(eps) * _noise(z, generator)
        return SGLDState(z, *value_and_grad(z), state.step + 1)

    return Kernel(init, update, schedule)


def psgld(
    value_and_grad: ValueAndGrad, step_size: StepSize, num_data: int, rms_decay: float = 0.99, rms_damping: float = 1e-5,
    warm_start: int = 1,
) -> Kernel:
    """Preconditioned SGLD with the RMSprop preconditioner (Li et al. 2016, Alg. 1, Γ omitted).

    ``num_data`` N turns the N-scaled gradient into the mean gradient ḡ = g/N of the preconditioner.
    V starts at the mean ḡ⊙ḡ of ``warm_start`` gradient estimates at the start (1: the first
    one's; more with minibatches, where one estimate's ḡ⊙ḡ is noisy — a coordinate whose first
    minibatch gradient is near zero would otherwise get a huge step until V has averaged).
    """
    schedule = as_schedule(step_size)

    def init(z: torch.Tensor) -> PSGLDState:
        log_density, grad = value_and_grad(z)
        square_avg = sum((g / num_data).square() for g in [grad] + [value_and_grad(z)[1] for _ in range(warm_start - 1)])
        return PSGLDState(z, log_density, grad, 0, square_avg / warm_start)

    def update(state: PSGLDState, generator: torch.Generator, noise: bool = True) -> PSGLDState:
        eps = schedule(state.step)
        mean_grad = state.grad / num_data
        v = rms_decay * state.square_avg + (1 - rms_decay) * mean_grad * mean_grad
        precond = rms_preconditioner(v, rms_damping)
        z = state.z + (0.5 * eps) * precond * state.grad
        if noise:
            z = z + (eps * precond).sqrt() * _noise(z, generator)
        return PSGLDState(z, *value_and_grad(z), state.step + 1, v)

    return Kernel(init, update, schedule)


def sghmc(value_and_grad: ValueAndGrad, step_size: StepSize, friction: float = 0.1) -> Kernel:
    """SGHMC (Chen et al. 2014, eq. 15); ``step_size`` η, ``friction`` α ∈ (0, 1]."""
    schedule = as_schedule(step_size)

    def init(z: torch.Tensor) -> SGHMCState:
        return SGHMCState(z, *value_and_grad(z), 0, torch.zeros_like(z))

    def update(state: SGHMCState, generator: torch.Generator, noise: bool = True) -> SGHMCState:
        eps = schedule(state.step)
        v = (1 - friction) * state.momentum + eps * state.grad
        if noise:
            v = v + math.sqrt(2 * friction * eps) * _noise(state.z, generator)
        z = state.z + v
        return SGHMCState(z, *value_and_grad(z), state.step + 1, v)

    return Kernel(init, update, schedule)


def cyclical(
    value_and_grad: ValueAndGrad, step_size: float, cycle_length: int, exploration: float, kernel: str = "sgld", friction: float = 0.1
) -> Kernel:
    """Cyclical SG-MCMC (Zhang et al. 2020, Alg. 1) with an SGLD or SGHMC inner kernel.

    ``step_size`` α₀ is the peak of the cosine schedule over cycles of ``cycle_length`` L steps;
    the first fraction ``exploration`` β of every cycle steps without noise.
    """
    alpha = cosine_cycle(step_size, cycle_length)
    if kernel == "sgld":
        inner = sgld(value_and_grad, lambda t: 2.0 * alpha(t))  # z + α g + √(2α) ξ
    elif kernel == "sghmc":
        inner = sghmc(value_and_grad, alpha, friction)
    else:
        raise ValueError(f"unknown cyclical kernel {kernel!r}; valid: sgld, sghmc")

    def update(state, generator: torch.Generator):
        explore = (state.step % cycle_length) / cycle_length < exploration
        return inner.update(state, generator, noise=not explore)

    return Kernel(inner.init, update, inner.step_size)
