"""K MAP fits (the ``map`` backend, :func:`inference.backends.map.fit_map`) as one stacked program.

Fit k maximises its own ``log p(w_s, θ) + (N/n) Σ_batch log p(y | x, w_s, θ)`` from its own start
(its network's weights, the latents at their prior medians) on its own data and minibatch order
(seed k); the stacked loop (:mod:`inference.multifit.stacked`) gives each fit the update it
would get alone.  The result of fit k is what ``fit(bnns[k], xs[k], ys[k], backend="map",
seed=seeds[k])`` returns, up to float rounding: a point mass (one chain of one draw).
"""
from __future__ import annotations

import time

import pyro
import torch
from torch.distributions import biject_to

from ..backends.map import MAPFit, run_info, stack_members
from ..posterior import SamplePosterior
from ..potential import Potential
from ..training import HISTORY_KEYS, NonFiniteLossError
from .stacked import StackedBatches, run_stacked_loop, stacked_forward

__all__ = ["fit_map_stacked"]


def fit_map_stacked(bnns: list, xs: torch.Tensor, ys: torch.Tensor, config, seeds: list, progress: bool) -> list:
    """K MAP fits; returns per fit a :class:`~inference.posterior.SamplePosterior` or, for a fit stopped
    by a NaN/inf, a :class:`~inference.training.NonFiniteLossError` carrying its last finite posterior.

    Args:
        bnns: K models of one architecture, priors and likelihood (:func:`inference.multifit.check_batchable`).
        xs, ys: the fits' training data stacked ``[K, N, ...]`` (validated, on the models' device).
        config: the :class:`~inference.backends.map.MAPConfig`.
        seeds: K seeds (each fit's minibatch order).
        progress: show a tqdm bar.
    """
    started = time.perf_counter()
    template, count = bnns[0], len(bnns)
    potential = Potential(template, xs[0], ys[0])  # site layout, priors and the latents' starting values
    latent_start = potential.latent_init()
    names = template.site_names
    transforms = {name: biject_to(potential.priors[name].support) for name in names}
    starts = [{**bnn.initial_values(), **latent_start} for bnn in bnns]
    raw = {name: torch.stack([transforms[name].inv(start[name].to(xs)) for start in starts]).detach().clone()
           .requires_grad_(True) for name in names}
    priors = potential.priors
    forward = stacked_forward(template)
    num_data = xs.shape[1]
    generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    data = StackedBatches(xs, ys, config.batch_size, generators)
    histories = [{key: [] for key in HISTORY_KEYS} for _ in bnns]
    snapshots: dict = {}

    def values() -> dict:
        return {name: transforms[name](raw[name]) for name in names}

    def step_terms(xb, yb):
        current = values()
        f = forward({s.name: current[s.name] for s in template.sites}, xb)
        log_lik = template.likelihood.training_log_prob(f, yb, template.latents_of(current))
        log_lik = log_lik.reshape(count, -1).sum(1)
        log_prior = sum(priors[name].log_prob(value).reshape(count, -1).sum(1) for name, value in current.items())
        return (num_data / xb.shape[1]) * log_lik, -log_prior

    def on_stop(k, step, what):
        with torch.no_grad():
            snapshots[k] = (step, what, {name: value[k].detach().clone() for name, value in values().items()})

    with pyro.validation_enabled(False):
        stopped = run_stacked_loop(step_terms, list(raw.values()), data, config.loop_options(), histories,
                                   f"map x{count} ({template.num_random} random)", progress, on_stop)
    seconds = (time.perf_counter() - started) / count
    with torch.no_grad():
        final = values()
    results = []
    for k, bnn in enumerate(bnns):
        fitted = snapshots[k][2] if k in snapshots else {name: final[name][k].detach().clone() for name in names}
        info = run_info("map", config, int(seeds[k]), xs[k], started, history=histories[k],
                        multifit={"fits": count, "index": k})
        info["fit_seconds"] = seconds  # this fit's share of the batch's wall time
        posterior = SamplePosterior(bnn, stack_members([MAPFit(fitted, histories[k])]), info=info)
        if stopped[k] is not None:
            error = NonFiniteLossError(stopped[k], snapshots[k][1], posterior)
            results.append(error)
        else:
            results.append(posterior)
    return results
