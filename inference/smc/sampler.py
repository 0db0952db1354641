"""Tempered sequential Monte Carlo: the stage, the driver loop and the log evidence.

The sampler moves ``N`` particles from the prior p(θ) (β = 0) to the posterior p(θ | y) (β = 1) through the
tempered targets π_β(θ) ∝ p(θ) p(y | θ)^β (Neal 2001's annealing path; the SMC sampler of Del Moral, Doucet &
Jasra 2006 and of Chopin 2002).  One stage (:func:`build_smc`'s ``step``) from equally weighted particles at β:

1. the next β' by bisection on the conditional ESS (:func:`~inference.smc.tempering.next_temperature`, Jasra et
   al. 2011; Zhou, Johansen & Aston 2016), and the incremental weights wᵢ = exp((β' − β) ℓᵢ);
2. the log evidence gains log (1/N) Σᵢ wᵢ (so log Z = Σ over the stages is an unbiased estimate of Z = ∫ p(θ)
   p(y | θ) dθ on the natural scale; Del Moral, Doucet & Jasra 2006, §3.2.1);
3. the metric from the weighted population (:func:`~inference.smc.mutation.population_metric`), then systematic
   resampling (:func:`~inference.smc.resampling.systematic_resample`) to equal weights;
4. ``num_moves`` HMC moves on π_β' (:func:`~inference.smc.mutation.mutate`, Buchholz, Chopin & Jacob 2021), the
   step size carried over from the previous stage and adapted from the acceptance.

The run ends after the stage that reaches β = 1: its particles are equally weighted draws from the posterior.
Everything is vectorised over the particles: a log density call evaluates all ``N`` (``[N, D] -> [N]``).
"""
from __future__ import annotations

import math
import time
from typing import Callable, NamedTuple

import torch

from zoo.progress import tqdm

from inference.smc.mutation import mutate, population_metric
from inference.smc.resampling import effective_sample_size, systematic_resample
from inference.smc.tempering import log_evidence_increment, next_temperature

__all__ = ["SMCState", "SMCRun", "build_smc", "run_smc", "check_smc_options"]


class SMCState(NamedTuple):
    """The population between stages (equally weighted).

    Attributes:
        z: particles ``[N, D]`` (unconstrained coordinates).
        log_likelihood: ℓᵢ = log p(y | θᵢ) ``[N]``.
        beta: the inverse temperature they target.
        log_evidence: log Ẑ_β, the running estimate of log ∫ p(θ) p(y | θ)^β dθ (float).
        step_size: the HMC step size the next stage starts from.
    """

    z: torch.Tensor
    log_likelihood: torch.Tensor
    beta: float
    log_evidence: float
    step_size: float


class SMCRun(NamedTuple):
    """What :func:`run_smc` returns: the final particles ``z`` ``[N, D]`` (equal weights, β = 1), their
    ``log_likelihood`` ``[N]``, ``log_evidence`` (log Ẑ), and ``stages``: one dict per stage (``beta``, ``ess``
    (the ESS of the stage's weights before resampling), ``acceptance`` (mean per move), ``divergences``,
    ``step_size``, ``leapfrog_steps`` (per move), ``log_evidence``, ``seconds``)."""

    z: torch.Tensor
    log_likelihood: torch.Tensor
    log_evidence: float
    stages: list


