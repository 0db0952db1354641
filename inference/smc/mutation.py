"""The mutation kernel of tempered SMC: HMC moves that leave π_β invariant, tuned from the particle population.

After resampling at inverse temperature β, every particle takes ``num_moves`` static-HMC transitions
(:func:`inference.mcmc.kernels.hmc_transition`: L jittered leapfrog steps, Metropolis acceptance) on the
tempered log density

    log π_β(z) = log p(T(z)) + log|det ∂T/∂z| + β log p(y | x, T(z))

in the unconstrained coordinates z of :class:`inference.optim.potential.Potential`.  The kernel is tuned from
the population, as Buchholz, Chopin & Jacob 2021 do (and Chopin 2002 for random-walk moves):

* the metric — a diagonal inverse mass matrix M⁻¹ = diag(Var_W[z]) from the weighted particles *before*
  resampling (:func:`population_metric`), the same for every particle, floored at ``1e-8`` · its mean;
* the step size — one ε for the population, carried from stage to stage and updated after every move from the
  population's mean acceptance probability ā (:func:`adapt_step_size`): log ε ← log ε + κ (ā − a*), κ = 2, a
  stochastic-approximation step towards the target acceptance a* (Andrieu & Thoms 2008, §4); each particle's
  step is jittered as ε (1 + j u), u ~ U(−1, 1) (Neal 2011, §5.4.2.2);
* the trajectory — L = min(L_max, ⌈τ / ε⌉) leapfrog steps (:func:`num_leapfrog_steps`), so that the integration
  time ε L stays τ in units of the population's standard deviation whatever ε the acceptance asks for (the
  posterior of a network is far narrower across some directions than the population's spread, and a fixed L
  with the small ε it needs would barely move along the others; Neal 2011, §5.4.2.2, on trajectories of the
  target's scale).  ``trajectory_length=None`` keeps L = L_max.

The tuning depends on the population only (never on one particle's own path), so every move is a π_β-invariant
kernel given the population (Beskos, Jasra, Kantas & Thiéry 2016 on adaptive SMC).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import torch

from inference.mcmc.integrators import leapfrog
from inference.mcmc.kernels import HMCState, hmc_transition
from inference.mcmc.mass_matrix import Metric, euclidean_metric
from inference.smc.tempering import normalised_log_weights

__all__ = ["MoveRecord", "population_metric", "tempered_value_and_grad", "adapt_step_size", "num_leapfrog_steps",
           "mutate", "STEP_SIZE_GAIN", "METRIC_FLOOR"]

#: κ of the step size's update log ε ← log ε + κ (ā − a*)
STEP_SIZE_GAIN = 2.0
#: the inverse mass is floored at this fraction of its mean (a coordinate the population has collapsed in)
METRIC_FLOOR = 1e-8

PriorAndLikelihood = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


class MoveRecord(NamedTuple):
    """What one stage's mutation did: ``acceptance`` (the mean acceptance probability of each move, a list),
    ``divergences`` (particles whose energy error passed the limit, summed over the moves), ``step_size``
    (the step size after the last update) and ``leapfrog_steps`` (L of each move, a list)."""

    acceptance: list
    divergences: int
    step_size: float
    leapfrog_steps: list


def population_metric(z: torch.Tensor, log_weights: torch.Tensor) -> Metric:
    """The diagonal metric of ``N`` particles ``z`` ``[N, D]`` with log weights ``[N]``: M⁻¹ = diag(Var_W[z]) for
    every particle (``[N, D]``), in ``z``'s dtype; floored at :data:`METRIC_FLOOR` · its mean."""
    w = normalised_log_weights(log_weights.double()).exp().unsqueeze(-1)
    zd = z.double()
    mean = (w * zd).sum(0)
    var = (w * (zd - mean) ** 2).sum(0)
    var = var.clamp(min=METRIC_FLOOR * float(var.mean()) if float(var.mean()) > 0 else METRIC_FLOOR)
    return euclidean_metric(var.to(z.dtype).expand_as(z).contiguous())


def tempered_value_and_grad(prior_and_likelihood: PriorAndLikelihood, beta: float) -> Callable:
    """``z [N, D] -> (log π_β(z) [N], ∇ log π_β(z) [N, D])`` of ``prior_and_likelihood(z) -> (log prior [N],
    log-likelihood [N])`` (log prior with the log-Jacobian of the unconstrained coordinates), in one reverse pass."""

    def value_and_grad(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            log_prior, log_lik = prior_and_likelihood(z)
            value = log_prior + beta * log_lik
            (grad,) = torch.autograd.grad(value.sum(), z)
        return value.detach(), grad

    return value_and_grad


def adapt_step_size(step_size: float, acceptance: float, target_accept: float) -> float:
    """log ε + κ (ā − a*) (module docstring): ε shrinks when the moves accept less than ``target_accept``.
    A NaN acceptance (every proposal failed) counts as 0."""
    acceptance = 0.0 if math.isnan(acceptance) else acceptance
    return step_size * math.exp(STEP_SIZE_GAIN * (acceptance - target_accept))


def num_leapfrog_steps(step_size: float, trajectory_length, max_leapfrog: int) -> int:
    """L = min(``max_leapfrog``, ⌈τ / ε⌉) for τ = ``trajectory_length`` (``None``: ``max_leapfrog``)."""
    if trajectory_length is None:
        return int(max_leapfrog)
    return int(min(max_leapfrog, max(1, math.ceil(trajectory_length / step_size))))


def mutate(
    prior_and_likelihood: PriorAndLikelihood, z: torch.Tensor, beta: float, metric: Metric, step_size: float,
    generator: torch.Generator, *, num_moves: int, num_leapfrog: int, target_accept: float, step_jitter: float,
    max_energy_error: float, trajectory_length=None,
) -> tuple[torch.Tensor, MoveRecord]:  # fmt: skip
    """``num_moves`` HMC transitions of every particle ``z`` ``[N, D]`` on π_β (module docstring), starting from
    ``step_size`` and adapting it after each move, each of :func:`num_leapfrog_steps` (``num_leapfrog`` the most)
    leapfrog steps; returns the moved particles ``[N, D]`` and a :class:`MoveRecord`."""
    value_and_grad = tempered_value_and_grad(prior_and_likelihood, beta)
    lp, grad = value_and_grad(z)
    state = HMCState(z, lp, grad)
    step = partial(leapfrog, value_and_grad)
    acceptance, divergences, lengths = [], 0, []
    for _ in range(num_moves):
        eps = torch.full_like(lp, step_size)
        lengths.append(num_leapfrog_steps(step_size, trajectory_length, num_leapfrog))
        state, info = hmc_transition(step, max_energy_error, lengths[-1], step_jitter, state, eps, metric, generator)
        accepted = float(torch.nan_to_num(info["accept_prob"], nan=0.0).mean())
        acceptance.append(accepted)
        divergences += int(info["diverging"].sum())
        step_size = adapt_step_size(step_size, accepted, target_accept)
    return state.z, MoveRecord(acceptance, divergences, step_size, lengths)
