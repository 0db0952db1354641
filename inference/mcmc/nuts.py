"""Iterative NUTS trajectory building, batched over chains.

Multinomial NUTS with the generalised no-U-turn criterion (Hoffman & Gelman 2014;
Betancourt 2017, App. A), built iteratively as in NumPyro and BlackJAX: the trajectory
doubles in a random direction; the new subtree of 2^j leapfrog steps is built step by
step, and at each step the aligned sub-blocks of 2^k steps (k ≤ j) that end there are
checked for a U-turn against checkpoints stored where they started (their first momentum,
velocity and running momentum sum), so no recursion and only ``[K, C, D]`` memory is
needed.  A divergence (energy error above a threshold) or a U-turn stops a subtree; a
finished subtree is merged into the trajectory by biased progressive sampling, and the
whole trajectory is checked for a U-turn.  All chains build subtrees of the same size in
lockstep; stopped chains are masked, so each chain's draw is exactly NUTS.  A subtree is
one compiled ``torch.while_loop`` (:func:`build_subtree`): its steps, the block masks and the
progressive-sampling uniforms stay inside the compiled call, so the per-step cost is the
gradient and the bookkeeping arithmetic, not Python dispatch between calls.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from inference.mcmc.integrators import IntegratorState, energy_error, leapfrog
from inference.mcmc.mass_matrix import velocity

__all__ = ["Proposal", "Edge", "Checkpoints", "TreeState", "is_turning", "subtree_step", "block_masks", "build_subtree", "new_subtree"]


class Proposal(NamedTuple):
    """A candidate draw: position ``z`` ``[C, D]``, ``log_density`` ``[C]``, ``grad`` ``[C, D]``, ``energy`` H ``[C]``."""

    z: torch.Tensor
    log_density: torch.Tensor
    grad: torch.Tensor
    energy: torch.Tensor


class Edge(NamedTuple):
    """One end of a trajectory: position ``z``, momentum ``p``, ``log_density`` ``[C]``, ``grad`` and
    velocity ``v`` = M⁻¹p (each ``[C, D]`` unless stated)."""

    z: torch.Tensor
    p: torch.Tensor
    log_density: torch.Tensor
    grad: torch.Tensor
    v: torch.Tensor


class Checkpoints(NamedTuple):
    """Per level k = 1..K, at the start of the current aligned block of 2^k steps: the momentum
    ``p``, velocity ``v`` and the subtree's running momentum sum ``rho``, each ``[K, C, D]``."""

    p: torch.Tensor
    v: torch.Tensor
    rho: torch.Tensor


class TreeState(NamedTuple):
    """The state of a subtree under construction, for all chains.

    Attributes:
        edge: the subtree's last point.
        alive: ``[C]`` bool, no U-turn or divergence yet (and the chain's trajectory not finished).
        log_w: log Σ exp(H₀ − H) over the subtree's points ``[C]``.
        proposal: the subtree's multinomial (uniformly progressive) sample.
        rho: the subtree's momentum sum ``[C, D]``.
        checkpoints: see :class:`Checkpoints`.
        accept_sum: Σ min(1, exp(H₀ − H)) over the whole trajectory so far ``[C]`` (over
            ``n_steps``, the dual-averaging statistic of Hoffman & Gelman 2014, §3.2.1).
        n_steps: leapfrog steps taken so far ``[C]``.
        diverging: ``[C]`` bool, a divergence anywhere in the trajectory.
    """

    edge: Edge
    alive: torch.Tensor
    log_w: torch.Tensor
    proposal: Proposal
    rho: torch.Tensor
    checkpoints: Checkpoints
    accept_sum: torch.Tensor
    n_steps: torch.Tensor
    diverging: torch.Tensor


def is_turning(v_left, v_right, p_left, p_right, rho) -> torch.Tensor:
    """The generalised no-U-turn criterion between two ends of a (sub)trajectory, bool ``[..., C]``.

    ``rho`` is the momentum sum over all its points, ends included; as in NumPyro (Betancourt
    2017, App. A.4.2), the sum used is ρ − (p_left + p_right)/2, and the trajectory is turning
    when its velocity at either end points against it: v_left·ρ' ≤ 0 or v_right·ρ' ≤ 0.
    """
    rho = rho - 0.5 * (p_left + p_right)
    return ((v_left * rho).sum(-1) <= 0) | ((v_right * rho).sum(-1) <= 0)


def new_subtree(edge: Edge, alive, proposal: Proposal, checkpoints: Checkpoints, accept_sum, n_steps, diverging) -> TreeState:
    """An empty subtree starting from ``edge`` (log weight −∞, zero momentum sum)."""
    return TreeState(
        edge, alive, torch.full_like(proposal.log_density, -math.inf), proposal, torch.zeros_like(edge.p),
        checkpoints, accept_sum, n_steps, diverging,
    )  # fmt: skip