def check_smc_options(num_particles: int, target_ess: float, num_moves: int, num_leapfrog: int,
                      target_accept: float, step_size: float, step_jitter: float, max_stages: int,
                      trajectory_length=None) -> None:
    """A ``ValueError`` naming the first invalid option (before any work is done)."""
    checks = (
        (num_particles >= 2, f"num_particles must be at least 2 (resampling needs a population), got {num_particles}"),
        (0.0 < target_ess < 1.0, f"target_ess (the conditional ESS fraction) must lie in (0, 1), got {target_ess}"),
        (num_moves >= 1, f"num_moves (HMC moves per stage) must be at least 1, got {num_moves}"),
        (num_leapfrog >= 1, f"num_leapfrog (leapfrog steps per move) must be at least 1, got {num_leapfrog}"),
        (0.0 < target_accept < 1.0, f"target_accept must lie in (0, 1), got {target_accept}"),
        (step_size > 0.0, f"step_size must be positive, got {step_size}"),
        (0.0 <= step_jitter < 1.0, f"step_jitter must lie in [0, 1), got {step_jitter}"),
        (max_stages >= 1, f"max_stages must be at least 1, got {max_stages}"),
        (trajectory_length is None or trajectory_length > 0,
         f"trajectory_length must be positive (or None: always num_leapfrog steps), got {trajectory_length}"),
    )
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def build_smc(prior_and_likelihood: Callable, *, target_ess: float = 0.5, num_moves: int = 5, num_leapfrog: int = 10,
              target_accept: float = 0.8, step_size: float = 0.5, step_jitter: float = 0.2,
              max_energy_error: float = 1000.0, trajectory_length=None) -> tuple[Callable, Callable]:
    """``(init, step)`` of tempered SMC (module docstring) on ``prior_and_likelihood(z [N, D]) -> (log prior
    [N], log-likelihood [N])`` (the log prior with the log-Jacobian of the unconstrained coordinates).

    ``init(z [N, D]) -> SMCState`` takes prior draws; ``step(state, generator) -> (state, record)`` runs one stage.
    Each HMC move takes ``num_leapfrog`` leapfrog steps, or with ``trajectory_length`` τ min(``num_leapfrog``,
    ⌈τ / ε⌉) (:func:`~inference.smc.mutation.num_leapfrog_steps`).
    """
    check_smc_options(2, target_ess, num_moves, num_leapfrog, target_accept, step_size, step_jitter, 1,
                      trajectory_length)

    def init(z: torch.Tensor) -> SMCState:
        with torch.no_grad():
            _, log_lik = prior_and_likelihood(z)
        return SMCState(z, log_lik, 0.0, 0.0, float(step_size))

    def step(state: SMCState, generator: torch.Generator) -> tuple[SMCState, dict]:
        started = time.perf_counter()
        flat = torch.zeros_like(state.log_likelihood)  # equally weighted after the last resampling
        beta = next_temperature(flat, state.log_likelihood, state.beta, target_ess)
        delta = beta - state.beta
        ll = torch.nan_to_num(state.log_likelihood, nan=-math.inf, neginf=-math.inf)
        log_weights = torch.where(torch.isneginf(ll), ll, delta * ll)
        log_evidence = state.log_evidence + float(log_evidence_increment(flat, ll, delta))
        metric = population_metric(state.z, log_weights)
        ancestors = systematic_resample(log_weights, generator)
        z, moves = mutate(prior_and_likelihood, state.z[ancestors], beta, metric, state.step_size, generator,
                          num_moves=num_moves, num_leapfrog=num_leapfrog, target_accept=target_accept,
                          step_jitter=step_jitter, max_energy_error=max_energy_error,
                          trajectory_length=trajectory_length)
        with torch.no_grad():
            _, log_lik = prior_and_likelihood(z)
        record = {"beta": beta, "ess": effective_sample_size(log_weights), "acceptance": moves.acceptance,
                  "divergences": moves.divergences, "step_size": moves.step_size, "leapfrog_steps": moves.leapfrog_steps,
                  "log_evidence": log_evidence,
                  "seconds": time.perf_counter() - started}
        return SMCState(z, log_lik, beta, log_evidence, moves.step_size), record

    return init, step


def run_smc(init: Callable, step: Callable, z0: torch.Tensor, generator: torch.Generator, *, max_stages: int = 1000,
            progress: bool = True, desc: str = "smc") -> SMCRun:
    """Stages of ``step`` from the prior draws ``z0`` ``[N, D]`` until β = 1, with a progress bar (the stage, β and
    the last acceptance) unless ``progress=False``.

    Raises:
        RuntimeError: β = 1 not reached within ``max_stages`` stages.
    """
    state, stages = init(z0), []
    with tqdm(total=None, desc=desc, unit="stage", disable=not progress, leave=False) as bar:
        while state.beta < 1.0:
            if len(stages) >= max_stages:
                raise RuntimeError(f"{desc}: β = {state.beta:.3g} < 1 after max_stages = {max_stages} stages; raise "
                                   f"max_stages or target_ess (larger temperature steps)")
            state, record = step(state, generator)
            stages.append(record)
            bar.update(1)
            bar.set_postfix(beta=f"{state.beta:.3g}", accept=f"{record['acceptance'][-1]:.2f}",
                            eps=f"{state.step_size:.3g}")
    return SMCRun(state.z, state.log_likelihood, state.log_evidence, stages)
