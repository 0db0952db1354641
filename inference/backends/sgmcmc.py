"""The SG-MCMC backends: ``sgld``, ``psgld``, ``sghmc`` and ``csgmcmc``.

This module holds the backends: each names its options (:mod:`inference.sgmcmc.config`) and its
:class:`~inference.sgmcmc.fit.Sampler` (the kernel of :mod:`inference.sgmcmc.updates`: SGLD, Welling & Teh 2011;
pSGLD, Li et al. 2016; SGHMC, Chen et al. 2014; cyclical SG-MCMC, Zhang et al. 2020; its default step rule and
kept steps), and declares what it can do; the algorithm — the start, the step size from the curvature, the
chains and their back-off — is assembled from the parts of :mod:`inference.sgmcmc` by
:func:`inference.sgmcmc.fit.fit_sgmcmc`, K fits at once by :func:`inference.sgmcmc.fit.fit_sgmcmc_stacked` (their
module docstring describes them step by step).
"""
from __future__ import annotations

from typing import Optional

import torch

from inference.sgmcmc.config import CyclicalConfig, PSGLDConfig, SGHMCConfig, SGLDConfig, SGMCMCConfig
from inference.sgmcmc.fit import (
    CyclicalSampler, PSGLDSampler, Sampler, SGHMCSampler, SGLDSampler, fit_sgmcmc, fit_sgmcmc_stacked,
)  # fmt: skip
from inference.posterior import SamplePosterior
from inference.optim.start import start_stack_blocker
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


# ---------------------------------------------------------------------- backends
class SGMCMCBackend(Backend):
    """Base of the SG-MCMC backends: options and a :class:`~inference.sgmcmc.fit.Sampler`.

    ``run`` also takes a DataLoader's batches (:class:`~inference.optim.batches.LoaderBatches`, ``y``
    ``None``): each step, and each step of the MAP initialisation, takes the loader's next batch
    (its order and batch size; ``config.batch_size`` is not used), the likelihood scaled by N/n
    with N = ``len(loader.dataset)``."""

    accepts_loader = True
    stacks_trained_body = True
    sampler: Sampler

    def run(self, bnn, x, y, config, seed: int, progress: bool) -> SamplePosterior:
        return fit_sgmcmc(bnn, x, y, config, seed, progress, self.name, self.sampler)

    def stack_blocker(self, bnn, config) -> Optional[str]:
        if config.init != "map" or config.map_steps <= 0:
            return f"{self.name} starts from the network's weights (init={config.init!r}, " \
                   f"map_steps={config.map_steps}): no MAP start to stack"
        return start_stack_blocker(bnn, config.init, config.map_steps)

    def fit_stacked(self, bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool) -> list:
        """K fits (:func:`inference.fit_many`): :func:`~inference.sgmcmc.fit.fit_sgmcmc_stacked`."""
        return fit_sgmcmc_stacked(bnns, xs, ys, config, seeds, progress, self.name, self.sampler)


class SGLDBackend(SGMCMCBackend):
    name = "sgld"
    Config = SGLDConfig
    sampler = SGLDSampler()


class PSGLDBackend(SGMCMCBackend):
    name = "psgld"
    Config = PSGLDConfig
    sampler = PSGLDSampler()


class SGHMCBackend(SGMCMCBackend):
    name = "sghmc"
    Config = SGHMCConfig
    sampler = SGHMCSampler()


class CyclicalSGMCMCBackend(SGMCMCBackend):
    """Cyclical SG-MCMC (Zhang et al. 2020, Alg. 1); see :func:`inference.sgmcmc.updates.cyclical`."""

    name = "csgmcmc"
    Config = CyclicalConfig
    sampler = CyclicalSampler()
