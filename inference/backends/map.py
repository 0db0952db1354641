"""The ``map`` backend: the MAP fit of :mod:`inference.optim.map` as a point-mass posterior.

MAP training of the random sites and the likelihood latents (the prior as weight decay, the noise
learned), deterministic parameters jointly as point estimates unless the model froze them; the
objective and the loop are those of :func:`inference.optim.map.fit_map`.

With a likelihood that has a variance head (the heteroscedastic Gaussian), or a model with a trained
deterministic body (a last-layer model) and a learned noise, the number of epochs is chosen on held-out rows and the fit is refitted
on every row for that many (``early_stopping``, default on for such a model: :mod:`inference.optim.early_stopping`;
``info["early_stopping"]`` holds the choice); the configured ``epochs`` are the most it may take.  The fit ends
with the likelihood's latents (the noise) at their MAP for the fitted weights (:func:`inference.optim.map.fit_map`).

The result is a point mass: a :class:`~inference.posterior.SamplePosterior` with one chain
of one draw, so prediction, metrics (with the learned noise), ArviZ export and save/load
are those of every sampler (the export writes the point mass's pointwise log-likelihood so
that ``az.loo`` returns the plug-in score flagged unreliable; :mod:`inference.evaluation.arviz_export`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from inference.optim.early_stopping import EarlyStoppingOptions, choose_epochs, uses_early_stopping
from inference.optim.map import MAPOptions, fit_map, run_info, stack_members
from inference.optim.stacked_map import fit_map_stacked, map_stack_blocker
from inference.optim.training import NonFiniteLossError
from inference.posterior import SamplePosterior
from inference.backends.base import Backend

__all__ = ["MAPConfig", "MAPBackend"]


@dataclass
class MAPConfig(MAPOptions, EarlyStoppingOptions):
    """Options of a MAP fit: the optimiser options of :class:`~inference.optim.training.OptimiserOptions`
    (epochs, batch size, Adam learning rate and schedule, optional gradient clipping) and the held-out choice of
    the epochs (:class:`~inference.optim.early_stopping.EarlyStoppingOptions`)."""

    def validate(self):
        super().validate()
        self.check_early_stopping()


class MAPBackend(Backend):
    """MAP training; the posterior is the point mass at the optimum (1 chain × 1 draw).

    Also fits from a DataLoader's batches (see :func:`~inference.optim.map.fit_map`)."""

    name = "map"
    Config = MAPConfig
    accepts_loader = True
    budget = "map"
    fit_stacked = staticmethod(fit_map_stacked)
    stack_blocker = staticmethod(map_stack_blocker)
    stacks_trained_body = True

    def run(self, bnn, x, y, config: MAPConfig, seed: int, progress: bool) -> SamplePosterior:
        started = time.perf_counter()
        extra = {}
        if uses_early_stopping(bnn, config, x):
            epochs, extra["early_stopping"] = choose_epochs(
                lambda xk, yk, stop: fit_map(bnn, xk, yk, replace(config, early_stopping=False), seed, progress,
                                             desc="map (held-out epochs)", stop=stop),
                bnn, x, y, config.epochs, config, seed)
            config = replace(config, epochs=epochs, early_stopping=False)
        try:
            fit = fit_map(bnn, x, y, config, seed, progress, desc=f"map ({bnn.num_random} random)")
        except NonFiniteLossError as error:
            last = error.posterior
            error.posterior = SamplePosterior(bnn, stack_members([last]), info=run_info(
                self.name, config, seed, x, started, history=last.history, **extra))
            raise
        return SamplePosterior(bnn, stack_members([fit]), info=run_info(
            self.name, config, seed, x, started, history=fit.history, **extra))
