"""The SG-MCMC fit: ``sgld``, ``psgld``, ``sghmc`` and ``csgmcmc`` chains assembled from the parts of
:mod:`inference.sgmcmc` (the backends' options are :mod:`inference.sgmcmc.config`'s; :func:`fit_sgmcmc`
reads them).

All four sample π(z) of :class:`inference.optim.potential.Potential` (random sites in
unconstrained coordinates, deterministic parameters at the network's values) from
minibatch gradients g = ∇ log π̃(z) with the likelihood scaled by N/n.  The ``C`` chains
are one ``[C, D]`` tensor and share each minibatch (one batched forward pass per step);
their injected noise is independent.  A :class:`Sampler` names the kernel of
:mod:`inference.sgmcmc.updates` (SGLD, Welling & Teh 2011; pSGLD, Li et al. 2016;
SGHMC, Chen et al. 2014; cyclical SG-MCMC, Zhang et al. 2020), its default step rule and its kept
steps; :func:`fit_sgmcmc` runs it with the runner of :mod:`inference.sgmcmc.runner` (the loop of
:func:`inference.mcmc.driver.run_chains`):

* ``sgld`` / ``psgld`` / ``sghmc``: ``warmup_steps`` burn-in steps, then ``num_samples``
  draws ``thin`` steps apart; step size ε_t = ε₀ (1 + t/b)^−γ (``step_size`` ε₀,
  ``step_offset`` b, ``step_decay`` γ), Welling & Teh 2011's a (b + t)^−γ.
* ``csgmcmc``: ``num_cycles`` cosine cycles of ``cycle_length`` steps; ``num_samples /
  num_cycles`` draws ``thin`` steps apart from the end of each cycle's sampling phase.

``step_size=None`` (the default) sets ε₀ / η / α₀ from the curvature at the start point
(:func:`inference.sgmcmc.runner.curvature_step_size`, :mod:`inference.sgmcmc.step_sizes`): the
spectral radius λ of the Hessian of −log π̃ on up to
:data:`~inference.sgmcmc.step_sizes.CURVATURE_ROWS` training rows (scaled by N/m), by power iteration
on Hessian-vector products, and the rule of each sampler for the minibatch ratio r = N/n;
``info["step_size_rule"]`` records λ, r and the step.

A draw is the chains' state after a step.  Chains that diverge (non-finite log density or
gradient) before the first kept draw restart from their starts with the step size divided by 4,
at most ``max_backoffs`` times (``info["step_size_backoffs"]``; docs/mcmc.md, "SG-MCMC step
sizes"); later, non-finite values stop the run with
:class:`~inference.optim.training.NonFiniteLossError` carrying the draws so far.

:func:`fit_sgmcmc_stacked` fits K problems: their MAP starts as one stacked program
(:func:`inference.optim.stacked_map.fit_map_starts`), then each fit's chains as :func:`fit_sgmcmc` runs them.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from functools import partial
from typing import Callable, Optional

import pyro
import torch

from inference.mcmc.budget import WINDOW, sampler_advice, start_advice, start_budget, time_budget
from inference.mcmc.chains import last_layer_dim
from inference.mcmc.driver import thinned
from inference.optim.batches import LoaderBatches
from inference.optim.map import MAPOptions, run_info
from inference.optim.output_head import head_module
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.stacked_map import fit_map_starts
from inference.optim.start import MAP_BATCH_SIZE, initial_point, map_epochs
from inference.optim.training import NonFiniteLossError
from inference.posterior import SamplePosterior
from inference.sgmcmc.config import CyclicalConfig
from inference.sgmcmc.runner import (
    curvature_operator, curvature_step_size, cycle_draw_index, gradient_estimator, sample_sgmcmc,
)  # fmt: skip
from inference.sgmcmc.stability import collapse_check, start_jitter
from inference.sgmcmc.step_sizes import (
    PSGLD_WARM_START, cyclical_step_size, preconditioned, rms_preconditioner, sghmc_step_size, sgld_step_size,
)  # fmt: skip
from inference.sgmcmc.updates import Kernel, cyclical, polynomial_decay, psgld, sghmc, sgld

__all__ = ["Sampler", "SGLDSampler", "PSGLDSampler", "SGHMCSampler", "CyclicalSampler", "fit_sgmcmc",
           "fit_sgmcmc_stacked"]


# ---------------------------------------------------------------------- samplers
class Sampler:
    """What tells one SG-MCMC sampler from another: its kernel, its default step rule, its number of steps
    and the steps whose states are kept (the base: SGLD's rule, burn-in then thinned draws)."""

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


def _decay(config):
    return polynomial_decay(config.step_size, config.step_offset, config.step_decay)


class SGLDSampler(Sampler):
    def kernel(self, value_and_grad, config, num_data):
        return sgld(value_and_grad, _decay(config))


class PSGLDSampler(Sampler):
    def kernel(self, value_and_grad, config, num_data):
        warm_start = 1 if config.batch_size is None else PSGLD_WARM_START
        return psgld(value_and_grad, _decay(config), num_data, config.rms_decay, config.rms_damping, warm_start)

    def default_step_size(self, config, hessian, curvature, batch_ratio, z, estimate, num_data):
        """SGLD's rule on G^{1/2} H G^{1/2}, G from the mean ḡ⊙ḡ of minibatch gradients at the start."""
        warm_start = 1 if batch_ratio == 1 else PSGLD_WARM_START
        square_avg = sum((estimate(z.unsqueeze(0))[1][0] / num_data).square() for _ in range(warm_start)) / warm_start
        precond = rms_preconditioner(square_avg, config.rms_damping)
        return sgld_step_size(curvature(preconditioned(hessian, precond)), batch_ratio)


class SGHMCSampler(Sampler):
    def kernel(self, value_and_grad, config, num_data):
        return sghmc(value_and_grad, _decay(config), config.friction)

    def default_step_size(self, config, hessian, curvature, batch_ratio, **start):
        return sghmc_step_size(curvature(hessian), batch_ratio, config.friction)


class CyclicalSampler(Sampler):
    """Cyclical SG-MCMC (Zhang et al. 2020, Alg. 1); see :func:`inference.sgmcmc.updates.cyclical`."""

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


# ---------------------------------------------------------------------- fits
def _monitor(sampler: Sampler, name: str, bnn, x, config, dim: int, started: float):
    """The :func:`~inference.mcmc.budget.time_budget` of ``config`` (or ``None``), checked over the first tenth
    of the steps (a step's cost does not change)."""
    total = sampler.num_iterations(config)
    advise = lambda p: sampler_advice(p, counts=sampler.step_counts(config), num_chains=config.num_chains, dim=dim,  # noqa: E731
                                      last_dim=last_layer_dim(bnn, x if isinstance(x, torch.Tensor) else None))
    return None if config.time_budget is None else time_budget(
        config.time_budget, total, started, name=name, advise=advise, check_until=total // 10 + WINDOW)


def _start_watch(sampler: Sampler, name: str, bnn, x, config, potential, head: Optional[str], started: float):
    """The :func:`~inference.mcmc.budget.start_budget` of ``config`` (or ``None``): the sampler's least cost is one
    gradient per step on ``batch_size`` rows (a DataLoader's: as many as a MAP step's), each at most a MAP step's
    time; not estimated when its gradients run the output module ``head`` on cached features."""
    if config.time_budget is None:
        return None
    gradients = 0.0 if head is not None else float(sampler.num_iterations(config))
    rows = None if isinstance(x, LoaderBatches) else min(config.batch_size or potential.num_data, potential.num_data)
    advise = lambda p: start_advice(p, map_steps=config.map_steps, dim=potential.dim,  # noqa: E731
                                    last_dim=last_layer_dim(bnn, x if isinstance(x, torch.Tensor) else None))
    return start_budget(config.time_budget, started, name=name, sampler_gradients=gradients, gradient_rows=rows,
                        advise=advise)


def fit_sgmcmc(bnn, x, y, config, seed: int, progress: bool, name: str, sampler: Sampler,
               fitted: Optional[dict] = None) -> SamplePosterior:
    """``config.num_chains`` chains of ``sampler`` on the posterior of ``bnn`` given ``(x [N, ...], y [N, T] or
    [N])`` or a DataLoader's batches (``x`` a :class:`~inference.optim.batches.LoaderBatches`, ``y`` ``None``: each
    step, and each step of the MAP initialisation, takes the loader's next batch, the likelihood scaled by N/n
    with N = ``len(loader.dataset)``), as a :class:`~inference.posterior.SamplePosterior` (module docstring).
    ``name`` is the backend recorded in ``info``; ``fitted`` a MAP start already fitted (the stacked path).

    Raises:
        inference.mcmc.budget.TimeBudgetExceeded: the fit projected past ``config.time_budget`` (during its MAP
            start or its first steps).
        NonFiniteLossError: non-finite values after the first kept draw (it carries the draws so far), or
            chains that still diverge after the last back-off (a
            :class:`~inference.sgmcmc.stability.SamplerDivergedError`).
    """
    started = time.perf_counter()
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    potential = Potential(bnn, x, y)
    loader = x if isinstance(x, LoaderBatches) else None
    if isinstance(config, CyclicalConfig):  # cycles in epochs: the DataLoader's batches or ⌈N / batch_size⌉ steps
        batch = min(config.batch_size or potential.num_data, potential.num_data)
        config = config.resolved(loader.steps_per_epoch if loader else math.ceil(potential.num_data / batch))
    head = None if loader is not None else head_module(bnn, x)[0]
    z0, init_record = initial_point(potential, config.init, config.map_steps, config.map_lr, progress, seed,
                                    data=loader, fitted=fitted,
                                    watch=_start_watch(sampler, name, bnn, x, config, potential, head, started))
    jitter = torch.randn(config.num_chains, z0.shape[-1], generator=generator)  # unit draws, scaled below
    estimate = gradient_estimator(potential, loader, config.batch_size, generator)
    rule = None
    if config.step_size is None:
        rule = partial(sampler.default_step_size, config, z=z0, estimate=estimate, num_data=potential.num_data)
    with frozen_deterministic(bnn):
        start = curvature_operator(potential, z0, loader, config.batch_size, generator)
        step, curvature_record = curvature_step_size(start, z0, rule, generator)
        check = collapse_check(potential, z0, start.x, start.y, start.batch_ratio)
    if step is not None:
        config = replace(config, step_size=step)
    jitter_sd = start_jitter(config.init_jitter, curvature_record["hessian_radius"])
    z = z0 + (jitter_sd * jitter).to(z0)
    info = run_info(name, config, seed, x, started, num_chains=config.num_chains, num_random=potential.dim,
                    output_head=head, **init_record)
    info["start_jitter"] = jitter_sd
    info["step_size_rule" if rule is not None else "start_curvature"] = curvature_record
    return sample_sgmcmc(
        bnn, potential, lambda step: sampler.kernel(estimate, replace(config, step_size=step), potential.num_data),
        config.step_size, z, generator, info, started, num_iterations=sampler.num_iterations(config),
        num_draws=config.num_samples, draw_index=sampler.draw_index(config),
        num_warmup=getattr(config, "warmup_steps", 0), progress=progress,
        desc=f"{name} ({config.num_chains} chains)", max_backoffs=config.max_backoffs,
        collapse=check.fresh, monitor=_monitor(sampler, name, bnn, x, config, potential.dim, started),
        head=info["output_head"],
        first_batch=None if loader is None else lambda: next(iter(loader.epoch(generator))),
    )  # fmt: skip


def fit_sgmcmc_stacked(bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool,
                       name: str, sampler: Sampler) -> list:
    """K fits (``xs`` ``[K, N, ...]``, ``ys`` ``[K, N, ...]``): their MAP starts as one stacked program
    (:func:`~inference.optim.stacked_map.fit_map_starts`, the options :func:`initial_point` uses), then
    each fit's chains from its start as :func:`fit_sgmcmc` runs them.  Per fit a posterior or the
    :class:`NonFiniteLossError` that stopped it; ``info["map_seconds"]`` is the fit's share of the stacked start."""
    started = time.perf_counter()
    options = MAPOptions(epochs=map_epochs(xs.shape[1], None, config.map_steps), lr=config.map_lr,
                         batch_size=MAP_BATCH_SIZE)
    starts, _ = fit_map_starts(bnns, xs, ys, options, seeds, progress, f"MAP start x{len(bnns)} (stacked)")
    share = (time.perf_counter() - started) / len(bnns)
    results = []
    for k, (bnn, start, seed) in enumerate(zip(bnns, starts, seeds)):
        try:
            posterior = fit_sgmcmc(bnn, xs[k], ys[k], config, int(seed), progress, name, sampler, fitted=start.values)
        except NonFiniteLossError as error:
            posterior = error
        target = posterior.posterior if isinstance(posterior, NonFiniteLossError) else posterior
        if target is not None:
            target.info.update(map_seconds=share, fit_seconds=target.info.get("fit_seconds", 0.0) + share,
                               multifit={"fits": len(bnns), "index": k})
        results.append(posterior)
    return results
