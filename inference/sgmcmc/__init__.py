"""Stochastic-gradient MCMC: SGLD (Welling & Teh 2011), pSGLD (Li et al. 2016), SGHMC (Chen, Fox &
Guestrin 2014) and cyclical SG-MCMC (Zhang et al. 2020), over a batch of ``C`` chains stacked as ``[C, D]``.

* :mod:`.updates` — the kernels as ``build(...) -> (init, update)`` pairs, and step-size schedules;
* :mod:`.step_sizes` — default step sizes from the curvature at the start point;
* :mod:`.runner` — minibatch gradient estimates, the curvature-based default step at the start
  point, the kept steps of cyclical SG-MCMC, and the run of a kernel's chains (on
  :func:`inference.mcmc.driver.run_chains`) into a posterior;
* :mod:`.pyro_kernels` — the same samplers as Pyro ``MCMCKernel`` s for ``pyro.infer.MCMC`` (:mod:`.pyro_potential`: the
  model's log density they sample);
* :mod:`.stability` — the chains' start jitter, the collapse check and the step back-off;
* :mod:`.config` — the samplers' options;
* :mod:`.fit` — what tells the samplers apart (:class:`~inference.sgmcmc.fit.Sampler`: kernel, default step
  rule, kept steps) and the fit that assembles these parts, single and stacked (its MAP starts stacked).

The backends :mod:`inference.backends.sgmcmc` name a sampler and its options and run :func:`~inference.sgmcmc.fit.fit_sgmcmc`.
"""
from inference.sgmcmc.updates import Kernel, cosine_cycle, cyclical, polynomial_decay, psgld, sghmc, sgld

__all__ = ["Kernel", "cosine_cycle", "cyclical", "polynomial_decay", "psgld", "sghmc", "sgld"]
