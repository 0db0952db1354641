"""The sampler's starting point: the network's current weights, or the ``map`` backend's MAP fit.

:func:`initial_point` returns one unconstrained vector ``z`` ``[D]`` of a
:class:`~inference.optim.potential.Potential` (HMC, NUTS, SG-MCMC, Laplace): ``"current"`` keeps the
network's weights and sets the likelihood latents to their prior medians; ``"map"`` is the project's one
MAP fit, :func:`inference.optim.map.fit_map` — minibatch Adam on the likelihood's training objective plus
the log prior, the deterministic parameters trained jointly when the model trains them — for a budget
of about ``map_steps`` steps.  A DataLoader's batches (:class:`~inference.optim.batches.LoaderBatches`)
are used as they come, and the full-data log density of the record is summed over one pass
(:func:`epoch_log_density`).  A ``watch`` (a sampler's time budget, :func:`inference.mcmc.budget.start_budget`)
sees each of the start's MAP runs announced as a :class:`StartRun` and every Adam step after it.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable, NamedTuple, Optional

import pyro
import torch

from inference.optim.batches import LoaderBatches
from inference.optim.early_stopping import EarlyStoppingOptions, choose_epochs, default_patience, trains_body, \
    uses_early_stopping
from inference.optim.latent_fit import latents_at_map
from inference.optim.map import MAPOptions, fit_map
from inference.optim.potential import Potential
from inference.optim.training import NonFiniteLossError

__all__ = ["INIT_STRATEGIES", "MAP_BATCH_SIZE", "START_EARLY_STOPPING", "StartRun", "batches_per_epoch", "map_budget",
           "held_out_trial", "initial_point", "endless_batches", "epoch_log_density", "trains_body", "start_stack_blocker"]

#: the ``init`` values of :func:`initial_point`
INIT_STRATEGIES = ("map", "current")
#: the start's minibatch size: the ``map`` backend's default
MAP_BATCH_SIZE = MAPOptions.batch_size
#: the held-out choice of the start's epochs: the ``map`` backend's default options
#: (:class:`~inference.optim.early_stopping.EarlyStoppingOptions`)
START_EARLY_STOPPING = EarlyStoppingOptions()



class StartRun(NamedTuple):
    """One MAP run of a start, as :func:`initial_point` announces it to its ``watch``.

    Attributes:
        desc: the run (``"MAP start"``, or ``"MAP start (held-out epochs)"`` for the held-out trial).
        steps: its Adam steps; for the held-out trial the fewest it can take (it stops once ``patience`` epochs
            pass without a better held-out score: :func:`held_out_trial`).
        later_steps: the fewest Adam steps of the start's runs after it (the refit after the trial: one epoch).
        batch_rows: rows per step (``None``: a DataLoader's batches).
    """

    desc: str
    steps: int
    later_steps: int
    batch_rows: Optional[int]


def held_out_trial(num_data: int, epochs: int) -> StartRun:
    """The held-out trial of a start of at most ``epochs`` epochs on ``num_data`` rows, as its watch sees it: on the
    kept rows (:func:`~inference.optim.early_stopping.held_out_split`) for at least ``min(epochs, patience + 1)``
    epochs (:class:`~inference.optim.early_stopping.ValidationMonitor` stops it no sooner), then at least one epoch
    of the refit on every row."""
    options = START_EARLY_STOPPING
    patience = int(options.patience) if options.patience is not None else default_patience(epochs)
    kept = max(1, int((1 - options.validation_fraction) * num_data))
    return StartRun("MAP start (held-out epochs)", min(epochs, patience + 1) * batches_per_epoch(kept),
                    batches_per_epoch(num_data), min(MAP_BATCH_SIZE, kept))


def start_stack_blocker(bnn, init: str, map_steps: int) -> Optional[str]:
    """Why a fit's MAP start cannot be one of K stacked starts (:func:`inference.optim.stacked_map.fit_map_starts`),
    or ``None``: a start that chooses its epochs on its own held-out rows (:func:`initial_point`: a model with a
    trained deterministic body or a variance head)."""
    if init == "map" and map_steps > 0 and uses_early_stopping(bnn, START_EARLY_STOPPING):
        return ("the MAP start chooses its epochs on its own held-out rows (a trained body setting a learned noise, or a "
                "variance head), then refits for that many")
    return None


def endless_batches(data: LoaderBatches, generator: torch.Generator):
    """``(x_batch, y_batch)`` of ``data``'s epochs, one after another, without end."""
    while True:
        yield from data.epoch(generator)


def epoch_log_density(potential: Potential, z: torch.Tensor, data: LoaderBatches) -> torch.Tensor:
    """``[*batch]`` log π(z) of ``z`` ``[*batch, D]`` on the full data, from one pass over ``data``.

    Batch b of n_b rows gives the prior plus (N/n_b) times its log-likelihood; the weights n_b/N
    (summing to 1) make the sum over the pass the exact full-data density.
    """
    total = 0.0
    for x, y in data.epoch(torch.Generator()):  # a loader keeps its own order; the generator is not used
        total = total + potential.batch_log_density(z, x, y) * (x.shape[0] / potential.num_data)
    return total


def batches_per_epoch(num_data: int, num_batches: Optional[int] = None) -> int:
    """A DataLoader's ``num_batches``, or the batches of :data:`MAP_BATCH_SIZE` rows in ``num_data``."""
    return num_batches if num_batches is not None else math.ceil(num_data / min(MAP_BATCH_SIZE, num_data))


def map_budget(num_data: int, epochs: Optional[int] = None) -> int:
    """The ``map`` backend's number of Adam steps on ``num_data`` rows: ``epochs`` (``None``: its default,
    :class:`~inference.optim.map.MAPOptions`) of minibatches of :data:`MAP_BATCH_SIZE` rows.  The one MAP
    budget: Laplace's MAP when its ``map_steps`` is ``None``, and in a lab run the ``map`` run's budget
    (``lab.runs.spec.map_backend_steps`` passes the epochs the run gives the ``map`` backend)."""
    return (MAPOptions().epochs if epochs is None else epochs) * batches_per_epoch(num_data)


def map_epochs(num_data: int, num_batches: Optional[int], map_steps: int) -> int:
    """Epochs of about ``map_steps`` minibatch steps: ``⌈map_steps / batches per epoch⌉`` (at least 1), batches
    of :data:`MAP_BATCH_SIZE` rows (or a DataLoader's ``num_batches``)."""
    return max(1, math.ceil(map_steps / batches_per_epoch(num_data, num_batches)))


def initial_point(
    potential: Potential, init: str, map_steps: int, map_lr: float, progress: bool = False, seed: int = 0,
    data: Optional[LoaderBatches] = None, fitted: Optional[dict] = None,
    watch: Optional[Callable[[StartRun], Callable[[], None]]] = None,
) -> tuple[torch.Tensor, dict]:
    """Starting point ``z`` ``[D]`` and a record of how it was found.

    ``"current"``: the network's current weights and the latents' prior medians.
    ``"map"``: from there, :func:`~inference.optim.map.fit_map` with the ``map`` backend's options
    (:class:`~inference.optim.map.MAPOptions`: minibatches of :data:`MAP_BATCH_SIZE`, Adam, cosine-decayed
    rate) at learning rate ``map_lr`` for :func:`map_epochs` epochs (about ``map_steps`` steps; ``seed``
    orders the minibatches) — the same optimum as the ``map`` backend's, with the likelihood's training
    objective (the β-NLL of a heteroscedastic likelihood, Seitzer et al. 2022), which ends with the likelihood's
    latents set to their MAP for the fitted weights (:func:`~inference.optim.latent_fit.latents_at_map`: a
    budget of minibatch steps leaves a noise precision behind its optimum — energy: 232 against 680 — and the
    samplers that barely move it, SG-MCMC and Laplace, would over-cover); the chains then target the
    density itself.  A budget of minibatch steps, not a fit to convergence: a MAP converged on the
    training rows overfits the deterministic body of a last-layer model, and the noise fitted to its
    residuals then under-covers (energy, NUTS on the last layer: coverage_90 0.70 from a converged
    full-batch start, 0.88 from this one; docs/mcmc.md).  Deterministic parameters the model trains are
    optimised jointly and then kept at their fitted values (written into the network) — the samplers and
    Laplace never move them, so when the model trains such a body and the likelihood learns its noise from the
    body's residuals (:func:`~inference.optim.early_stopping.noise_follows_body`) — or the likelihood has a variance
    head: the ``map`` backend's rule, :func:`~inference.optim.early_stopping.uses_early_stopping` — and
    the data are tensors, the budget is only the most it may take: the epochs are chosen on held-out rows
    (:func:`~inference.optim.early_stopping.choose_epochs` with the ``map`` backend's defaults,
    :data:`START_EARLY_STOPPING`: a fifth of the rows held out, for a body the epoch of the best held-out
    log-likelihood, then a refit on every row for that many; ``record["early_stopping"]``).  A fixed budget fits the body as long on 300 rows as on 30 000: the GRU shape of
    ``benchmarks/defaults.py`` (300 sequences, head stochastic) reached training RMSE 0.043 and test RMSE 0.18
    after the 400 epochs of 2000 steps, the noise fitted to those residuals, and every sampler covered 36–39 %
    at 90 %; the held-out choice (84 epochs) gives training RMSE 0.11, test 0.128.  A non-finite loss
    stops the fit at the last finite point.  With ``data`` (the potential built on a DataLoader) the
    loader's batches are used, and the record's log density is summed over one pass
    (:func:`epoch_log_density`).

    ``fitted``: the site values ``fit_map`` returns for this start (``{site: value}``; the deterministic
    parameters already in the network), computed elsewhere — K starts stacked by
    :func:`inference.optim.stacked_map.fit_map_starts` — and used instead of fitting here.

    ``watch``: ``watch(run) -> on_step`` before each MAP run (:class:`StartRun`), ``on_step()`` after each of its
    Adam steps; what ``on_step`` raises ends the start (a sampler's time budget,
    :func:`inference.mcmc.budget.start_budget`).  Not called for ``fitted`` values or without a MAP fit.

    The record holds ``init``, ``init_log_density`` and, for a MAP fit, ``map_steps`` (the budget in whole
    epochs), ``map_seconds`` and ``map_lr``.
    """
    if init not in INIT_STRATEGIES:
        raise ValueError(f"unknown init {init!r}; valid: {', '.join(INIT_STRATEGIES)}")
    bnn = potential.bnn
    record = {"init": init}

    def log_density(z):
        with torch.no_grad(), pyro.validation_enabled(False):
            density = potential.log_density(z) if data is None else epoch_log_density(potential, z, data)
        return float(density)

    if init == "current" or map_steps <= 0:
        z = potential.pack({**bnn.initial_values(), **potential.latent_init()}).detach()
        record["init_log_density"] = log_density(z.unsqueeze(0))
        return z, record
    started = time.perf_counter()
    num_batches = data.steps_per_epoch if data is not None else None
    epochs = map_epochs(potential.num_data, num_batches, map_steps)
    options = MAPOptions(epochs=epochs, lr=map_lr, batch_size=None if data is not None else MAP_BATCH_SIZE)
    x, y = (data, None) if data is not None else (potential.x, potential.y)
    if fitted is not None:  # this very fit, done elsewhere (the stacked engine's, inference.multifit)
        values = dict(fitted)
    else:
        if data is None and uses_early_stopping(bnn, START_EARLY_STOPPING, x):  # the map backend's rule
            trial = held_out_trial(potential.num_data, epochs)

            def held_out(x_kept, y_kept, stop):
                try:
                    fit_map(bnn, x_kept, y_kept, options, seed, progress, desc=trial.desc, stop=stop,
                            on_step=None if watch is None else watch(trial))
                except NonFiniteLossError:  # the held-out curve up to the last finite epoch chooses
                    pass

            epochs, record["early_stopping"] = choose_epochs(
                held_out, bnn, x, y, epochs, START_EARLY_STOPPING, seed)
            options = replace(options, epochs=epochs)
        run = StartRun("MAP start", epochs * batches_per_epoch(potential.num_data, num_batches), 0,
                       None if data is not None else min(MAP_BATCH_SIZE, potential.num_data))
        try:
            values = fit_map(bnn, x, y, options, seed, progress, desc=run.desc,  # latents at their MAP
                             on_step=None if watch is None else watch(run)).values
        except NonFiniteLossError as err:  # the last finite point, its latents at their MAP for its weights
            values = err.posterior.values
            batches = [(x, y)] if data is None else data.epoch(torch.Generator())  # a loader keeps its own order
            values.update(latents_at_map(bnn, values, batches))
    z = potential.pack(values).detach()
    steps = epochs * batches_per_epoch(potential.num_data, num_batches)
    record.update(map_steps=steps, map_lr=map_lr, map_seconds=time.perf_counter() - started,
                  init_log_density=log_density(z.unsqueeze(0)))
    return z, record
