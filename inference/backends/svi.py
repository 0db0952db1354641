"""Stochastic variational inference with a guide from :data:`inference.guides.GUIDES`
(default: Pyro's mean-field ``AutoNormal``, as :class:`inference.guides.NormalGuide`).

The ELBO is estimated through Pyro traces (:func:`inference.training.trace_particle`) and
optimised by the one training loop, :func:`inference.training.fit_guide` (minibatches, KL
annealing, deterministic pretraining, particle averaging, non-finite checks).  Deterministic
parameters are trained jointly unless the model froze them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..guides import GUIDES
from ..posterior import VariationalPosterior
from ..training import LoopOptions, fit_guide, trace_particle
from .base import Backend

__all__ = ["SVIConfig", "SVIBackend"]


@dataclass
class SVIConfig(LoopOptions):
    """Options of the SVI backend: :class:`~inference.training.LoopOptions` plus the guide.

    Attributes:
        guide: a name in :data:`inference.guides.GUIDES`.
        guide_options: extra keyword arguments for the guide builder.
    """

    guide: str = "normal"
    guide_options: Optional[dict] = None

    def validate(self):
        super().validate()
        if self.guide not in GUIDES:
            raise ValueError(f"unknown guide {self.guide!r}; valid guides: {', '.join(GUIDES)}")


class SVIBackend(Backend):
    name = "svi"
    Config = SVIConfig

    def run(self, bnn, x, y, config: SVIConfig, seed: int, progress: bool) -> VariationalPosterior:
        guide_kwargs = {"init_scale": config.init_scale, **(config.guide_options or {})}
        return fit_guide(
            self.name, bnn, x, y, config, seed, progress, config.guide, guide_kwargs,
            lambda guide, xb, yb, num_data: trace_particle(bnn, guide, xb, yb, num_data),
        )
