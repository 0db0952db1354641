"""The ``hmc`` and ``nuts`` backends: HMC and NUTS over exactly a model's random sites, all chains in lockstep.

Both backends sample ``π(z)`` of :class:`inference.optim.potential.Potential`: the random
weights and likelihood latents in unconstrained coordinates; deterministic parameters
stay at the network's values (after the optional MAP initialisation, which fits them
jointly when the model trains them).  The ``C`` chains are one ``[C, D]`` tensor, so
each leapfrog step costs one batched forward/reverse pass for all chains.

This module holds the options and assembles the parts of :mod:`inference.mcmc`:

* ``hmc`` — static HMC (Neal 2011) with ``num_steps`` jittered leapfrog steps
  (:func:`inference.mcmc.kernels.build_hmc`).
* ``nuts`` — multinomial NUTS with the generalised U-turn criterion (Hoffman & Gelman
  2014; Betancourt 2017), iterative tree building (:mod:`inference.mcmc.nuts`).
* the output module on cached features — :mod:`inference.optim.output_head`: when the random weights are
  the module whose output the network returns, its input is computed once after the start and each
  gradient runs that module only (the same density);
* the start — :func:`inference.optim.start.initial_point`, jittered per chain
  (:func:`inference.mcmc.chains.jittered_starts`).
* the time budget — :func:`inference.mcmc.budget.time_budget` stops a fit projected past ``time_budget``;
* convergence — :func:`inference.mcmc.convergence.chain_convergence`: R-hat / ESS of ``f_mean``,
  ``log_joint`` and the latents in ``post.info`` (with a warning when the chains have not mixed);
* warm-up and sampling — :func:`inference.mcmc.chains.sample_chains`: Stan's windowed adaptation
  (:func:`inference.mcmc.adaptation.window_adaptation`: dual-averaging step size, Welford (co)variance
  metric in doubling windows; per-chain, fixed after warm-up, so the draws are exact) on the loop of
  :func:`inference.mcmc.driver.run_chains`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Literal, Optional, Union

import pyro
import torch

from inference.mcmc.adaptation import metric_choice
from inference.mcmc.budget import DEFAULT_TIME_BUDGET, WINDOW, sampler_advice, time_budget
from inference.mcmc.chains import jittered_starts, last_layer_dim, sample_chains, sampling_warnings
from inference.mcmc.convergence import chain_convergence
from inference.mcmc.initial_metric import CURVATURE_MAX_DIM, curvature_metric, hessian
from inference.mcmc.compilation import COMPILE_MODES, LazyCompile, compile_blocker, unit_key
from inference.mcmc.kernels import build_hmc, build_nuts
from inference.posterior import SamplePosterior
from inference.optim.map import run_info
from inference.optim.output_head import head_module
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.start import INIT_STRATEGIES, initial_point
from inference.backends.base import Backend, NonFiniteLossError

__all__ = ["ChainConfig", "HMCConfig", "NUTSConfig", "HMCBackend", "NUTSBackend"]


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
        adapt_step_size / adapt_mass: switch the warm-up adaptations; ``adapt_mass="auto"`` (default) re-estimates
            the metric from the draws in Stan's windows, except a dense metric started from the curvature of
            an output layer, which is kept (:func:`~inference.mcmc.adaptation.metric_choice`).
        dense_mass: adapt a dense (``True``) or a diagonal (``False``) inverse mass matrix; ``"auto"`` (default):
            dense for up to 200 dimensions when the last adaptation window holds at least 2 draws per
            dimension over all chains, or the metric starts from the curvature of an output layer; else
            diagonal (:func:`~inference.mcmc.adaptation.metric_choice`).
        max_energy_error: an energy error above this marks a divergent transition.
        init: ``"map"`` (the ``map`` backend's MAP fit first) or ``"current"`` (the network's weights).
        map_steps / map_lr: the MAP fit's budget of minibatch Adam steps and its learning rate
            (:func:`inference.optim.start.initial_point`).
        init_jitter: sd of the Gaussian jitter added to the start of every chain
            (unconstrained coordinates).
        init_metric: the warm-up's first metric: ``"curvature"`` (default), the inverse of the Hessian of −log π at
            the start (eigenvalues' absolute values, floored; its diagonal for a diagonal metric;
            :mod:`inference.mcmc.initial_metric`) for up to 2000 dimensions, else the identity; ``"identity"``:
            M⁻¹ = I, as Stan and NumPyro.
        pool_adaptation: estimate one inverse mass matrix from the warm-up draws of all
            chains together (C times the draws of a per-chain estimate) instead of one per chain;
            ``"auto"`` (default): pooled for a dense metric, per chain for a diagonal one.
        compile: ``torch.compile`` the NUTS subtree / HMC leapfrog step with the potential and its
            gradient: ``"auto"`` (compile once the measured eager cost of the remaining iterations
            exceeds the compile time, :class:`inference.mcmc.compilation.LazyCompile`), ``True``
            (from the first iteration) or ``False``.  A network torch.compile cannot trace (a
            recurrent layer, no ``vmap`` rule) runs eagerly; a failed compile falls back to eager.
        time_budget: seconds the whole fit may take (:data:`~inference.mcmc.budget.DEFAULT_TIME_BUDGET`, 120):
            from the first iterations on, the fit's total wall time is projected, and a fit projected past
            the budget stops with :class:`~inference.mcmc.budget.TimeBudgetExceeded`, whose message gives the
            projection and what to change (:func:`~inference.mcmc.budget.time_budget`); ``None``: no budget.
    """

    num_chains: int = 4
    warmup_steps: int = 200
    num_samples: int = 200
    thin: int = 1
    step_size: float = 0.01
    target_accept: float = 0.8
    adapt_step_size: bool = True
    adapt_mass: Union[bool, Literal["auto"]] = "auto"
    dense_mass: Union[bool, Literal["auto"]] = "auto"
    max_energy_error: float = 1000.0
    init: str = "map"
    map_steps: int = 2000
    map_lr: float = 0.01
    init_jitter: float = 0.01
    compile: Union[bool, Literal["auto"]] = "auto"
    pool_adaptation: Union[bool, Literal["auto"]] = "auto"
    init_metric: Literal["curvature", "identity"] = "curvature"
    time_budget: Optional[float] = DEFAULT_TIME_BUDGET

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
        for name in ("init_jitter",):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative number, got {getattr(self, name)}")
        if self.time_budget is not None and not (math.isfinite(float(self.time_budget)) and self.time_budget > 0):
            raise ValueError(f"time_budget must be a positive number of seconds or None (no budget), got {self.time_budget}")
        if self.init_metric not in ("curvature", "identity"):
            raise ValueError(f"init_metric must be 'curvature' or 'identity', got {self.init_metric!r}")
        for name in ("dense_mass", "pool_adaptation", "adapt_mass"):
            if getattr(self, name) not in (True, False, "auto"):
                raise ValueError(f"{name} must be true, false or 'auto', got {getattr(self, name)!r}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be true, false or 'auto', got {self.compile!r}")
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


