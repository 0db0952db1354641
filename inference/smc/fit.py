"""Tempered SMC on a :class:`~zoo.bnn.BayesianNetwork`: prior draws, the run, and a posterior of its particles.

:func:`smc_posterior` samples p(θ | y) of exactly the model the other samplers fit: θ are the random weights and
the likelihood's latents (the noise precision), in the unconstrained coordinates of
:class:`inference.optim.potential.Potential`, whose :meth:`~inference.optim.potential.Potential.prior_and_likelihood`
gives the two terms of its log density, batched over all ``N`` particles (one ``vmap``-ed forward and reverse
pass).  The initial particles are prior draws θ ~ p(θ) mapped to z = T⁻¹(θ), which are draws of the β = 0
target p(T(z)) abs(det ∂T/∂z).  The run (:func:`inference.smc.sampler.run_smc`) is seeded from its own
``torch.Generator`` (the prior draws from a forked global RNG seeded from it, restored afterwards), runs on the
model's device and dtype, and leaves the network's deterministic parameters as they are.

The result is a :class:`~inference.posterior.SamplePosterior` of one "chain" of ``N`` equally weighted draws
``{site: [1, N, ...]}``, in a random order (the particles are exchangeable; resampling leaves copies adjacent), and
``info`` records the run: the inverse temperatures, the ESS of every stage's weights (``final_ess``: the last
stage's), the acceptance, step sizes, divergences and the log evidence log Ẑ (natural log, the model's units).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from inference.optim.potential import Potential, frozen_deterministic
from inference.posterior import SamplePosterior
from inference.smc.sampler import build_smc, check_smc_options, run_smc

__all__ = ["SMCConfig", "prior_particles", "smc_posterior"]


@dataclass(frozen=True)
class SMCConfig:
    """Options of tempered SMC (:mod:`inference.smc.sampler`).

    Attributes:
        num_particles: N, the population (the draws returned).
        target_ess: ρ, the conditional ESS fraction each temperature step keeps (Zhou et al. 2016).
        num_moves: HMC moves per particle per stage.
        num_leapfrog: leapfrog steps per HMC move (with ``trajectory_length``: the most).
        trajectory_length: τ, the integration time ε L of a move in units of the population's sd: L = min(
            ``num_leapfrog``, ⌈τ / ε⌉) (:func:`inference.smc.mutation.num_leapfrog_steps`); ``None``: L fixed.
        target_accept: the acceptance the step size is adapted towards.
        step_size: the first stage's step size (in units of the population's standard deviation).
        step_jitter: j of the per-particle step ε (1 + j u), u ~ U(−1, 1).
        max_stages: a run that has not reached β = 1 after this many stages stops with an error.
    """

    num_particles: int = 1024
    target_ess: float = 0.5
    num_moves: int = 5
    num_leapfrog: int = 10
    target_accept: float = 0.8
    step_size: float = 0.5
    step_jitter: float = 0.2
    max_stages: int = 1000
    trajectory_length: Optional[float] = None

    def __post_init__(self):
        check_smc_options(self.num_particles, self.target_ess, self.num_moves, self.num_leapfrog,
                          self.target_accept, self.step_size, self.step_jitter, self.max_stages,
                          self.trajectory_length)


def prior_particles(potential: Potential, num_particles: int, generator: torch.Generator) -> torch.Tensor:
    """``[N, D]``: N prior draws of every random site, in the potential's unconstrained coordinates.  The sites'
    distributions sample from the global RNG, so it is forked, seeded from ``generator`` and restored."""
    device = potential.device
    seed = int(torch.randint(2**62, (), generator=generator, device=generator.device))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        values = {name: prior.sample((num_particles,)) for name, prior in potential.priors.items()}
    return potential.pack(values)


def smc_posterior(bnn, x: torch.Tensor, y: torch.Tensor, config: SMCConfig, seed: int,
                  progress: bool = True, desc: str = "smc") -> SamplePosterior:
    """One tempered SMC run on the posterior of ``bnn`` given ``(x [N, ...], y [N, T] or [N])`` (module
    docstring) with ``config``'s options, seeded by ``seed``.

    Raises:
        ValueError: the model has no random site (:class:`~inference.optim.potential.Potential`).
        RuntimeError: β = 1 not reached within ``config.max_stages`` stages.
    """
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(int(seed))
    potential = Potential(bnn, x, y)
    init, step = build_smc(potential.prior_and_likelihood, target_ess=config.target_ess, num_moves=config.num_moves,
                           num_leapfrog=config.num_leapfrog, target_accept=config.target_accept,
                           step_size=config.step_size, step_jitter=config.step_jitter,
                           trajectory_length=config.trajectory_length)
    with frozen_deterministic(bnn):
        z0 = prior_particles(potential, config.num_particles, generator)
        run = run_smc(init, step, z0, generator, max_stages=config.max_stages, progress=progress,
                      desc=f"{desc} ({config.num_particles} particles, {potential.dim} dims)")
    order = torch.randperm(config.num_particles, generator=generator).to(run.z.device)
    z = run.z[order].detach()
    stages = run.stages
    info = {
        "backend": "smc", "config": asdict(config), "seed": int(seed), "num_data": int(x.shape[0]),
        "num_random": potential.dim, "fit_seconds": time.perf_counter() - started,
        "log_evidence": run.log_evidence, "num_stages": len(stages), "final_ess": stages[-1]["ess"],
        "betas": [s["beta"] for s in stages], "ess": [s["ess"] for s in stages],
        "acceptance": [sum(s["acceptance"]) / len(s["acceptance"]) for s in stages],
        "step_size": [s["step_size"] for s in stages], "divergences": sum(s["divergences"] for s in stages),
        "leapfrog_steps": sum(sum(s["leapfrog_steps"]) for s in stages),  # per particle, the whole run
    }
    stats = {"log_likelihood_sum": run.log_likelihood[order].unsqueeze(0)}  # Σ_n log p(y_n | θ) per draw, [1, N]
    return SamplePosterior(bnn, potential.draws(z.unsqueeze(0)), sample_stats=stats, info=info)
