"""HMC and NUTS transitions for ``C`` chains in lockstep.

* static HMC (Neal 2011, §5.3.2): momentum p ~ N(0, M), ``num_steps`` leapfrog steps with
  the step size jittered as ε·(1 + j·u), u ~ U(−1, 1) (Neal 2011, §5.4.2.2; it breaks the
  resonance of fixed-length trajectories), Metropolis acceptance min(1, exp(H₀ − H₁)).
* NUTS: multinomial NUTS (Hoffman & Gelman 2014; Betancourt 2017) built as in
  :mod:`inference.mcmc.nuts`.

:func:`build_hmc` / :func:`build_nuts` return ``transition(state, step_size [C], metric,
generator) -> (state, info)``, with ``info`` a dict of ``[C]`` tensors: ``accept_prob``,
``diverging``, ``energy``, ``n_steps`` (and ``tree_depth`` for NUTS).  The leapfrog step
(HMC) and the whole subtree (NUTS, :func:`~inference.mcmc.nuts.build_subtree`) are
``torch.compile``-d with the potential's gradient when ``compile`` is set
(:func:`inference.optim.potential.compiled`); the backends build both and switch from the eager to the
compiled transition only where compiling pays (:class:`inference.mcmc.compilation.LazyCompile`).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import torch

from inference.optim.potential import Potential, compiled
from inference.mcmc.compilation import interruptible
from inference.mcmc.integrators import IntegratorState, energy, energy_error, leapfrog
from inference.mcmc.mass_matrix import Metric, random_like, sample_momentum, velocity
from inference.mcmc.nuts import Checkpoints, Edge, Proposal, build_subtree, is_turning, new_subtree

__all__ = ["HMCState", "build_hmc", "build_nuts", "hmc_transition", "nuts_transition"]


class HMCState(NamedTuple):
    """The chains' current draws: ``z`` ``[C, D]``, ``log_density`` ``[C]``, ``grad`` ``[C, D]``."""

    z: torch.Tensor
    log_density: torch.Tensor
    grad: torch.Tensor


def _value_and_grad(potential: Potential, compile: bool):
    return potential.functional_value_and_grad if compile else potential.value_and_grad


def _unit(fn: Callable, potential: Potential, compile: bool, *args) -> Callable:
    """``fn`` with the potential's gradient and ``args`` bound: compiled for ``potential``'s device, or eager and
    :func:`~inference.mcmc.compilation.interruptible` (an eager iteration past its budget gives way)."""
    bound = compiled(fn, compile, _value_and_grad(potential, compile), *args, device=potential.device)
    return bound if compile else interruptible(bound)


def build_hmc(potential: Potential, compile: bool, max_energy_error: float, num_steps: int, step_jitter: float) -> Callable:
    """The static-HMC transition over ``potential`` (see the module docstring)."""
    return partial(hmc_transition, _unit(leapfrog, potential, compile), max_energy_error, num_steps, step_jitter)


def build_nuts(potential: Potential, compile: bool, max_energy_error: float, max_tree_depth: int) -> Callable:
    """The NUTS transition over ``potential`` with at most 2^``max_tree_depth`` − 1 leapfrog steps."""
    return partial(nuts_transition, _unit(build_subtree, potential, compile, max_energy_error), max_tree_depth)


def hmc_transition(
    step: Callable, max_energy_error: float, num_steps: int, step_jitter: float,
    state: HMCState, step_size: torch.Tensor, metric: Metric, generator: torch.Generator,
) -> tuple[HMCState, dict]:  # fmt: skip
    """One static-HMC iteration for all chains; ``step(inv_mass, IntegratorState, ε [C, 1])`` is a leapfrog step."""
    z, lp, grad = state
    p = sample_momentum(metric, generator)
    point = IntegratorState(z, p, lp, grad)
    energy0 = energy(metric.inv_mass, point)
    jitter = 1 + step_jitter * (2 * random_like(torch.rand, step_size.shape, generator, z) - 1)
    eps = (step_size * jitter).unsqueeze(-1)
    for _ in range(num_steps):
        point = step(metric.inv_mass, point, eps)
    energy1 = energy(metric.inv_mass, point)
    delta = energy_error(energy1, energy0)
    accept_prob = torch.exp(torch.clamp(-delta, max=0.0))
    accept = random_like(torch.rand, accept_prob.shape, generator, z) < accept_prob
    info = {
        "accept_prob": accept_prob,
        "diverging": delta > max_energy_error,
        "energy": torch.where(accept, energy1, energy0),
        "n_steps": torch.full_like(lp, num_steps),
    }
    new = HMCState(_select(accept, point.z, z), _select(accept, point.log_density, lp), _select(accept, point.grad, grad))
    return new, info


