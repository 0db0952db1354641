"""The sampler's starting point: the network's current weights, or a quick MAP fit.

:func:`initial_point` returns one unconstrained vector ``z`` ``[D]`` of a
:class:`~inference.optim.potential.Potential` (HMC, NUTS, SG-MCMC, Laplace): ``"current"`` keeps the
network's weights and sets the likelihood latents to their prior medians; ``"map"`` runs Adam on
−log π(z)/N from there, the deterministic parameters trained jointly when the model trains them,
for a fixed number of cosine-decayed steps or until :class:`PlateauStop` says it has converged.
A DataLoader's batches (:class:`~inference.optim.batches.LoaderBatches`) are taken one after
another (:func:`endless_batches`), and the full-data log density is summed over one pass
(:func:`epoch_log_density`).
"""
from __future__ import annotations

import math
import time
from functools import partial
from typing import Optional

import pyro
import torch
from tqdm.auto import tqdm

from inference.optim.batches import LoaderBatches
from inference.optim.lean_adam import LeanAdam
from inference.optim.potential import Potential

__all__ = ["INIT_STRATEGIES", "initial_point", "PlateauStop", "endless_batches", "epoch_log_density"]

#: the ``init`` values of :func:`initial_point`
INIT_STRATEGIES = ("map", "current")


def _map_loss(potential: Potential, z: torch.Tensor) -> torch.Tensor:
    return _map_batch_loss(potential, z, potential.x, potential.y)


