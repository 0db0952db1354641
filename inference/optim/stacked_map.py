"""K MAP fits (the ``map`` backend, :func:`inference.optim.map.fit_map`) as one stacked program.

Fit k maximises its own ``log p(w_s, θ) + (N/n) Σ_batch log p(y | x, w_s, θ)`` from its own start
(its network's weights or given values, the latents at their prior medians) on its own data and
minibatch order (seed k), with the objective of the one MAP step
(:func:`inference.optim.map.map_objective`); the stacked loop (:mod:`inference.optim.stacked_training`) gives
each fit the update it would get alone.  :func:`fit_map_stacked` returns what ``fit(bnns[k], xs[k], ys[k],
backend="map", seed=seeds[k])`` returns, up to float rounding (a point mass: one chain of one draw); :func:`fit_map_members` the :class:`~inference.optim.map.MAPFit` s of K members of one
model on one data set (the ``ensemble`` backend's members, each its own start and seed);
:func:`train_stacked` the trainer under them (K ``ensemble`` runs' K·M members at once:
:func:`inference.ensembles.stacked.fit_ensemble_stacked`).
"""
from __future__ import annotations

import time
from typing import Optional

import pyro
import torch
from torch.distributions import biject_to

from inference.optim.early_stopping import uses_early_stopping
from inference.multifit.stacked import StackedBatches, stacked_body, stacked_forward, stacked_log_likelihood, write_body
from inference.optim.map import MAPFit, map_objective, run_info, stack_members
from inference.optim.latent_fit import latents_at_map
from inference.optim.potential import Potential
from inference.optim.stacked_training import run_stacked_loop
from inference.optim.training import HISTORY_KEYS, NonFiniteLossError
from inference.posterior import SamplePosterior

__all__ = ["fit_map_stacked", "fit_map_starts", "fit_map_members", "train_stacked", "map_stack_blocker"]


def map_stack_blocker(bnn, config) -> Optional[str]:
    """Why a ``map`` fit cannot join a stacked batch (the backend's own reason), or ``None``."""
    if uses_early_stopping(bnn, config):
        return "the fit chooses its epochs on its own held-out rows (early_stopping), then refits for that many"
    return None


def train_stacked(template, starts: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool,
           desc: str, bnns: Optional[list] = None) -> tuple:
    """Train K MAP fits of ``template``'s layout from ``starts`` (``{site: value}`` each, weights; the latents
    start at their prior medians).  Returns ``(fits, stopped)``: a :class:`MAPFit` per fit (a stopped fit's
    last finite point) and per fit ``None`` or ``(step, what)`` where its loss or gradient became non-finite.
    With ``bnns`` (one model per fit), their trained deterministic parameters (a last-layer model's body) train
    stacked with the sites, and each fit's final (or last finite) values are written into its own network."""
    count = len(starts)
    body = stacked_body(bnns) if bnns is not None else {}
    potential = Potential(template, xs[0], ys[0])  # site layout, priors and the latents' starting values
    latent_start = potential.latent_init()
    names = template.site_names
    transforms = {name: biject_to(potential.priors[name].support) for name in names}
    starts = [{**start, **latent_start} for start in starts]
    raw = {name: torch.stack([transforms[name].inv(start[name].to(xs)) for start in starts]).detach().clone()
           .requires_grad_(True) for name in names}
    priors = potential.priors
    forward = stacked_forward(template, body=bool(body))
    num_data = xs.shape[1]
    data = StackedBatches(xs, ys, config.batch_size, [torch.Generator().manual_seed(int(seed)) for seed in seeds])
    histories = [{key: [] for key in HISTORY_KEYS} for _ in starts]
    snapshots: dict = {}

    def values() -> dict:
        return {name: transforms[name](raw[name]) for name in names}

    def step_terms(xb, yb):
        current = values()
        weights = {s.name: current[s.name] for s in template.sites}
        f = forward(weights, body, xb) if body else forward(weights, xb)
        log_lik = stacked_log_likelihood(template.likelihood, f, yb, template.latents_of(current))
        return map_objective(log_lik, current, priors, num_data, xb.shape[1])  # [K] each: the one MAP step

    def on_stop(k, step, what):
        with torch.no_grad():
            snapshots[k] = (step, what, {name: value[k].detach().clone() for name, value in values().items()},
                            {name: value[k].detach().clone() for name, value in body.items()})

    with pyro.validation_enabled(False):
        stopped = run_stacked_loop(step_terms, list(raw.values()) + list(body.values()), data, config.loop_options(),
                                   histories, desc, progress, on_stop)
    for k, bnn in enumerate(bnns or []):
        write_body(bnn, *((snapshots[k][3], None) if k in snapshots else (body, k)))
    with torch.no_grad():
        final = values()
    fits = [MAPFit(snapshots[k][2] if k in snapshots else {name: final[name][k].detach().clone() for name in names},
                   histories[k]) for k in range(count)]
    for k, fitted in enumerate(fits):  # fit_map's last step: the latents at their MAP for the final weights
        if k not in snapshots:
            fitted.values.update(latents_at_map(bnns[k] if bnns else template, fitted.values, [(xs[k], ys[k])]))
    return fits, [None if step is None else snapshots[k][:2] for k, step in enumerate(stopped)]


