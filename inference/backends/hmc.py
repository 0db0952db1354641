"""HMC and NUTS over exactly a model's random sites, all chains in lockstep.

Both backends sample ``π(z)`` of :class:`inference.potential.Potential`: the random
weights and likelihood latents in unconstrained coordinates; deterministic parameters
stay at the network's values (after the optional MAP initialisation, which fits them
jointly when the model trains them).  The ``C`` chains are one ``[C, D]`` tensor, so
each leapfrog step costs one batched forward/reverse pass for all chains.

* ``hmc`` — static HMC (Neal 2011, eq. 5.18–5.20 leapfrog; Metropolis acceptance
  min(1, exp(H₀ − H₁))) with ``num_steps`` leapfrog steps.
* ``nuts`` — the No-U-Turn sampler with multinomial sampling and the generalised
  U-turn criterion (Hoffman & Gelman 2014; Betancourt 2017, App. A.4), built
  iteratively as in NumPyro/BlackJAX: a trajectory doubles in a random direction; a new
  subtree of 2^j steps is checked for U-turns on every aligned sub-block (checkpoints
  of momentum sums) and divergence, merged by biased progressive sampling, and the
  whole trajectory is checked.  All chains build subtrees of the same size in
  lockstep; finished chains are masked, so the result per chain is exactly NUTS.

Warm-up (Stan's windowed scheme): step size by dual averaging (Hoffman & Gelman 2014,
Alg. 5: target acceptance δ, γ = 0.05, t₀ = 10, κ = 0.75), an inverse mass matrix
(diagonal or dense) from the sample covariance in doubling windows, regularised as
(n/(n+5))·Σ + 10⁻³·5/(n+5)·I, with the step size re-initialised (Alg. 4) after each
update.  Per-chain adaptation; fixed after warm-up, so draws are exact.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass
from functools import partial
from typing import Callable

import pyro
import torch
from tqdm.auto import tqdm

from ..diagnostics import tree_depth_saturation
from ..posterior import SamplePosterior
from ..potential import INIT_STRATEGIES, Potential, compiled, frozen_deterministic, initial_point
from .base import Backend, NonFiniteLossError

__all__ = ["ChainConfig", "HMCConfig", "NUTSConfig", "HMCBackend", "NUTSBackend", "Metric", "nuts_transition", "hmc_transition"]


@dataclass
class ChainConfig:
    """Options shared by ``hmc`` and ``nuts``.

    Attributes:
        num_chains: chains run side by side (one batched forward pass per leapfrog step).
        warmup_steps: adaptation iterations per chain (discarded).
        num_samples: draws kept per chain; ``num_samples · thin`` iterations are run.
        thin: keep every ``thin``-th iteration.
        step_size: initial leapfrog step size (refined by the warm-up).
        target_accept: dual-averaging target of the mean acceptance probability.
        adapt_step_size / adapt_mass: switch the warm-up adaptations.
        dense_mass: adapt a dense instead of a diagonal inverse mass matrix.
        max_energy_error: an energy error above this marks a divergent transition.
        init: ``"map"`` (quick Adam MAP fit first) or ``"current"`` (the network's weights).
        map_steps / map_lr: the MAP fit's full-batch Adam steps and learning rate.
        init_jitter: sd of the Gaussian jitter added to the start of every chain
            (unconstrained coordinates).
        pool_adaptation: estimate one inverse mass matrix from the warm-up draws of all
            chains together (C times the draws of a per-chain estimate) instead of one per chain.
        compile: ``torch.compile`` the leapfrog/NUTS step with the potential and its
            gradient (a one-off compile of tens of seconds, then several times faster
            steps; falls back to eager execution if compilation fails).
    """

    num_chains: int = 4
    warmup_steps: int = 200
    num_samples: int = 200
    thin: int = 1
    step_size: float = 0.01
    target_accept: float = 0.8
    adapt_step_size: bool = True
    adapt_mass: bool = True
    dense_mass: bool = False
    max_energy_error: float = 1000.0
    init: str = "map"
    map_steps: int = 20000
    map_lr: float = 0.01
    init_jitter: float = 0.01
    compile: bool = True
    pool_adaptation: bool = False

    def validate(self):
        for name in ("num_chains", "num_samples", "thin"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "map_steps"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        for name in ("step_size", "max_energy_error", "map_lr"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")
        if not 0 < self.target_accept < 1:
            raise ValueError(f"target_accept must lie in (0, 1), got {self.target_accept}")
        if not (math.isfinite(self.init_jitter) and self.init_jitter >= 0):
            raise ValueError(f"init_jitter must be non-negative, got {self.init_jitter}")
        if self.init not in INIT_STRATEGIES:
            raise ValueError(f"unknown init {self.init!r}; valid: {', '.join(INIT_STRATEGIES)}")


@dataclass
class HMCConfig(ChainConfig):
    """Options of ``hmc``: :class:`ChainConfig`, ``num_steps`` leapfrog steps per iteration and
    ``step_jitter`` j: each iteration uses step size ε·(1 + j·u), u ~ U(−1, 1) (Neal 2011, §5.4.2.2),
    which breaks the resonance of fixed-length trajectories."""

    num_steps: int = 16
    step_jitter: float = 0.2

    def validate(self):
        super().validate()
        if int(self.num_steps) < 1:
            raise ValueError(f"num_steps must be at least 1, got {self.num_steps}")
        if not 0 <= self.step_jitter < 1:
            raise ValueError(f"step_jitter must lie in [0, 1), got {self.step_jitter}")


@dataclass
class NUTSConfig(ChainConfig):
    """Options of ``nuts``: :class:`ChainConfig` and ``max_tree_depth`` (at most
    2^depth − 1 leapfrog steps per iteration)."""

    max_tree_depth: int = 10

    def validate(self):
        super().validate()
        if not 1 <= int(self.max_tree_depth) <= 15:
            raise ValueError(f"max_tree_depth must be between 1 and 15, got {self.max_tree_depth}")


# ---------------------------------------------------------------------- kinetic energy
class Metric:
    """Euclidean metric per chain: inverse mass ``[C, D]`` (diagonal) or ``[C, D, D]`` (dense).

    K(p) = ½ pᵀ M⁻¹ p, momenta p ~ N(0, M); the velocity is M⁻¹ p.
    """

    def __init__(self, inv_mass: torch.Tensor):
        self.inv_mass = inv_mass
        self.dense = inv_mass.dim() == 3
        if self.dense:
            chol = torch.linalg.cholesky(inv_mass)  # M⁻¹ = L Lᵀ, so p = L⁻ᵀ ε ~ N(0, M)
            eye = torch.eye(inv_mass.shape[-1], dtype=inv_mass.dtype).expand_as(inv_mass)
            self._chol_inv = torch.linalg.solve_triangular(chol, eye, upper=False)
        else:
            self._sd = inv_mass.rsqrt()

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        eps = torch.randn(self.inv_mass.shape[:2], generator=generator, dtype=self.inv_mass.dtype)
        if self.dense:
            return (eps.unsqueeze(1) @ self._chol_inv).squeeze(1)
        return eps * self._sd

    def velocity(self, p: torch.Tensor) -> torch.Tensor:
        if self.dense:
            return (p.unsqueeze(1) @ self.inv_mass).squeeze(1)
        return p * self.inv_mass


def _velocity(inv_mass, p):
    return (p.unsqueeze(1) @ inv_mass).squeeze(1) if inv_mass.dim() == 3 else p * inv_mass


def _leapfrog(vg, inv_mass, z, p, grad, eps):
    """One leapfrog step with per-chain signed step ``eps`` [C, 1] (Neal 2011, eqs. 5.18–5.20).

    Returns ``z, p, grad, velocity, log density, energy H = K(p) − log π(z)``.
    """
    p = p + (0.5 * eps) * grad
    z = z + eps * _velocity(inv_mass, p)
    lp, grad = vg(z)
    p = p + (0.5 * eps) * grad
    v = _velocity(inv_mass, p)
    return z, p, grad, v, lp, 0.5 * (p * v).sum(-1) - lp


def _is_turning(v_left, v_right, p_left, p_right, rho):
    """Generalised no-U-turn criterion (Betancourt 2017, App. A.4.2, as in NumPyro), bool ``[..., C]``."""
    rho = rho - 0.5 * (p_left + p_right)
    return ((v_left * rho).sum(-1) <= 0) | ((v_right * rho).sum(-1) <= 0)


def _energy_error(energy, energy0):
    delta = energy - energy0
    return torch.where(torch.isnan(delta), torch.full_like(delta, math.inf), delta)


def _nuts_step(vg, max_energy_error: float, inv_mass, eps, energy0, s: dict, u, store, check) -> dict:
    """One leapfrog step inside a NUTS subtree, for all chains.

    ``s`` is the subtree state: current point (z, p, grad, v), ``alive`` (no U-turn or
    divergence yet), ``log_w`` (log Σ exp(H₀ − H) over the subtree), the uniformly
    progressive proposal (``prop_*``), the momentum sum ``rho``, checkpoints ``ck_*``
    ``[K, C, D]`` (momentum, velocity, momentum sum at the start of the aligned block of
    size 2^k), and the statistics.  ``store``/``check`` ``[K]`` select the levels whose
    block starts / ends at this step; ``u`` ``[C]`` are uniforms for the proposal.
    """
    z, p, grad, v, lp, energy = _leapfrog(vg, inv_mass, s["z"], s["p"], s["grad"], eps)
    delta = _energy_error(energy, energy0)
    div = delta > max_energy_error
    alive = s["alive"]
    log_w = torch.logaddexp(s["log_w"], -delta)
    take = u < torch.exp(-delta - log_w)
    t1 = take.unsqueeze(-1)
    rho = s["rho"] + p
    block = rho - s["ck_rho"] + s["ck_p"]
    turning = (_is_turning(s["ck_v"], v, s["ck_p"], p, block) & check.unsqueeze(-1)).any(0)
    st = store.view(-1, 1, 1)
    return {
        "z": z,
        "p": p,
        "grad": grad,
        "v": v,
        "alive": alive & ~(div | turning),
        "log_w": log_w,
        "prop_z": torch.where(t1, z, s["prop_z"]),
        "prop_lp": torch.where(take, lp, s["prop_lp"]),
        "prop_grad": torch.where(t1, grad, s["prop_grad"]),
        "prop_energy": torch.where(take, energy, s["prop_energy"]),
        "rho": rho,
        "ck_p": torch.where(st, p, s["ck_p"]),
        "ck_v": torch.where(st, v, s["ck_v"]),
        "ck_rho": torch.where(st, rho, s["ck_rho"]),
        "accept_sum": s["accept_sum"] + torch.where(alive, torch.exp(torch.clamp(-delta, max=0.0)), 0.0),
        "n_steps": s["n_steps"] + alive.to(lp.dtype),
        "diverging": s["diverging"] | (alive & div),
    }


class Integrator:
    """Leapfrog and NUTS-subtree steps over a potential, eager or ``torch.compile``-d.

    Compilation fuses the batched forward pass, its gradient (``torch.func``) and the
    step's bookkeeping into a few kernels, removing the per-operation overhead that
    dominates small models; it costs a one-off compile (tens of seconds).
    """

    def __init__(self, potential: Potential, compile: bool, max_energy_error: float, max_tree_depth: int = 0):
        self.value_and_grad = potential.value_and_grad
        vg = potential.functional_value_and_grad if compile else potential.value_and_grad
        self.leapfrog = compiled(_leapfrog, compile, vg)
        self.nuts_step = compiled(_nuts_step, compile, vg, max_energy_error)
        self.max_energy_error = max_energy_error
        self.max_tree_depth = max_tree_depth
        levels = torch.arange(1, max_tree_depth + 1)
        self._masks = {(a, b): (levels <= a, levels <= b) for a in range(max_tree_depth + 1) for b in range(max_tree_depth + 1)}

    def block_masks(self, i: int, j: int):
        """Levels k ≤ j whose aligned block of 2^k steps starts (``store``) / ends (``check``) at step ``i``."""
        return self._masks[(min(_trailing_zeros(i), j), min(_trailing_zeros(i + 1), j))]


def _trailing_zeros(i: int) -> int:
    return 64 if i == 0 else (i & -i).bit_length() - 1


def hmc_transition(integrator: Integrator, z, lp, grad, step_size, metric, generator, num_steps: int, step_jitter: float):
    """One static-HMC iteration for all chains; returns the new state and per-chain stats."""
    p = metric.sample(generator)
    energy0 = 0.5 * (p * metric.velocity(p)).sum(-1) - lp
    jitter = 1 + step_jitter * (2 * torch.rand(step_size.shape, generator=generator) - 1)
    eps = (step_size * jitter).unsqueeze(-1)
    cz, cp, cg, clp = z, p, grad, lp
    for _ in range(num_steps):
        cz, cp, cg, _, clp, energy = integrator.leapfrog(metric.inv_mass, cz, cp, cg, eps)
    delta = _energy_error(energy, energy0)
    accept_prob = torch.exp(torch.clamp(-delta, max=0.0))
    accept = torch.rand(accept_prob.shape, generator=generator) < accept_prob
    a1 = accept.unsqueeze(-1)
    stats = {
        "accept_prob": accept_prob,
        "diverging": delta > integrator.max_energy_error,
        "energy": torch.where(accept, energy, energy0),
        "n_steps": torch.full_like(lp, num_steps),
    }
    return torch.where(a1, cz, z), torch.where(accept, clp, lp), torch.where(a1, cg, grad), stats


def nuts_transition(integrator: Integrator, z, lp, grad, step_size, metric, generator):
    """One multinomial NUTS iteration for all chains (see the module docstring)."""
    num_chains, max_depth = z.shape[0], integrator.max_tree_depth
    p = metric.sample(generator)
    v = metric.velocity(p)
    energy0 = 0.5 * (p * v).sum(-1) - lp
    left = right = (z, p, grad, v)
    rho = p
    prop = (z, lp, grad, energy0)
    log_w = torch.zeros_like(lp)  # log Σ exp(H₀ − H) over the trajectory
    done = torch.zeros(num_chains, dtype=torch.bool)
    depth = torch.zeros_like(lp)
    stats = {"accept_sum": torch.zeros_like(lp), "n_steps": torch.zeros_like(lp), "diverging": torch.zeros_like(done)}
    checkpoints = [torch.zeros(max_depth, *z.shape) for _ in range(3)]  # distinct tensors: no aliasing guards
    for j in range(max_depth):
        forward = torch.rand(num_chains, generator=generator) < 0.5
        f1 = forward.unsqueeze(-1)
        cz, cp, cg, cv = (torch.where(f1, r, l) for r, l in zip(right, left))
        eps = torch.where(forward, step_size, -step_size).unsqueeze(-1)
        s = {
            "z": cz, "p": cp, "grad": cg, "v": cv, "alive": ~done, "log_w": torch.full_like(lp, -math.inf),
            "prop_z": z.clone(), "prop_lp": lp.clone(), "prop_grad": grad.clone(), "prop_energy": energy0.clone(),
            "rho": torch.zeros_like(p),
            "ck_p": checkpoints[0], "ck_v": checkpoints[1], "ck_rho": checkpoints[2], **stats,
        }  # fmt: skip
        for i in range(2**j):
            store, check = integrator.block_masks(i, j)
            u = torch.rand(num_chains, generator=generator)
            s = integrator.nuts_step(metric.inv_mass, eps, energy0, s, u, store, check)
            if i % 16 == 15 and not bool(s["alive"].any()):
                break
        stats = {k: s[k] for k in stats}
        ok = s["alive"]
        take = ok & (torch.rand(num_chains, generator=generator) < torch.exp(s["log_w"] - log_w))
        t1 = take.unsqueeze(-1)
        sub_prop = (s["prop_z"], s["prop_lp"], s["prop_grad"], s["prop_energy"])
        prop = tuple(torch.where(t1 if a.dim() == 2 else take, a, b) for a, b in zip(sub_prop, prop))
        log_w = torch.where(ok, torch.logaddexp(log_w, s["log_w"]), log_w)
        new = (s["z"], s["p"], s["grad"], s["v"])
        fr, bk = (ok & forward).unsqueeze(-1), (ok & ~forward).unsqueeze(-1)
        right = tuple(torch.where(fr, a, b) for a, b in zip(new, right))
        left = tuple(torch.where(bk, a, b) for a, b in zip(new, left))
        rho = torch.where(ok.unsqueeze(-1), rho + s["rho"], rho)
        depth = torch.where(done, depth, torch.full_like(depth, j + 1))
        done = done | ~ok | _is_turning(left[3], right[3], left[1], right[1], rho)
        if bool(done.all()):
            break
    stats = {
        "accept_prob": stats["accept_sum"] / stats["n_steps"].clamp(min=1),
        "diverging": stats["diverging"],
        "energy": prop[3],
        "tree_depth": depth,
        "n_steps": stats["n_steps"],
    }
    return prop[0], prop[1], prop[2], stats


# ---------------------------------------------------------------------- warm-up
def adaptation_windows(warmup: int, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25) -> list:
    """Stan's mass-matrix windows ``[(start, end)]`` (iterations); none below 20 warm-up steps."""
    if warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > warmup:
        init_buffer, term_buffer = int(0.15 * warmup), int(0.1 * warmup)
        base_window = warmup - init_buffer - term_buffer
    windows, start, size, last = [], init_buffer, base_window, warmup - term_buffer
    while start < last:
        end = start + size
        if end + 2 * size > last:
            end = last
        windows.append((start, end))
        start, size = end, 2 * size
    return windows


class DualAveraging:
    """Per-chain step-size adaptation (Hoffman & Gelman 2014, Alg. 5, eqs. 6 and the x̄ update)."""

    def __init__(self, step_size: torch.Tensor, target: float, gamma=0.05, t0=10.0, kappa=0.75):
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.restart(step_size)

    def restart(self, step_size: torch.Tensor):
        self.mu = torch.log(10 * step_size)
        self.log_step = torch.log(step_size)
        self.log_avg = torch.zeros_like(step_size)
        self.h_bar = torch.zeros_like(step_size)
        self.t = 0

    def update(self, accept_prob: torch.Tensor) -> torch.Tensor:
        self.t += 1
        eta = 1.0 / (self.t + self.t0)
        accept_prob = torch.nan_to_num(accept_prob, nan=0.0)
        self.h_bar = (1 - eta) * self.h_bar + eta * (self.target - accept_prob)
        self.log_step = self.mu - math.sqrt(self.t) / self.gamma * self.h_bar
        weight = self.t ** (-self.kappa)
        self.log_avg = weight * self.log_step + (1 - weight) * self.log_avg
        return self.log_step.exp()

    @property
    def final(self) -> torch.Tensor:
        return self.log_avg.exp()


def find_step_size(vg, z, lp, grad, step_size, metric, generator, max_doublings: int = 40) -> torch.Tensor:
    """Per-chain initial step size: double or halve until the one-step acceptance crosses ½ (Hoffman & Gelman 2014, Alg. 4)."""
    log_half = math.log(0.5)

    def log_ratio(eps):
        p = metric.sample(generator)
        energy0 = 0.5 * (p * metric.velocity(p)).sum(-1) - lp
        energy = _leapfrog(vg, metric.inv_mass, z, p, grad, eps.unsqueeze(-1))[-1]
        return -_energy_error(energy, energy0)

    up = log_ratio(step_size) > log_half
    active = torch.ones_like(up)
    for _ in range(max_doublings):
        trial = torch.where(up, step_size * 2, step_size / 2)
        crossed = (log_ratio(trial) > log_half) != up
        step_size = torch.where(active, trial, step_size)
        active = active & ~crossed
        if not bool(active.any()):
            break
    return step_size


class Welford:
    """Running per-chain mean and (co)variance of ``[C, D]`` points."""

    def __init__(self, num_chains: int, dim: int, dense: bool):
        self.n, self.dense = 0, dense
        self.mean = torch.zeros(num_chains, dim)
        self.m2 = torch.zeros(num_chains, dim, dim) if dense else torch.zeros(num_chains, dim)

    def update(self, z):
        self.n += 1
        delta = z - self.mean
        self.mean = self.mean + delta / self.n
        after = z - self.mean
        self.m2 = self.m2 + (delta.unsqueeze(-1) * after.unsqueeze(-2) if self.dense else delta * after)

    def inverse_mass(self, pooled: bool) -> torch.Tensor:
        """Regularised (co)variance per chain, or of all chains' points pooled (same for every chain)."""
        m2, mean, n = self.m2, self.mean, self.n
        if pooled:  # Σ_c [M2_c + n (μ_c − μ)(μ_c − μ)ᵀ] over C·n points
            spread = mean - mean.mean(0)
            extra = spread.unsqueeze(-1) * spread.unsqueeze(-2) if self.dense else spread * spread
            m2 = (m2 + n * extra).sum(0, keepdim=True).expand_as(m2)
            n = n * mean.shape[0]
        cov = m2 / max(n - 1, 1)
        shrink = 1e-3 * 5.0 / (n + 5.0)
        if self.dense:
            return (n / (n + 5.0)) * cov + shrink * torch.eye(cov.shape[-1])
        return (n / (n + 5.0)) * cov + shrink


# ---------------------------------------------------------------------- driver
def sample_chains(potential: Potential, z0: torch.Tensor, transition: Callable, config: ChainConfig, generator, progress: bool, name: str):
    """Warm up and sample all chains; returns ``(z draws [C, S, D], stats {name: [C, S]}, record)``.

    ``transition(z, lp, grad, step_size, metric, generator) -> (z, lp, grad, stats)``.
    """
    vg = potential.value_and_grad
    num_chains, dim = z0.shape
    z = z0
    lp, grad = vg(z)
    if not bool(torch.isfinite(lp).all() and torch.isfinite(grad).all()):
        raise ValueError(
            f"the log density or its gradient is not finite at the start of chains "
            f"{(~torch.isfinite(lp)).nonzero().flatten().tolist()}; try init='map', a smaller init_jitter or check the data"
        )
    inv_mass = torch.eye(dim).expand(num_chains, dim, dim).clone() if config.dense_mass else torch.ones(num_chains, dim)
    metric = Metric(inv_mass)
    step_size = torch.full((num_chains,), float(config.step_size))
    if config.adapt_step_size and config.warmup_steps > 0:
        step_size = find_step_size(vg, z, lp, grad, step_size, metric, generator)
    adapt = DualAveraging(step_size, config.target_accept)
    windows = adaptation_windows(config.warmup_steps) if config.adapt_mass else []
    window_ends = {end: start for start, end in windows}
    welford = Welford(num_chains, dim, config.dense_mass)
    total = config.warmup_steps + config.num_samples * config.thin
    keep = torch.empty(num_chains, config.num_samples, dim)
    stats = {}
    warmup_divergences = 0
    bar = tqdm(range(total), desc=f"{name} ({num_chains} chains, {dim} dims)", disable=not progress)
    started, warmup_seconds = time.perf_counter(), 0.0
    for it in bar:
        z, lp, grad, info = transition(z, lp, grad, step_size, metric, generator)
        if it < config.warmup_steps:
            warmup_divergences += int(info["diverging"].sum())
            if config.adapt_step_size:
                step_size = adapt.update(info["accept_prob"])
            if any(start <= it < end for start, end in windows):
                welford.update(z)
            if it + 1 in window_ends:
                metric = Metric(welford.inverse_mass(config.pool_adaptation))
                welford = Welford(num_chains, dim, config.dense_mass)
                if config.adapt_step_size:
                    step_size = find_step_size(vg, z, lp, grad, step_size, metric, generator)
                    adapt.restart(step_size)
            if it + 1 == config.warmup_steps:
                if config.adapt_step_size:
                    step_size = adapt.final
                warmup_seconds = time.perf_counter() - started
            continue
        draw, rest = divmod(it - config.warmup_steps, config.thin)
        if rest != config.thin - 1:
            continue
        keep[:, draw] = z
        info = {**info, "lp": lp, "step_size": step_size}
        for key, value in info.items():
            stats.setdefault(key, torch.empty(num_chains, config.num_samples, dtype=value.dtype))[:, draw] = value
        if progress and draw % 10 == 0:
            bar.set_postfix(step=f"{float(step_size.mean()):.3g}", div=int(stats["diverging"][:, : draw + 1].sum()))
    stats["acceptance_rate"] = stats.pop("accept_prob")
    for key in ("tree_depth", "n_steps"):
        if key in stats:
            stats[key] = stats[key].long()
    record = {
        "step_size": step_size.tolist(),
        "inverse_mass_mean": metric.inv_mass.diagonal(dim1=-2, dim2=-1).mean(-1).tolist()
        if metric.dense
        else metric.inv_mass.mean(-1).tolist(),
        "warmup_divergences": warmup_divergences,
        "adaptation_windows": windows,
        "warmup_seconds": warmup_seconds,
        "sampling_seconds": time.perf_counter() - started - warmup_seconds,
    }
    return keep, stats, record


class HMCBackend(Backend):
    """Static HMC over the random sites (see the module docstring)."""

    name = "hmc"
    Config = HMCConfig

    def _transition(self, potential, config):
        integrator = Integrator(potential, config.compile, config.max_energy_error)
        return partial(hmc_transition, integrator, num_steps=config.num_steps, step_jitter=config.step_jitter)

    def run(self, bnn, x, y, config, seed: int, progress: bool) -> SamplePosterior:
        started = time.perf_counter()
        pyro.set_rng_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        potential = Potential(bnn, x, y)
        z0, init_record = initial_point(potential, config.init, config.map_steps, config.map_lr, progress, config.compile)
        if not bool(torch.isfinite(z0).all()):
            raise NonFiniteLossError(0, "the MAP initialisation", None)
        jitter = config.init_jitter * torch.randn(config.num_chains, potential.dim, generator=generator)
        with torch.no_grad(), frozen_deterministic(bnn):
            z, stats, record = sample_chains(
                potential, z0 + jitter, self._transition(potential, config), config, generator, progress, self.name
            )
        divergences = int(stats["diverging"].sum())
        if divergences:
            warnings.warn(
                f"{self.name}: {divergences} of {stats['diverging'].numel()} post-warm-up transitions diverged; "
                f"the draws may be biased — raise target_accept (now {config.target_accept}) or reparameterise",
                RuntimeWarning,
                stacklevel=3,
            )
        saturated = tree_depth_saturation(stats["tree_depth"], config.max_tree_depth) if "tree_depth" in stats else 0.0
        if saturated:
            warnings.warn(
                f"{self.name}: {saturated:.0%} of the post-warm-up transitions hit the maximum tree depth "
                f"{config.max_tree_depth}: their trajectories were cut short, so the chains move slowly "
                f"(expect low ESS and high R-hat); raise max_tree_depth, or simplify / reparameterise a badly "
                f"conditioned posterior (docs/mcmc.md, 'When NUTS does not mix')",
                RuntimeWarning,
                stacklevel=3,
            )
        info = {
            "backend": self.name,
            "config": asdict(config),
            "seed": seed,
            "num_data": x.shape[0],
            "num_chains": config.num_chains,
            "num_random": potential.dim,
            "divergences": divergences,
            "tree_depth_saturated": saturated,
            **init_record,
            **record,
            "fit_seconds": time.perf_counter() - started,
        }
        return SamplePosterior(bnn, potential.draws(z), sample_stats=stats, info=info)


class NUTSBackend(HMCBackend):
    """The No-U-Turn sampler over the random sites (see the module docstring)."""

    name = "nuts"
    Config = NUTSConfig

    def _transition(self, potential, config):
        return partial(nuts_transition, Integrator(potential, config.compile, config.max_energy_error, config.max_tree_depth))
