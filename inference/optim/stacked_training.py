"""The stacked training loop: K fits' parameters ``[K, ...]``, one optimiser — :func:`run_stacked_loop`, the
loop of :func:`inference.optim.training.run_training_loop` for K fits at once (the stacked MAP, SVI and
Radial fits run it; their data and forward pass are :mod:`inference.multifit.stacked`).

Why each fit gets the update it would get alone:

* the loss is the sum Σ_k L_k of the fits' own losses, and L_k depends on row k only, so
  ∂(Σ L)/∂θ_k = ∂L_k/∂θ_k;
* Adam is element-wise and the learning-rate schedule the same for every fit (same options,
  same data size N, hence the same number of steps), so row k's update is fit k's update;
* gradient-norm clipping (``clipped-adam``) and the NaN/inf checks are per fit: a fit whose loss
  or gradient becomes non-finite is stopped at that step (its last finite parameters are kept,
  as :class:`~inference.optim.training.NonFiniteLossError` promises) while the others go on;
* each fit's minibatch order comes from its own generator seeded with its seed
  (:class:`~inference.multifit.stacked.StackedBatches`), so the batches are the one-at-a-time fit's.

What differs from K one-at-a-time fits is float rounding only (a batched matrix product sums in
another order than K single ones), which the tests bound.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from zoo.progress import tqdm

from inference.multifit.stacked import StackedBatches
from inference.optim.training import HISTORY_KEYS, kl_weight, lr_scheduler

__all__ = ["run_stacked_loop", "per_fit_norms"]


def per_fit_norms(params: list) -> torch.Tensor:
    """``[K]`` gradient norms of each fit over the stacked ``params`` (each ``[K, ...]``, ``.grad`` set)."""
    total = None
    for p in params:
        if p.grad is None:
            continue
        squares = p.grad.reshape(p.shape[0], -1).pow(2).sum(1)
        total = squares if total is None else total + squares
    return total.sqrt()


def run_stacked_loop(step_terms: Callable, params: list, data: StackedBatches, config, histories: list,
                     desc: str, progress: bool, on_stop: Callable, on_epoch: Optional[Callable] = None) -> list:
    """Train the stacked ``params`` by Adam over the fits' minibatches; the loop of
    :func:`inference.optim.training.run_training_loop` for K fits at once.

    Args:
        step_terms: ``step_terms(x_batch, y_batch) -> (expected_log_likelihood [K], kl [K])``, one draw per
            fit on its own minibatch (the likelihood scaled by N/n), with gradients.
        params: stacked leaf tensors ``[K, ...]`` to optimise.
        data: the fits' :class:`StackedBatches`.
        config: :class:`~inference.optim.training.LoopOptions` (one particle per step: ``num_particles`` > 1
            is averaged as in the one-at-a-time loop).
        histories: K dicts of lists (:data:`inference.optim.training.HISTORY_KEYS`), filled per epoch.
        desc, progress: tqdm label and switch.
        on_stop: ``on_stop(k, step, what)`` when fit k's loss or gradient becomes non-finite, before any
            update with it: the caller keeps fit k's current (last finite) parameters.
        on_epoch: ``on_epoch(epoch, alive)`` after each epoch's history rows (``alive``: the fits not stopped).
    Returns:
        ``[step or None]`` per fit: the step at which it stopped (``None``: it finished).
    """
    count, steps_per_epoch = data.num_fits, data.steps_per_epoch
    optimizer = torch.optim.Adam(params, lr=config.lr, foreach=True)
    scheduler = lr_scheduler(optimizer, config, config.epochs * steps_per_epoch)
    clip = config.clip_norm if config.optimizer == "clipped-adam" else math.inf
    alive = torch.ones(count, dtype=torch.bool, device=params[0].device)
    stopped: list = [None] * count
    step = 0
    for epoch in tqdm(range(config.epochs), desc=desc, disable=not progress):
        sums, beta = torch.zeros(3, count, dtype=torch.float64, device=alive.device), 1.0
        for xb, yb in data.epoch():
            beta = kl_weight(epoch + (step % steps_per_epoch) / steps_per_epoch, config.kl_warmup_epochs,
                             config.kl_anneal_epochs)
            ell, kl = 0.0, 0.0
            for _ in range(config.num_particles):
                draw_ell, draw_kl = step_terms(xb, yb)
                ell, kl = ell + draw_ell / config.num_particles, kl + draw_kl / config.num_particles
            loss = (kl if beta == 1.0 else beta * kl) - ell
            finite = torch.isfinite(loss)
            optimizer.zero_grad()
            torch.where(alive & finite, loss, torch.zeros_like(loss)).sum().backward()
            norms = per_fit_norms(params)
            finite = finite & torch.isfinite(norms)
            if not bool((finite | ~alive).all()):
                for k in (alive & ~finite).nonzero().flatten().tolist():
                    what = "the loss" if not bool(torch.isfinite(loss[k])) else "the gradient"
                    on_stop(k, step, what)
                    stopped[k] = step
                alive = alive & finite
            if math.isfinite(clip):
                scale = (clip / (norms + 1e-6)).clamp(max=1.0)
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(scale.reshape(-1, *([1] * (p.dim() - 1))).to(p.grad.dtype))
            optimizer.step()
            scheduler.step()
            step += 1
            sums += torch.stack([loss.detach(), ell.detach(), kl.detach()]).to(sums.dtype)
        means = (sums / steps_per_epoch).tolist()
        lr = optimizer.param_groups[0]["lr"]
        for k, history in enumerate(histories):
            if stopped[k] is None:
                for key, value in zip(HISTORY_KEYS, (epoch, means[0][k], means[1][k], means[2][k], beta, lr)):
                    history[key].append(value)
        if on_epoch is not None:
            on_epoch(epoch, [k for k in range(count) if stopped[k] is None])
    return stopped