def fit_map_stacked(bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool) -> list:
    """K MAP fits; returns per fit a :class:`~inference.posterior.SamplePosterior` or, for a fit stopped
    by a NaN/inf, a :class:`~inference.optim.training.NonFiniteLossError` carrying its last finite posterior.

    Args:
        bnns: K models of one architecture, priors and likelihood (:func:`inference.fitting.batch_signature`).
        xs, ys: the fits' training data stacked ``[K, N, ...]`` (validated, on the models' device).
        config: the :class:`~inference.backends.map.MAPConfig`.
        seeds: K seeds (each fit's minibatch order).
        progress: show a tqdm bar.
    """
    started = time.perf_counter()
    count = len(bnns)
    fits, stopped = fit_map_starts(bnns, xs, ys, config, seeds, progress, f"map x{count} ({bnns[0].num_random} random)")
    seconds = (time.perf_counter() - started) / count
    results = []
    for k, (bnn, fitted) in enumerate(zip(bnns, fits)):
        info = run_info("map", config, int(seeds[k]), xs[k], started, history=fitted.history,
                        multifit={"fits": count, "index": k})
        info["fit_seconds"] = seconds  # this fit's share of the batch's wall time
        posterior = SamplePosterior(bnn, stack_members([fitted]), info=info)
        results.append(posterior if stopped[k] is None else NonFiniteLossError(*stopped[k], posterior))
    return results


def fit_map_starts(bnns: list, xs: torch.Tensor, ys: torch.Tensor, options, seeds: list, progress: bool,
                   desc: str) -> tuple:
    """K MAP fits from the models' own weights, each model's trained body written into its network:
    ``(fits, stopped)`` as :func:`train_stacked` — fit k is :func:`inference.optim.map.fit_map`
    ``(bnns[k], xs[k], ys[k], options, seeds[k])`` to float rounding (the samplers' start, :func:`inference.optim.start.initial_point`)."""
    return train_stacked(bnns[0], [bnn.initial_values() for bnn in bnns], xs, ys, options, seeds, progress, desc, bnns)


def fit_map_members(bnn, x: torch.Tensor, y: torch.Tensor, config, seeds: list, starts: list,
                    progress: bool) -> tuple:
    """K MAP fits of one model on one data set ``x, y`` ``[N, ...]`` from ``starts`` with ``seeds``.

    Member k is :func:`inference.optim.map.fit_map` ``(bnn, x, y, config, seeds[k], init_values=starts[k])``
    to float rounding.  The model must train no deterministic parameters (:func:`inference.fitting.batch_blocker`).
    Returns ``(fits, stopped)``: a :class:`MAPFit` per member and per member ``None`` or the step at which its
    loss or gradient became non-finite (its fit then holds its last finite point).
    """
    count = len(starts)
    xs, ys = x.expand(count, *x.shape), y.expand(count, *y.shape)
    fits, stopped = train_stacked(bnn, starts, xs, ys, config, seeds, progress, f"ensemble x{count} (stacked)")
    return fits, [None if s is None else s[0] for s in stopped]
