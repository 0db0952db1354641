"""MCMC built from named parts, over a batch of ``C`` chains stacked as ``[C, D]``.

* :mod:`.metrics` — Euclidean metrics (kinetic energy, momenta, velocity).
* :mod:`.integrators` — the leapfrog integrator.
* :mod:`.nuts` — iterative NUTS tree building (U-turn rule, subtree step, NamedTuple states).
* :mod:`.kernels` — HMC and NUTS transitions.
* :mod:`.adaptation` — dual averaging, Welford (co)variance, Stan's windows, each as init/update/final.
* :mod:`.sgmcmc` — SGLD, pSGLD, SGHMC and cyclical SG-MCMC kernels and step-size schedules.
* :mod:`.driver` — one warm-up / sampling loop for all of them.
* :mod:`.compilation` — when to ``torch.compile`` a transition (only where it pays).

The backends in :mod:`inference.backends.hmc` and :mod:`inference.backends.sgmcmc` assemble
these parts; docs/mcmc.md describes the algorithms and their measured behaviour.
"""
from .adaptation import Adaptation, adaptation_windows, dual_averaging, find_step_size, welford_covariance, window_adaptation
from .driver import ChainRun, run_chains, thinned
from .integrators import IntegratorState, leapfrog
from .kernels import HMCState, build_hmc, build_nuts
from .metrics import Metric, euclidean_metric, identity_metric
from .sgmcmc import Kernel, cosine_cycle, cyclical, polynomial_decay, psgld, sghmc, sgld

__all__ = [
    "Adaptation", "adaptation_windows", "dual_averaging", "find_step_size", "welford_covariance", "window_adaptation",
    "ChainRun", "run_chains", "thinned", "IntegratorState", "leapfrog", "HMCState", "build_hmc", "build_nuts",
    "Metric", "euclidean_metric", "identity_metric", "Kernel", "cosine_cycle", "cyclical", "polynomial_decay",
    "psgld", "sghmc", "sgld",
]  # fmt: skip
