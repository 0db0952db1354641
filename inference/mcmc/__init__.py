"""MCMC built from named parts, over a batch of ``C`` chains stacked as ``[C, D]``.

* :mod:`.mass_matrix` — Euclidean metrics (kinetic energy, momenta, velocity).
* :mod:`.integrators` — the leapfrog integrator.
* :mod:`.nuts` — iterative NUTS tree building (U-turn rule, subtree step, NamedTuple states).
* :mod:`.kernels` — HMC and NUTS transitions.
* :mod:`.adaptation` — dual averaging, Welford (co)variance, Stan's windows, each as init/update/final.
* :mod:`.driver` — one warm-up / sampling loop for all of them (the SG-MCMC kernels of
  :mod:`inference.sgmcmc` too).
* :mod:`.compilation` — when to ``torch.compile`` a transition (only where it pays).
* :mod:`.chains` — HMC / NUTS chains from a start point: jittered starts, the windowed warm-up wired
  to the driver, the run's record, the warnings on divergences and saturated trees.
* :mod:`.fit` — the HMC / NUTS fit that assembles them (:func:`~inference.mcmc.fit.fit_chains`).

The backends :mod:`inference.backends.hmc` hold the options and run :func:`~inference.mcmc.fit.fit_chains`;
docs/mcmc.md describes the algorithms and their measured behaviour.
"""
from inference.mcmc.adaptation import Adaptation, adaptation_windows, dual_averaging, find_step_size, welford_covariance, window_adaptation
from inference.mcmc.driver import ChainRun, run_chains, thinned
from inference.mcmc.integrators import IntegratorState, leapfrog
from inference.mcmc.kernels import HMCState, build_hmc, build_nuts
from inference.mcmc.mass_matrix import Metric, euclidean_metric, identity_metric

__all__ = [
    "Adaptation", "adaptation_windows", "dual_averaging", "find_step_size", "welford_covariance", "window_adaptation",
    "ChainRun", "run_chains", "thinned", "IntegratorState", "leapfrog", "HMCState", "build_hmc", "build_nuts",
    "Metric", "euclidean_metric", "identity_metric",
]  # fmt: skip
