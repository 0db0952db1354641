"""The ``hmc`` and ``nuts`` backends: HMC and NUTS over exactly a model's random sites, all chains in lockstep.

This module holds the options (:class:`ChainConfig`, shared: chains, warm-up, adaptation, the start, compilation,
the time budget; :class:`HMCConfig`: leapfrog steps and their jitter; :class:`NUTSConfig`: the tree depth) and the
backends; the algorithm — ``hmc``: static HMC (Neal 2011); ``nuts``: multinomial NUTS (Hoffman & Gelman 2014;
Betancourt 2017) — is assembled from the parts of :mod:`inference.mcmc` by :func:`inference.mcmc.fit.fit_chains`
(its module docstring describes it step by step).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, Union

from inference.mcmc.budget import DEFAULT_TIME_BUDGET
from inference.mcmc.compilation import COMPILE_MODES
from inference.mcmc.fit import HMC, NUTS, fit_chains
from inference.posterior import SamplePosterior
from inference.optim.checks import check_choice, check_interval
from inference.optim.start import INIT_STRATEGIES
from inference.backends.base import Backend

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
            from the MAP start's first steps (its remaining steps and the sampler's least cost,
            :func:`~inference.mcmc.budget.start_budget`) and the first iterations on, the fit's total wall time is
            projected, and a fit projected past the budget stops with :class:`~inference.mcmc.budget.TimeBudgetExceeded`, whose message gives the
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
        check_interval("target_accept", self.target_accept, "(0, 1)")
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
        check_choice("init", self.init, INIT_STRATEGIES)


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
        check_interval("step_jitter", self.step_jitter, "[0, 1)")


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
    sampler = HMC

    def run(self, bnn, x, y, config, seed: int, progress: bool) -> SamplePosterior:
        return fit_chains(bnn, x, y, config, seed, progress, self.name, self.sampler)


class NUTSBackend(HMCBackend):
    """The No-U-Turn sampler over the random sites (see the module docstring)."""

    name = "nuts"
    Config = NUTSConfig
    sampler = NUTS