def _select(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a`` where the per-chain ``mask`` ``[C]`` is set, else ``b`` (any trailing dimensions)."""
    return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b)


def nuts_transition(
    subtree: Callable, max_tree_depth: int,
    state: HMCState, step_size: torch.Tensor, metric: Metric, generator: torch.Generator,
) -> tuple[HMCState, dict]:  # fmt: skip
    """One multinomial NUTS iteration for all chains; ``subtree`` is :func:`~inference.mcmc.nuts.build_subtree`
    with its first two arguments bound."""
    z, lp, grad = state
    num_chains = z.shape[0]
    p = sample_momentum(metric, generator)
    v = velocity(metric.inv_mass, p)
    energy0 = 0.5 * (p * v).sum(-1) - lp
    left = right = Edge(z, p, lp, grad, v)
    rho = p  # momentum sum over the whole trajectory
    proposal = Proposal(z, lp, grad, energy0)
    log_w = torch.zeros_like(lp)  # log Σ exp(H₀ − H) over the trajectory
    done = torch.zeros(num_chains, dtype=torch.bool, device=z.device)
    depth = torch.zeros_like(lp)
    accept_sum, n_steps, diverging = torch.zeros_like(lp), torch.zeros_like(lp), torch.zeros_like(done)
    checkpoints = Checkpoints(*(z.new_zeros(max_tree_depth, *z.shape) for _ in range(3)))  # distinct: no aliasing guards
    block_sizes = 2 ** torch.arange(1, max_tree_depth + 1, device=z.device)
    uniforms = z.new_empty(2 ** (max_tree_depth - 1), num_chains)  # one buffer: one compiled graph for every depth
    for j in range(max_tree_depth):
        forward = random_like(torch.rand, num_chains, generator, z) < 0.5
        start = Edge(*(_select(forward, r, l) for r, l in zip(right, left)))
        eps = torch.where(forward, step_size, -step_size).unsqueeze(-1)
        initial = Proposal(z.clone(), lp.clone(), grad.clone(), energy0.clone())  # replaced at the first step
        sub = new_subtree(start, ~done, initial, checkpoints, accept_sum, n_steps, diverging)
        uniforms[: 2**j] = random_like(torch.rand, (2**j, num_chains), generator, z, dtype=z.dtype)
        num_steps = torch.tensor(2**j, device=z.device)
        sub = subtree(metric.inv_mass, eps, energy0, sub, uniforms, num_steps, block_sizes)
        accept_sum, n_steps, diverging = sub.accept_sum, sub.n_steps, sub.diverging
        ok = sub.alive
        take = ok & (random_like(torch.rand, num_chains, generator, z) < torch.exp(sub.log_w - log_w))  # biased progressive sampling
        proposal = Proposal(*(_select(take, a, b) for a, b in zip(sub.proposal, proposal)))
        log_w = torch.where(ok, torch.logaddexp(log_w, sub.log_w), log_w)
        right = Edge(*(_select(ok & forward, a, b) for a, b in zip(sub.edge, right)))
        left = Edge(*(_select(ok & ~forward, a, b) for a, b in zip(sub.edge, left)))
        rho = torch.where(ok.unsqueeze(-1), rho + sub.rho, rho)
        depth = torch.where(done, depth, torch.full_like(depth, j + 1))
        done = done | ~ok | is_turning(left.v, right.v, left.p, right.p, rho)
        if bool(done.all()):
            break
    info = {
        "accept_prob": accept_sum / n_steps.clamp(min=1),
        "diverging": diverging,
        "energy": proposal.energy,
        "tree_depth": depth,
        "n_steps": n_steps,
    }
    return HMCState(proposal.z, proposal.log_density, proposal.grad), info
