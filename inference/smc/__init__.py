"""Tempered sequential Monte Carlo (SMC) from named parts, over a population of ``N`` particles ``[N, D]``.

* :mod:`.tempering` — the conditional ESS and the next inverse temperature by bisection (Jasra et al. 2011;
  Zhou, Johansen & Aston 2016), the log evidence increment.
* :mod:`.resampling` — systematic resampling (Kitagawa 1996; Carpenter, Clifford & Fearnhead 1999), the ESS.
* :mod:`.mutation` — HMC moves on π_β tuned from the population (diagonal metric from the particle variance,
  step size from the acceptance; Buchholz, Chopin & Jacob 2021), built on :mod:`inference.mcmc`'s kernel.
* :mod:`.sampler` — one stage and the driver loop, ``build_smc(...) -> (init, step)`` and ``run_smc`` (Del Moral,
  Doucet & Jasra 2006; Chopin 2002).
* :mod:`.fit` — a run on a :class:`~zoo.bnn.BayesianNetwork`'s posterior over the potential of
  :class:`inference.optim.potential.Potential` (:func:`~inference.smc.fit.smc_posterior`).

SMC is not a ``fit`` backend: it builds the reference posteriors of multimodal every-weight networks
(:mod:`lab.references`), where independent runs agree on the weights of modes that NUTS chains never cross.
"""
from inference.smc.fit import SMCConfig, prior_particles, smc_posterior
from inference.smc.mutation import adapt_step_size, mutate, population_metric, tempered_value_and_grad
from inference.smc.resampling import effective_sample_size, systematic_resample
from inference.smc.sampler import SMCRun, SMCState, build_smc, check_smc_options, run_smc
from inference.smc.tempering import conditional_ess, log_evidence_increment, next_temperature

__all__ = [
    "SMCConfig", "prior_particles", "smc_posterior", "adapt_step_size", "mutate", "population_metric",
    "tempered_value_and_grad", "effective_sample_size", "systematic_resample", "SMCRun", "SMCState", "build_smc",
    "check_smc_options", "run_smc", "conditional_ess", "log_evidence_increment", "next_temperature",
]  # fmt: skip
