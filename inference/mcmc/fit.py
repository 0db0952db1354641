"""The HMC / NUTS fit: all chains in lockstep over exactly a model's random sites, assembled from the parts
of :mod:`inference.mcmc` (the ``hmc`` and ``nuts`` backends' options are
:class:`~inference.backends.hmc.HMCConfig` and :class:`~inference.backends.hmc.NUTSConfig`; :func:`fit_chains`
reads them).

Both samplers sample ``π(z)`` of :class:`inference.optim.potential.Potential`: the random weights and
likelihood latents in unconstrained coordinates; deterministic parameters stay at the network's values
(after the optional MAP initialisation, which fits them jointly when the model trains them).  The ``C``
chains are one ``[C, D]`` tensor, so each leapfrog step costs one batched forward/reverse pass for all chains.

* the transition — :data:`HMC`: static HMC (Neal 2011) with ``num_steps`` jittered leapfrog steps
  (:func:`inference.mcmc.kernels.build_hmc`); :data:`NUTS`: multinomial NUTS with the generalised U-turn
  criterion (Hoffman & Gelman 2014; Betancourt 2017), iterative tree building (:mod:`inference.mcmc.nuts`);
  compiled when it pays (:class:`inference.mcmc.compilation.LazyCompile`);
* the output module on cached features — :mod:`inference.optim.output_head`: when the random weights are
  the module whose output the network returns, its input is computed once after the start and each
  gradient runs that module only (the same density);
* the start — :func:`inference.optim.start.initial_point`, jittered per chain
  (:func:`inference.mcmc.chains.jittered_starts`);
* the time budget — :func:`inference.mcmc.budget.start_budget` over the MAP start's steps, then
  :func:`inference.mcmc.budget.time_budget` over the iterations, stop a fit projected past ``time_budget``;
* the warm-up's first metric — :func:`inference.mcmc.adaptation.metric_choice` and the curvature at the
  start (:mod:`inference.mcmc.initial_metric`);
* warm-up and sampling — :func:`inference.mcmc.chains.sample_chains`: Stan's windowed adaptation
  (:func:`inference.mcmc.adaptation.window_adaptation`: dual-averaging step size, Welford (co)variance
  metric in doubling windows; per-chain, fixed after warm-up, so the draws are exact) on the loop of
  :func:`inference.mcmc.driver.run_chains`;
* convergence — :func:`inference.mcmc.convergence.chain_convergence`: R-hat / ESS of ``f_mean``,
  ``log_joint`` and the latents in ``post.info`` (with a warning when the chains have not mixed).
"""
from __future__ import annotations

import time
from functools import partial
from typing import Callable, NamedTuple, Optional

import pyro
import torch

from inference.mcmc.adaptation import metric_choice
from inference.mcmc.budget import WINDOW, sampler_advice, start_advice, start_budget, time_budget
from inference.mcmc.chains import jittered_starts, last_layer_dim, sample_chains, sampling_warnings
from inference.mcmc.compilation import COMPILED_COST_FRACTION, LazyCompile, compile_blocker, unit_key
from inference.mcmc.convergence import chain_convergence
from inference.mcmc.initial_metric import CURVATURE_MAX_DIM, curvature_metric, hessian
from inference.mcmc.kernels import build_hmc, build_nuts
from inference.optim.map import run_info
from inference.optim.output_head import head_module
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.start import initial_point
from inference.optim.training import NonFiniteLossError
from inference.posterior import SamplePosterior

__all__ = ["ChainSampler", "HMC", "NUTS", "fit_chains"]


class ChainSampler(NamedTuple):
    """A Metropolis-corrected sampler for :func:`fit_chains`: ``transition(potential, config, compile)``
    builds its transition, ``unit`` names the part that is compiled (in the progress line) and
    ``least_gradients(config)`` is the fewest gradient evaluations of one iteration (the time budget's
    lower bound on the sampler while the MAP start runs, :func:`inference.mcmc.budget.start_budget`)."""

    transition: Callable
    unit: str
    least_gradients: Callable


def _hmc_transition(potential, config, compile: bool):
    return build_hmc(potential, compile, config.max_energy_error, config.num_steps, config.step_jitter)


def _nuts_transition(potential, config, compile: bool):
    return build_nuts(potential, compile, config.max_energy_error, config.max_tree_depth)


def _hmc_gradients(config) -> int:
    return config.num_steps  # a fixed trajectory


def _nuts_gradients(config) -> int:
    return 1  # a tree of depth 1: one leapfrog step


HMC = ChainSampler(_hmc_transition, "leapfrog step", _hmc_gradients)
NUTS = ChainSampler(_nuts_transition, "subtree", _nuts_gradients)