def _map_batch_loss(potential: Potential, z: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """−(training objective + log prior)/N at ``z`` ``[D]``: the MAP of the ``map`` backend."""
    return -potential.batch_log_density(z.unsqueeze(0), x, y, training=True).squeeze(0) / potential.num_data


#: the converging MAP start (``tol`` > 0): window of steps whose mean loss is compared, windows without
#: an improvement before the rate is halved, and halvings before the fit counts as converged
MAP_WINDOW, MAP_PATIENCE, MAP_HALVINGS = 100, 2, 5


class PlateauStop:
    """Convergence of a noisy descent: the learning rate halves on a plateau, the fit stops after
    ``halvings`` of them.

    Every ``window`` steps the mean loss of the window is compared with the best window mean so
    far; it improves when it falls by more than ``tol``·(1 + |best|) (a relative change, with an
    absolute floor for losses near 0).  After ``patience`` windows without an improvement the rate
    is halved (Adam's iterates then settle; a constant rate keeps them oscillating on a ReLU
    network's kinks); after the ``halvings``-th halving the fit has converged.

    Args:
        lr: the starting rate; ``tol`` > 0.
    """

    def __init__(self, lr: float, tol: float, window: int = MAP_WINDOW, patience: int = MAP_PATIENCE,
                 halvings: int = MAP_HALVINGS):
        self.lr, self.tol, self.window, self.patience, self.halvings = lr, tol, window, patience, halvings
        self.best, self.bad, self.halved, self.sum, self.count = math.inf, 0, 0, 0.0, 0

    def update(self, loss) -> bool:
        """Record one step's loss (a float or 0-d tensor, read to the host once per window); ``True`` once
        converged.  ``self.lr`` is the rate for the next step."""
        self.sum, self.count = self.sum + loss, self.count + 1
        if self.count < self.window:
            return False
        mean, self.sum, self.count = float(self.sum) / self.window, 0.0, 0
        if mean < self.best - self.tol * (1 + abs(self.best)) or self.best == math.inf:
            self.best, self.bad = mean, 0
            return False
        self.bad += 1
        if self.bad < self.patience:
            return False
        self.bad, self.halved, self.lr = 0, self.halved + 1, self.lr / 2
        return self.halved >= self.halvings


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


def initial_point(
    potential: Potential, init: str, map_steps: int, map_lr: float, progress: bool = False, tol: float = 0.0,
    data: Optional[LoaderBatches] = None,
) -> tuple[torch.Tensor, dict]:
    """Starting point ``z`` ``[D]`` and a record of how it was found.

    ``"current"``: the network's current weights and the latents' prior medians.
    ``"map"``: from there, Adam (:class:`~inference.optim.lean_adam.LeanAdam`, the training loop's
    optimiser) on −log π(z)/N (the MAP in unconstrained coordinates) with the likelihood's training
    objective — the same optimum as the ``map`` backend's, i.e. the β-NLL one of a heteroscedastic
    likelihood, whose density alone lets the variance head starve the mean (Seitzer et al. 2022);
    the chains then target the density itself; deterministic parameters
    the model trains are optimised jointly and then kept at their fitted values (written into the
    network).  With ``tol`` = 0, exactly ``map_steps`` steps at a cosine-decayed rate (``map_lr``
    to ``map_lr``/10); with ``tol`` > 0 at most ``map_steps`` steps, stopping on convergence
    (:class:`PlateauStop`: the rate halves whenever the loss, averaged over windows of
    ``MAP_WINDOW`` steps, stops falling by more than ``tol`` relative; converged after
    ``MAP_HALVINGS`` halvings).  Eager, never compiled: a converging start takes a few thousand
    steps, fewer than a compile of the loss and its gradient pays for (docs/mcmc.md).  A
    non-finite loss stops the fit at the last finite snapshot (taken every 100 steps).  With
    ``data`` (the potential built on a DataLoader) each step takes the loader's next batch
    instead, and the record's log density is summed over one pass (:func:`epoch_log_density`).

    The record holds ``init``, ``init_log_density`` and, for a MAP fit, ``map_steps`` (the steps
    taken), ``map_converged``, ``map_seconds`` and ``map_lr``.
    """
    if init not in INIT_STRATEGIES:
        raise ValueError(f"unknown init {init!r}; valid: {', '.join(INIT_STRATEGIES)}")
    bnn = potential.bnn
    values = {**bnn.initial_values(), **potential.latent_init()}
    z = potential.pack(values).detach()
    record = {"init": init}

    def log_density(z):
        return potential.log_density(z) if data is None else epoch_log_density(potential, z, data)

    if init == "current" or map_steps <= 0:
        with torch.no_grad(), pyro.validation_enabled(False):
            record["init_log_density"] = float(log_density(z.unsqueeze(0)))
        return z, record
    started = time.perf_counter()
    z = z.clone().requires_grad_(True)
    params = [z] + bnn.deterministic_parameters()
    optimizer = LeanAdam(torch.optim.Adam(params, lr=map_lr))
    plateau = PlateauStop(map_lr, tol) if tol > 0 else None
    scheduler = None if plateau else torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer.optimizer, T_max=map_steps, eta_min=map_lr * 0.1)
    if data is None:
        loss_fn = partial(_map_loss, potential)
    else:
        batches = endless_batches(data, torch.Generator())

        def loss_fn(z):
            return _map_batch_loss(potential, z, *next(batches))

    snapshot, converged, taken = [p.detach().clone() for p in params], False, 0
    bar = tqdm(range(map_steps), desc="MAP start", disable=not progress, leave=False)
    with pyro.validation_enabled(False):
        for step in bar:
            loss = loss_fn(z)
            if not torch.isfinite(loss):
                break
            if step % 100 == 0:
                snapshot = [p.detach().clone() for p in params]
                bar.set_postfix(loss=f"{float(loss.detach()):.4g}", lr=f"{optimizer.param_groups[0]['lr']:.2g}", refresh=False)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            taken = step + 1
            if plateau is None:
                scheduler.step()
            elif plateau.update(loss.detach()):
                converged = True
                break
            else:
                optimizer.param_groups[0]["lr"] = plateau.lr
        else:
            snapshot = None
        if snapshot is None or converged:
            snapshot = [p.detach().clone() for p in params]
        bar.close()
        with torch.no_grad():
            for p, value in zip(params, snapshot):
                p.copy_(value)
            record.update(map_steps=taken, map_converged=converged, map_lr=map_lr,
                          map_seconds=time.perf_counter() - started, init_log_density=float(log_density(z.unsqueeze(0))))
    return z.detach().clone(), record