class HMCBackend(Backend):
    """Static HMC over the random sites (see the module docstring)."""

    name = "hmc"
    Config = HMCConfig

    unit = "leapfrog step"

    def _transition(self, potential, config, compile: bool):
        return build_hmc(potential, compile, config.max_energy_error, config.num_steps, config.step_jitter)

    def _advice(self, config, bnn, x, dim: int, projection) -> list:
        """What would bring the fit within ``config.time_budget`` (:func:`~inference.mcmc.budget.sampler_advice`)."""
        return sampler_advice(projection, counts={"warmup_steps": config.warmup_steps, "num_samples": config.num_samples},
                              num_chains=config.num_chains, dim=dim, last_dim=last_layer_dim(bnn, x),
                              max_tree_depth=getattr(config, "max_tree_depth", None),
                              num_steps=getattr(config, "num_steps", None))

    @staticmethod
    def _metric(potential, z0: torch.Tensor, config, head: Optional[str]):
        """``(plan, metric, record)``: the :func:`~inference.mcmc.adaptation.metric_choice` of ``config``, the warm-up's
        first metric (from the curvature at the start ``z0`` ``[D]``, or ``None``: the identity) and what to record."""
        started = time.perf_counter()
        curvature = config.init_metric == "curvature" and potential.dim <= CURVATURE_MAX_DIM
        plan = metric_choice(config.dense_mass, config.pool_adaptation, config.adapt_mass, potential.dim,
                             config.warmup_steps, config.num_chains, curvature=curvature, output_layer=head is not None)
        metric = curvature_metric(hessian(potential.log_density, z0), config.num_chains, plan.dense) if curvature else None
        record = {**plan._asdict(), "initial": "curvature" if curvature else "identity",
                  "initial_seconds": time.perf_counter() - started}
        return plan, metric, record

    def run(self, bnn, x, y, config, seed: int, progress: bool) -> SamplePosterior:
        started = time.perf_counter()
        pyro.set_rng_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        potential = Potential(bnn, x, y)
        head, no_head = head_module(bnn, x)  # sampled on cached features when the random weights are the output module
        transition = LazyCompile(  # before the start: on a CPU it begins warming the compiler in the background
            partial(self._transition, potential, config), config.compile,
            config.warmup_steps + config.num_samples * config.thin,
            unit_key(self.name, potential, config.num_chains, head), compile_blocker(bnn, head), progress,
            desc=f"{self.name}: compiling the {self.unit} (once per fit)", device=potential.device,
        )  # fmt: skip
        z0, init_record = initial_point(potential, config.init, config.map_steps, config.map_lr, progress, seed)
        if not bool(torch.isfinite(z0).all()):
            raise NonFiniteLossError(0, "the MAP initialisation", None)
        starts = jittered_starts(z0, config.num_chains, config.init_jitter, generator)
        total = config.warmup_steps + config.num_samples * config.thin
        monitor = None if config.time_budget is None else time_budget(
            config.time_budget, total, started, name=self.name, check_until=config.warmup_steps + WINDOW,
            advise=partial(self._advice, config, bnn, x, potential.dim), forecast=transition.forecast,
        )  # fmt: skip
        with torch.no_grad(), frozen_deterministic(bnn), potential.cached_head(head):
            plan, metric, metric_record = self._metric(potential, z0, config, head)
            z, stats, record = sample_chains(
                potential, starts, transition, generator, progress, self.name, warmup_steps=config.warmup_steps,
                num_samples=config.num_samples, thin=config.thin, step_size=config.step_size,
                target_accept=config.target_accept, dense_mass=plan.dense,
                pool_adaptation=plan.pooled, adapt_step_size=config.adapt_step_size,
                adapt_mass=plan.estimate, monitor=monitor, initial_metric=metric,
            )  # fmt: skip
            divergences, saturated = sampling_warnings(self.name, stats, config.target_accept,
                                                       getattr(config, "max_tree_depth", None), stacklevel=3)
            convergence = chain_convergence(self.name, potential, z, log_density=stats["lp"],
                                            tree_depth_saturated=saturated, stacklevel=3)
        info = run_info(self.name, config, seed, x, started, **{
            "num_chains": config.num_chains,
            "num_random": potential.dim,
            "divergences": divergences,
            "tree_depth_saturated": saturated,
            "output_head": head,
            "metric": metric_record,
            "output_head_skipped": no_head,
            **convergence,
            **init_record,
            **record,
            **transition.record,
        })
        return SamplePosterior(bnn, potential.draws(z), sample_stats=stats, info=info)


class NUTSBackend(HMCBackend):
    """The No-U-Turn sampler over the random sites (see the module docstring)."""

    name = "nuts"
    Config = NUTSConfig

    unit = "subtree"

    def _transition(self, potential, config, compile: bool):
        return build_nuts(potential, compile, config.max_energy_error, config.max_tree_depth)