def subtree_step(
    value_and_grad: Callable,
    max_energy_error: float,
    inv_mass: torch.Tensor,
    step_size: torch.Tensor,
    energy0: torch.Tensor,
    s: TreeState,
    u: torch.Tensor,
    store: torch.Tensor,
    check: torch.Tensor,
) -> TreeState:
    """One leapfrog step inside a NUTS subtree, for all chains (the compiled hot path).

    Args:
        value_and_grad: ``z [C, D] -> (log π [C], ∇ log π [C, D])``.
        max_energy_error: an energy error H − H₀ above this is a divergence.
        inv_mass: ``[C, D]`` or ``[C, D, D]``.
        step_size: signed per-chain step ``[C, 1]`` (the subtree's direction).
        energy0: the initial point's energy ``[C]``.
        s: the subtree so far.
        u: uniforms ``[C]`` for the progressive proposal.
        store / check: bool ``[K]``: the levels whose aligned block starts / ends at this step.
    """
    edge = s.edge
    z, p, lp, grad = leapfrog(value_and_grad, inv_mass, IntegratorState(edge.z, edge.p, edge.log_density, edge.grad), step_size)
    v = velocity(inv_mass, p)
    energy = 0.5 * (p * v).sum(-1) - lp
    delta = energy_error(energy, energy0)
    div = delta > max_energy_error
    alive = s.alive
    log_w = torch.logaddexp(s.log_w, -delta)
    take = u < torch.exp(-delta - log_w)
    t1 = take.unsqueeze(-1)
    rho = s.rho + p
    ck = s.checkpoints
    block = rho - ck.rho + ck.p
    turning = (is_turning(ck.v, v, ck.p, p, block) & check.unsqueeze(-1)).any(0)
    st = store.view(-1, 1, 1)
    prop = s.proposal
    return TreeState(
        edge=Edge(z, p, lp, grad, v),
        alive=alive & ~(div | turning),
        log_w=log_w,
        proposal=Proposal(
            torch.where(t1, z, prop.z), torch.where(take, lp, prop.log_density),
            torch.where(t1, grad, prop.grad), torch.where(take, energy, prop.energy),
        ),
        rho=rho,
        checkpoints=Checkpoints(torch.where(st, p, ck.p), torch.where(st, v, ck.v), torch.where(st, rho, ck.rho)),
        accept_sum=s.accept_sum + torch.where(alive, torch.exp(torch.clamp(-delta, max=0.0)), 0.0),
        n_steps=s.n_steps + alive.to(lp.dtype),
        diverging=s.diverging | (alive & div),
    )  # fmt: skip


def block_masks(i: torch.Tensor, num_steps: torch.Tensor, block_sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool ``[K]`` masks of the levels k (block sizes ``block_sizes`` = 2^k, k = 1..K) whose aligned
    block of 2^k steps starts (``store``) / ends (``check``) at step ``i`` of a subtree of
    ``num_steps`` = 2^j steps; levels with 2^k > 2^j are never set.  ``i`` and ``num_steps`` are
    integer tensors (or ints), so the masks are computed inside the compiled loop."""
    inside = block_sizes <= num_steps
    return (i % block_sizes == 0) & inside, ((i + 1) % block_sizes == 0) & inside


def _flatten(s: TreeState) -> tuple:
    return (*s.edge, s.alive, s.log_w, *s.proposal, s.rho, *s.checkpoints, s.accept_sum, s.n_steps, s.diverging)


def _unflatten(t) -> TreeState:
    return TreeState(Edge(*t[:5]), t[5], t[6], Proposal(*t[7:11]), t[11], Checkpoints(*t[12:15]), t[15], t[16], t[17])


def build_subtree(
    value_and_grad: Callable,
    max_energy_error: float,
    inv_mass: torch.Tensor,
    step_size: torch.Tensor,
    energy0: torch.Tensor,
    tree: TreeState,
    u: torch.Tensor,
    num_steps: torch.Tensor,
    block_sizes: torch.Tensor,
) -> TreeState:
    """A whole subtree: up to ``num_steps`` = 2^j :func:`subtree_step` s, stopping early once no chain is alive.

    Under ``torch.compile`` the steps run as one ``while_loop`` (one compiled call per subtree,
    no Python between the leapfrog steps); eagerly, as a Python loop over the same step.  A chain
    that has stopped keeps stepping until all have (its subtree is discarded anyway).

    Args:
        u: ``[L, C]`` uniforms, L ≥ 2^j; row i is the progressive-sampling uniform of step i
            (a fixed-size buffer, so every depth reuses one compiled graph).
        num_steps: 0-d int64 tensor 2^j.
        block_sizes: int64 ``[K]``, 2^k for k = 1..K (see :func:`block_masks`).
        Others as in :func:`subtree_step`.
    """
    alive_at = 5  # position of ``alive`` in the flattened state

    def cond(i, *state):
        return (i < num_steps) & state[alive_at].any()

    def body(i, *state):
        store, check = block_masks(i, num_steps, block_sizes)
        ui = u.index_select(0, i.view(1)).squeeze(0)
        new = subtree_step(value_and_grad, max_energy_error, inv_mass, step_size, energy0, _unflatten(state), ui, store, check)
        return (i + 1, *_flatten(new))

    if torch.compiler.is_compiling():
        carry = torch.while_loop(cond, body, (torch.zeros((), dtype=torch.int64, device=u.device), *_flatten(tree)))
        return _unflatten(carry[1:])
    # eagerly: every step's masks at once, and a host check for stopped chains every 16 steps
    n = int(num_steps)
    stores, checks = block_masks(torch.arange(n, device=u.device).unsqueeze(-1), num_steps, block_sizes)
    for i, (ui, store, check) in enumerate(zip(u[:n].unbind(0), stores.unbind(0), checks.unbind(0))):
        tree = subtree_step(value_and_grad, max_energy_error, inv_mass, step_size, energy0, tree, ui, store, check)
        if i % 16 == 15 and not bool(tree.alive.any()):
            break
    return tree