def _advice(config, bnn, x, dim: int, projection) -> list:
    """What would bring the fit within ``config.time_budget`` (:func:`~inference.mcmc.budget.sampler_advice`)."""
    return sampler_advice(projection, counts={"warmup_steps": config.warmup_steps, "num_samples": config.num_samples},
                          num_chains=config.num_chains, dim=dim, last_dim=last_layer_dim(bnn, x),
                          max_tree_depth=getattr(config, "max_tree_depth", None),
                          num_steps=getattr(config, "num_steps", None))


def _start_watch(config, bnn, x, potential, head: Optional[str], transition: LazyCompile, sampler: ChainSampler,
                 name: str, started: float):
    """The :func:`~inference.mcmc.budget.start_budget` of ``config`` (or ``None``): the sampler's least cost is
    ``least_gradients`` per iteration on all N rows, each at a MAP step's time (times the compiled fraction when the
    transition may compile); not estimated when its gradients run the output module ``head`` on cached features."""
    if config.time_budget is None:
        return None
    total = config.warmup_steps + config.num_samples * config.thin
    fraction = COMPILED_COST_FRACTION if transition.enabled else 1.0
    gradients = 0.0 if head is not None else total * sampler.least_gradients(config) * fraction
    advise = lambda p: start_advice(p, map_steps=config.map_steps, dim=potential.dim,  # noqa: E731
                                    last_dim=last_layer_dim(bnn, x))
    return start_budget(config.time_budget, started, name=name, sampler_gradients=gradients,
                        gradient_rows=potential.num_data, advise=advise)


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


def fit_chains(bnn, x, y, config, seed: int, progress: bool, name: str, sampler: ChainSampler) -> SamplePosterior:
    """``config.num_chains`` chains of ``sampler`` (:data:`HMC` or :data:`NUTS`) on the posterior of ``bnn`` given
    ``(x [N, ...], y [N, T] or [N])`` (module docstring), as a :class:`~inference.posterior.SamplePosterior` of
    draws ``{site: [chains, num_samples, ...]}``; ``name`` is the backend recorded in ``info`` and its warnings.

    Raises:
        NonFiniteLossError: a non-finite MAP start.
        inference.mcmc.budget.TimeBudgetExceeded: the fit projected past ``config.time_budget`` (during its MAP
            start or its first iterations).
    """
    started = time.perf_counter()
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    potential = Potential(bnn, x, y)
    head, no_head = head_module(bnn, x)  # sampled on cached features when the random weights are the output module
    transition = LazyCompile(  # before the start: on a CPU it begins warming the compiler in the background
        partial(sampler.transition, potential, config), config.compile,
        config.warmup_steps + config.num_samples * config.thin,
        unit_key(name, potential, config.num_chains, head), compile_blocker(bnn, head), progress,
        desc=f"{name}: compiling the {sampler.unit} (once per fit)", device=potential.device,
    )  # fmt: skip
    z0, init_record = initial_point(potential, config.init, config.map_steps, config.map_lr, progress, seed,
                                    watch=_start_watch(config, bnn, x, potential, head, transition, sampler, name,
                                                       started))
    if not bool(torch.isfinite(z0).all()):
        raise NonFiniteLossError(0, "the MAP initialisation", None)
    starts = jittered_starts(z0, config.num_chains, config.init_jitter, generator)
    total = config.warmup_steps + config.num_samples * config.thin
    monitor = None if config.time_budget is None else time_budget(
        config.time_budget, total, started, name=name, check_until=config.warmup_steps + WINDOW,
        advise=partial(_advice, config, bnn, x, potential.dim), forecast=transition.forecast,
    )  # fmt: skip
    with torch.no_grad(), frozen_deterministic(bnn), potential.cached_head(head):
        plan, metric, metric_record = _metric(potential, z0, config, head)
        z, stats, record = sample_chains(
            potential, starts, transition, generator, progress, name, warmup_steps=config.warmup_steps,
            num_samples=config.num_samples, thin=config.thin, step_size=config.step_size,
            target_accept=config.target_accept, dense_mass=plan.dense,
            pool_adaptation=plan.pooled, adapt_step_size=config.adapt_step_size,
            adapt_mass=plan.estimate, monitor=monitor, initial_metric=metric,
        )  # fmt: skip
        # the warnings point at the caller of the backend's run (fit_chains, run, then its caller)
        divergences, saturated = sampling_warnings(name, stats, config.target_accept,
                                                   getattr(config, "max_tree_depth", None), stacklevel=4)
        convergence = chain_convergence(name, potential, z, log_density=stats["lp"],
                                        tree_depth_saturated=saturated, stacklevel=4)
    info = run_info(name, config, seed, x, started, **{
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
