"""The SG-MCMC backends: ``sgld``, ``psgld``, ``sghmc`` and ``csgmcmc``.

All four sample π(z) of :class:`inference.optim.potential.Potential` (random sites in
unconstrained coordinates, deterministic parameters at the network's values) from
minibatch gradients g = ∇ log π̃(z) with the likelihood scaled by N/n.  The ``C`` chains
are one ``[C, D]`` tensor and share each minibatch (one batched forward pass per step);
their injected noise is independent.  This module holds the options and assembles the
kernels of :mod:`inference.sgmcmc.updates` (SGLD, Welling & Teh 2011; pSGLD, Li et al. 2016;
SGHMC, Chen et al. 2014; cyclical SG-MCMC, Zhang et al. 2020) with the runner of
:mod:`inference.sgmcmc.runner` (the loop of :func:`inference.mcmc.driver.run_chains`):

* ``sgld`` / ``psgld`` / ``sghmc``: ``warmup_steps`` burn-in steps, then ``num_samples``
  draws ``thin`` steps apart; step size ε_t = ε₀ (1 + t/b)^−γ (``step_size`` ε₀,
  ``step_offset`` b, ``step_decay`` γ), Welling & Teh 2011's a (b + t)^−γ.

``step_size=None`` (the default) sets ε₀ / η / α₀ from the curvature at the start point
(:func:`inference.sgmcmc.runner.curvature_step_size`, :mod:`inference.sgmcmc.step_sizes`): the
spectral radius λ of the Hessian of −log π̃ on up to
:data:`~inference.sgmcmc.step_sizes.CURVATURE_ROWS` training rows (scaled by N/m), by power iteration
on Hessian-vector products, and the rule of each sampler for the minibatch ratio r = N/n;
``info["step_size_rule"]`` records λ, r and the step.
* ``csgmcmc``: ``num_cycles`` cosine cycles of ``cycle_length`` steps; ``num_samples /
  num_cycles`` draws ``thin`` steps apart from the end of each cycle's sampling phase.

A draw is the chains' state after a step.  Non-finite log densities or gradients stop the
run with :class:`~inference.backends.base.NonFiniteLossError` carrying the draws so far.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Callable, Optional

import pyro
import torch

from inference.mcmc.budget import DEFAULT_TIME_BUDGET, WINDOW, sampler_advice, time_budget
from inference.mcmc.chains import jittered_starts, last_layer_dim
from inference.mcmc.driver import thinned
from inference.sgmcmc.runner import curvature_step_size, cycle_draw_index, gradient_estimator, sample_sgmcmc
from inference.sgmcmc.step_sizes import (
    PSGLD_WARM_START, cyclical_step_size, preconditioned, rms_preconditioner, sghmc_step_size, sgld_step_size,
)  # fmt: skip
from inference.sgmcmc.updates import Kernel, cyclical, polynomial_decay, psgld, sghmc, sgld
from inference.posterior import SamplePosterior
from inference.optim.batches import LoaderBatches, loader_info
from inference.optim.output_head import head_module
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.map import MAPOptions
from inference.optim.start import INIT_STRATEGIES, MAP_BATCH_SIZE, initial_point, map_epochs
from inference.optim.training import NonFiniteLossError
from inference.multifit.stacked_map import fit_map_starts
from inference.backends.base import Backend

__all__ = [
    "SGMCMCConfig",
    "SGLDConfig",
    "PSGLDConfig",
    "SGHMCConfig",
    "CyclicalConfig",
    "SGLDBackend",
    "PSGLDBackend",
    "SGHMCBackend",
    "CyclicalSGMCMCBackend",
]


@dataclass
class SGMCMCConfig:
    """Options shared by the SG-MCMC backends.

    Attributes:
        num_chains: chains run side by side (vectorised; they share minibatches).
        num_samples: draws kept per chain.
        thin: steps between kept draws.
        step_size: the kernel's (initial) step size ε₀ / η / α₀; ``None``: from the curvature at
            the start point (the module docstring, docs/mcmc.md "SG-MCMC step sizes").
        batch_size: minibatch size (``None``: full batch); the likelihood is scaled by N/n.
            Unused when fitting from a DataLoader (its batches are used).
        init: ``"map"`` (the ``map`` backend's MAP fit first) or ``"current"`` (the network's weights).
        map_steps / map_lr: the MAP fit's budget of minibatch Adam steps (a DataLoader's batches when
            fitting from one) and learning rate (:func:`inference.optim.start.initial_point`).  A step size right for the stiffest direction
            hardly moves the flat ones (energy's noise precision would relax over ~10⁵ steps), so
            the start sets the noise level: after 1000 steps it was still 95 (prior median 69),
            after 3000 the overfitted ~1 500 (docs/mcmc.md, "SG-MCMC step sizes").
        init_jitter: sd of the Gaussian jitter added to each chain's start.
        time_budget: seconds the whole fit may take (120; ``None``: no budget), projected from the first steps
            (:class:`~inference.mcmc.budget.TimeBudgetExceeded`).
    """

    num_chains: int = 4
    num_samples: int = 200
    thin: int = 10
    step_size: Optional[float] = None
    batch_size: Optional[int] = 32
    init: str = "map"
    map_steps: int = 2000
    map_lr: float = 0.01
    init_jitter: float = 0.01
    time_budget: Optional[float] = DEFAULT_TIME_BUDGET

    def validate(self):
        self._validate_shared()

    def _validate_shared(self):
        for name in ("num_chains", "num_samples", "thin"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "map_steps", "step_offset"):
            if int(getattr(self, name, 0)) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        for name in ("step_size", "map_lr"):
            if name == "step_size" and self.step_size is None:
                continue
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1 (or None for full batch), got {self.batch_size}")
        if not (math.isfinite(self.init_jitter) and self.init_jitter >= 0):
            raise ValueError(f"init_jitter must be non-negative, got {self.init_jitter}")
        if self.init not in INIT_STRATEGIES:
            raise ValueError(f"unknown init {self.init!r}; valid: {', '.join(INIT_STRATEGIES)}")
        if self.time_budget is not None and not (math.isfinite(float(self.time_budget)) and self.time_budget > 0):
            raise ValueError(f"time_budget must be a positive number of seconds or None (no budget), got {self.time_budget}")


@dataclass
class SGLDConfig(SGMCMCConfig):
    """SGLD: shared options, ``warmup_steps`` of burn-in and the decay ε_t = ε₀ (1 + t/b)^−γ."""

    warmup_steps: int = 2000
    step_decay: float = 0.55
    step_offset: float = 1000.0

    def validate(self):
        super().validate()
        if not (0 <= self.step_decay <= 1):
            raise ValueError(f"step_decay (γ) must lie in [0, 1], got {self.step_decay}")
        if not self.step_offset > 0:
            raise ValueError(f"step_offset (b) must be positive, got {self.step_offset}")


@dataclass
class PSGLDConfig(SGLDConfig):
    """pSGLD: SGLD's options and the RMSprop preconditioner's decay α and damping λ."""

    rms_decay: float = 0.99
    rms_damping: float = 1e-5

    def validate(self):
        super().validate()
        if not 0 < self.rms_decay < 1:
            raise ValueError(f"rms_decay must lie in (0, 1), got {self.rms_decay}")
        if not self.rms_damping > 0:
            raise ValueError(f"rms_damping must be positive, got {self.rms_damping}")


@dataclass
class SGHMCConfig(SGLDConfig):
    """SGHMC: SGLD's schedule options (default constant, γ = 0) and the friction α ∈ (0, 1]."""

    step_decay: float = 0.0
    friction: float = 0.1

    def validate(self):
        super().validate()
        if not 0 < self.friction <= 1:
            raise ValueError(f"friction must lie in (0, 1], got {self.friction}")


@dataclass
class CyclicalConfig(SGMCMCConfig):
    """Cyclical SG-MCMC: ``num_cycles`` M, ``exploration`` β, ``kernel`` (``sgld``/``sghmc``),
    ``friction`` (SGHMC kernel) and the cycle length L: ``cycle_length`` steps, or by default
    ``cycle_epochs`` epochs of minibatch steps as Zhang et al. 2020 (200 epochs in 4 cycles), at least
    long enough for a cycle's ``num_samples / M`` draws ``thin`` steps apart in its sampling phase;
    ``thin`` ``None``: that phase's steps shared among the draws (:meth:`resolved`; docs/mcmc.md).

    ``step_size`` α₀ is the peak of the cosine schedule, taken by the exploration phase's plain
    SGD steps on the N-scaled potential; by default the largest peak whose sampling phase meets
    the inner kernel's step rule and whose exploration stays at half its stability limit
    (:func:`~inference.sgmcmc.step_sizes.cyclical_step_size`)."""

    num_cycles: int = 4
    exploration: float = 0.8
    kernel: str = "sgld"
    friction: float = 0.1
    cycle_length: Optional[int] = None
    cycle_epochs: float = 50.0
    thin: Optional[int] = None

    def validate(self):
        if self.thin is not None and int(self.thin) < 1:
            raise ValueError(f"thin must be at least 1 (or None: from the cycle), got {self.thin}")
        replace(self, thin=self.thin or 1)._validate_shared()
        if not (math.isfinite(self.cycle_epochs) and self.cycle_epochs > 0):
            raise ValueError(f"cycle_epochs must be a positive number, got {self.cycle_epochs}")
        if int(self.num_cycles) < 1:
            raise ValueError(f"num_cycles must be at least 1, got {self.num_cycles}")
        if self.num_samples % self.num_cycles:
            raise ValueError(
                f"num_samples ({self.num_samples}) must be a multiple of num_cycles ({self.num_cycles}): "
                f"each cycle contributes num_samples / num_cycles draws"
            )
        if not 0 <= self.exploration < 1:
            raise ValueError(f"exploration (β) must lie in [0, 1), got {self.exploration}")
        if self.kernel not in ("sgld", "sghmc"):
            raise ValueError(f"unknown cyclical kernel {self.kernel!r}; valid: sgld, sghmc")
        if not 0 < self.friction <= 1:
            raise ValueError(f"friction must lie in (0, 1], got {self.friction}")
        needed = self.num_samples // self.num_cycles * (self.thin or 1)
        if self.cycle_length is not None and int(self.cycle_length) - math.ceil(self.exploration * self.cycle_length) < needed:
            raise ValueError(
                f"cycle_length {self.cycle_length} leaves fewer than {needed} sampling steps "
                f"(num_samples/num_cycles · thin) after the exploration fraction {self.exploration}; "
                f"lengthen the cycle or leave cycle_length unset"
            )

    def resolved(self, steps_per_epoch: int) -> "CyclicalConfig":
        """This configuration with ``cycle_length`` and ``thin`` in steps, for epochs of ``steps_per_epoch`` steps:
        L = max(⌈``cycle_epochs`` · steps_per_epoch⌉, ⌈(draws · thin)/(1 − β)⌉ + 1) and thin =
        max(1, ⌊(L − ⌈βL⌉)/draws⌋) where not given (draws = ``num_samples / num_cycles``)."""
        draws = self.num_samples // self.num_cycles
        length = self.cycle_length
        if length is None:
            shortest = math.ceil(draws * (self.thin or 1) / (1 - self.exploration) - 1e-9) + 1  # 500 / 0.2 → 2501
            length = max(math.ceil(self.cycle_epochs * steps_per_epoch), shortest)
        thin = self.thin if self.thin is not None else max(1, (length - math.ceil(self.exploration * length)) // draws)
        return replace(self, cycle_length=int(length), thin=int(thin))

    @property
    def sampling_steps(self) -> int:
        """Steps of a cycle's sampling phase that hold its draws (a :meth:`resolved` configuration)."""
        return self.num_samples // self.num_cycles * self.thin

    @property
    def length(self) -> int:
        """Steps per cycle L (a :meth:`resolved` configuration)."""
        return int(self.cycle_length)


# ---------------------------------------------------------------------- backends
class SGMCMCBackend(Backend):
    """Base of the SG-MCMC backends: a kernel, a number of steps and the steps whose states are kept.

    ``run`` also takes a DataLoader's batches (:class:`~inference.optim.batches.LoaderBatches`, ``y``
    ``None``): each step, and each step of the MAP initialisation, takes the loader's next batch
    (its order and batch size; ``config.batch_size`` is not used), the likelihood scaled by N/n
    with N = ``len(loader.dataset)``."""

    accepts_loader = True

    def kernel(self, value_and_grad: Callable, config, num_data: int) -> Kernel:  # pragma: no cover - abstract
        raise NotImplementedError

    def default_step_size(self, config, hessian: Callable, curvature: Callable, batch_ratio: float, **start) -> float:
        """The step rule of :mod:`inference.sgmcmc.step_sizes` for this sampler; ``curvature(operator)``
        is the spectral radius of an operator, ``hessian`` that of −log π̃ at the start point."""
        return sgld_step_size(curvature(hessian), batch_ratio)

    def num_iterations(self, config) -> int:
        return config.warmup_steps + config.num_samples * config.thin

    def draw_index(self, config) -> Callable[[int], Optional[int]]:
        """Step ``t`` (0-based) → the draw slot of the state after it, or ``None``."""
        return thinned(config.warmup_steps, config.thin)

    def step_counts(self, config) -> dict:
        """The options that set the number of steps, scaled down together by the budget's advice."""
        return {"warmup_steps": config.warmup_steps, "num_samples": config.num_samples}

    def _monitor(self, bnn, x, config, dim: int, started: float):
        """The :func:`~inference.mcmc.budget.time_budget` of ``config`` (or ``None``), checked over the first tenth
        of the steps (a step's cost does not change)."""
        total = self.num_iterations(config)
        advise = lambda p: sampler_advice(p, counts=self.step_counts(config), num_chains=config.num_chains, dim=dim,  # noqa: E731
                                          last_dim=last_layer_dim(bnn, x if isinstance(x, torch.Tensor) else None))
        return None if config.time_budget is None else time_budget(
            config.time_budget, total, started, name=self.name, advise=advise, check_until=total // 10 + WINDOW)

    def run(self, bnn, x, y, config, seed: int, progress: bool) -> SamplePosterior:
        return self._run(bnn, x, y, config, seed, progress)

    def run_stacked(self, bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool) -> list:
        """K fits (:func:`inference.fit_many`): their MAP starts as one stacked program
        (:func:`~inference.multifit.stacked_map.fit_map_starts`, the options :func:`initial_point` uses), then
        each fit's chains from its start as :meth:`run` runs them.  Per fit a posterior or the
        :class:`NonFiniteLossError` that stopped it; ``info["map_seconds"]`` is the fit's share of the stacked start."""
        started = time.perf_counter()
        options = MAPOptions(epochs=map_epochs(xs.shape[1], None, config.map_steps), lr=config.map_lr,
                             batch_size=MAP_BATCH_SIZE)
        starts, _ = fit_map_starts(bnns, xs, ys, options, seeds, progress, f"MAP start x{len(bnns)} (stacked)")
        share = (time.perf_counter() - started) / len(bnns)
        results = []
        for k, (bnn, start, seed) in enumerate(zip(bnns, starts, seeds)):
            try:
                posterior = self._run(bnn, xs[k], ys[k], config, int(seed), progress, fitted=start.values)
            except NonFiniteLossError as error:
                posterior = error
            target = posterior.posterior if isinstance(posterior, NonFiniteLossError) else posterior
            if target is not None:
                target.info.update(map_seconds=share, fit_seconds=target.info.get("fit_seconds", 0.0) + share,
                                   multifit={"fits": len(bnns), "index": k})
            results.append(posterior)
        return results

    def _run(self, bnn, x, y, config, seed: int, progress: bool, fitted: Optional[dict] = None) -> SamplePosterior:
        started = time.perf_counter()
        pyro.set_rng_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        potential = Potential(bnn, x, y)
        loader = x if isinstance(x, LoaderBatches) else None
        if isinstance(config, CyclicalConfig):  # cycles in epochs: the DataLoader's batches or ⌈N / batch_size⌉ steps
            batch = min(config.batch_size or potential.num_data, potential.num_data)
            config = config.resolved(loader.steps_per_epoch if loader else math.ceil(potential.num_data / batch))
        z0, init_record = initial_point(potential, config.init, config.map_steps, config.map_lr, progress, seed,
                                        data=loader, fitted=fitted)
        z = jittered_starts(z0, config.num_chains, config.init_jitter, generator)
        estimate = gradient_estimator(potential, loader, config.batch_size, generator)
        step_record = {}
        if config.step_size is None:
            rule = partial(self.default_step_size, config, z=z0, estimate=estimate, num_data=potential.num_data)
            with frozen_deterministic(bnn):
                step, step_record = curvature_step_size(potential, z0, rule, loader, config.batch_size, generator)
            config = replace(config, step_size=step)
        info = {
            "backend": self.name,
            "config": asdict(config),
            "seed": seed,
            "num_data": potential.num_data,
            "num_chains": config.num_chains,
            "num_random": potential.dim,
            "output_head": None if loader is not None else head_module(bnn, x)[0],
            **init_record,
            **loader_info(x),
        }
        if step_record:
            info["step_size_rule"] = step_record
        return sample_sgmcmc(
            bnn, potential, self.kernel(estimate, config, potential.num_data), z, generator, info, started,
            num_iterations=self.num_iterations(config), num_draws=config.num_samples,
            draw_index=self.draw_index(config), num_warmup=getattr(config, "warmup_steps", 0), progress=progress,
            desc=f"{self.name} ({config.num_chains} chains)",
            monitor=self._monitor(bnn, x, config, potential.dim, started),
            head=info["output_head"],
            first_batch=None if loader is None else lambda: next(iter(loader.epoch(generator))),
        )  # fmt: skip


def _decay(config):
    return polynomial_decay(config.step_size, config.step_offset, config.step_decay)


class SGLDBackend(SGMCMCBackend):
    name = "sgld"
    Config = SGLDConfig

    def kernel(self, value_and_grad, config, num_data):
        return sgld(value_and_grad, _decay(config))


class PSGLDBackend(SGMCMCBackend):
    name = "psgld"
    Config = PSGLDConfig

    def kernel(self, value_and_grad, config, num_data):
        warm_start = 1 if config.batch_size is None else PSGLD_WARM_START
        return psgld(value_and_grad, _decay(config), num_data, config.rms_decay, config.rms_damping, warm_start)

    def default_step_size(self, config, hessian, curvature, batch_ratio, z, estimate, num_data):
        """SGLD's rule on G^{1/2} H G^{1/2}, G from the mean ḡ⊙ḡ of minibatch gradients at the start."""
        warm_start = 1 if batch_ratio == 1 else PSGLD_WARM_START
        square_avg = sum((estimate(z.unsqueeze(0))[1][0] / num_data).square() for _ in range(warm_start)) / warm_start
        precond = rms_preconditioner(square_avg, config.rms_damping)
        return sgld_step_size(curvature(preconditioned(hessian, precond)), batch_ratio)


class SGHMCBackend(SGMCMCBackend):
    name = "sghmc"
    Config = SGHMCConfig

    def kernel(self, value_and_grad, config, num_data):
        return sghmc(value_and_grad, _decay(config), config.friction)

    def default_step_size(self, config, hessian, curvature, batch_ratio, **start):
        return sghmc_step_size(curvature(hessian), batch_ratio, config.friction)


class CyclicalSGMCMCBackend(SGMCMCBackend):
    """Cyclical SG-MCMC (Zhang et al. 2020, Alg. 1); see :func:`inference.sgmcmc.updates.cyclical`."""

    name = "csgmcmc"
    Config = CyclicalConfig

    def kernel(self, value_and_grad, config, num_data):
        return cyclical(value_and_grad, config.step_size, config.length, config.exploration, config.kernel, config.friction)

    def default_step_size(self, config, hessian, curvature, batch_ratio, **start):
        return cyclical_step_size(curvature(hessian), batch_ratio, config.exploration, config.kernel, config.friction)

    def num_iterations(self, config) -> int:
        return config.num_cycles * config.length

    def step_counts(self, config) -> dict:
        return {"cycle_epochs": config.cycle_epochs}  # the cycles' length is proportional to it, the draws stay

    def draw_index(self, config):
        return cycle_draw_index(config.length, config.num_samples // config.num_cycles, config.thin,
                                config.sampling_steps)
