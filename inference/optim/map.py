"""MAP optimisation: the fit behind the ``map`` backend and the members of ``ensemble``, ``swag``'s burn-in
and ``mc-dropout``.

MAP (maximum a posteriori) training of the random sites w_s and the likelihood latents θ
(e.g. the noise precision τ), deterministic parameters w_d trained jointly as point
estimates unless the model froze them:

    (ŵ_s, θ̂, ŵ_d) = argmax  log p(w_s) + log p(θ) + Σ_n log p(y_n | x_n, w_s, w_d, θ)

so a Normal(0, σ) weight prior is weight decay 1/(2σ²)·‖w‖² and the noise is learned,
not fixed.  The fit ends with one block-coordinate step on the same objective: the likelihood's latents
set to their MAP for the final weights (:func:`inference.optim.latent_fit.latents_at_map`, L-BFGS on the
training rows), since minibatch Adam on log τ trails its optimum while the weights still move (UCI energy,
split 0, the README's MLP: τ 310 after the 2 000 default steps against 901 at the optimum for those weights;
90 % coverage 0.987 → 0.883, test LL −0.566 → −0.425).  Per minibatch of n out of N the loss is −(N/n) Σ_batch log p(y|x, w, θ) −
log p(w_s, θ), minimised by the one training loop :func:`inference.optim.training.run_training_loop`
(Adam, learning-rate schedule, gradient clipping, NaN/inf stop, progress bar) with a
single particle and no KL annealing; the per-epoch history holds the scaled
log-likelihood as ``expected_log_likelihood`` and the penalty −log p(w_s, θ) as ``kl``.
The log-likelihood term is the likelihood's training objective
(:meth:`zoo.likelihoods.Likelihood.training_log_prob`): log p itself, except the β-NLL of the
heteroscedastic Gaussian (Seitzer et al. 2022); reported densities use log p.
Constrained latents are optimised in unconstrained coordinates (``biject_to`` of the
prior's support) without a Jacobian term, so the optimum is the MAP of the constrained
density.

* :class:`MAPOptions` — the optimiser options of a MAP fit (the ``map`` backend's config and its kin);
* :func:`map_objective` — the objective of one step (single and stacked fits);
* :func:`fit_map` — one MAP fit, a :class:`MAPFit` (the site values and the per-epoch history);
* :func:`stack_members` — K fits as draws ``{site: [K, 1, ...]}`` (one chain per fit);
* :func:`run_info` — the ``posterior.info`` record of a MAP-family fit.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable, Optional

import pyro
import torch
from torch.distributions import biject_to

from inference.optim.batches import as_batches, loader_info
from inference.optim.latent_fit import latents_at_map
from inference.optim.potential import Potential
from inference.optim.training import HISTORY_KEYS, LoopOptions, OptimiserOptions, run_training_loop

__all__ = ["MAPOptions", "MAPFit", "map_objective", "fit_map", "stack_members", "run_info"]


@dataclass
class MAPOptions(OptimiserOptions):
    """Options of a MAP fit: the optimiser options of :class:`~inference.optim.training.OptimiserOptions`
    (epochs, batch size, Adam learning rate and schedule, optional gradient clipping)."""

    def loop_options(self) -> LoopOptions:
        """The :class:`LoopOptions` of these settings (one particle, no KL annealing)."""
        return LoopOptions(**{f.name: getattr(self, f.name) for f in fields(OptimiserOptions)})


@dataclass
class MAPFit:
    """One MAP fit: ``values`` ``{site: site-shaped tensor}`` (constrained) and the per-epoch
    ``history`` (the deterministic parameters are fitted in place, in the network)."""

    values: dict
    history: dict


def map_objective(log_lik: torch.Tensor, values: dict, priors: dict, num_data: int, batch_rows: int,
                  prior_weights: Optional[dict] = None) -> tuple:
    """The one MAP step's objective: ``((N/n) log_lik, −log p(w_s, θ))`` of a minibatch of n of N rows.

    ``log_lik``: Σ_batch of the likelihood's training objective (a scalar, or ``[K]`` for K stacked fits);
    ``values``: ``{site: value}`` (constrained; ``[K, *shape]`` when stacked), ``priors`` their prior
    distributions (event shape = site shape, so ``log_prob`` gives one number per fit); ``prior_weights``
    ``{site: c}`` multiplies a site's log prior (default 1).  Used by :func:`fit_map` and by the stacked MAP
    fits (:mod:`inference.optim.stacked_map`)."""
    log_prior = sum((1.0 if prior_weights is None else prior_weights[n]) * priors[n].log_prob(v)
                    for n, v in values.items())
    return (num_data / batch_rows) * log_lik, -log_prior


def fit_map(
    bnn,
    x: torch.Tensor,
    y: torch.Tensor,
    config: MAPOptions,
    seed: int,
    progress: bool,
    init_values: Optional[dict] = None,
    prior_weights: Optional[dict] = None,
    training_context: Callable = contextlib.nullcontext,
    desc: str = "map",
    stop: Optional[Callable] = None,
    on_step: Optional[Callable[[], None]] = None,
) -> MAPFit:
    """Maximise ``log p(w_s, θ) + Σ log p(y | x, w_s, w_d, θ)``; returns the :class:`MAPFit`.

    Args:
        bnn, x, y: the model and validated training data (standardised targets) ``[N, ...]``, or
            ``x`` a :class:`~inference.optim.batches.LoaderBatches` (``y`` then ``None``; its batches are
            used, ``config.batch_size`` is not, and N is ``len(loader.dataset)``).
        config: the :class:`MAPOptions` (or a config derived from them).
        seed: seeds the minibatch order and any randomness in the training forward pass.
        progress: show a tqdm bar.
        init_values: starting site values (default: the network's weights, the latents' prior medians).
        prior_weights: ``{site: c}`` multiplies site ``s``'s log prior by ``c`` (default 1);
            MC dropout's keep probability (Gal & Ghahramani 2016).
        training_context: a context manager active during the optimisation (e.g. dropout hooks).
        desc: progress-bar label.
        stop: ``stop(epoch, values) -> bool`` after each epoch, ``values`` the current site values ``{site:
            tensor}`` (constrained, detached); ``True`` ends the fit there
            (:class:`~inference.optim.early_stopping.ValidationMonitor`).
        on_step: ``on_step()`` after each Adam step (:func:`~inference.optim.training.run_training_loop`); what it
            raises ends the fit (a sampler's time budget over its MAP start).
    Raises:
        NonFiniteLossError: a NaN/inf loss or gradient; ``.posterior`` holds the last finite point.
    """
    pyro.set_rng_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    data = as_batches(x, y, config.batch_size)
    potential = Potential(bnn, x, y)  # site layout, priors and the latents' starting values
    start = {**bnn.initial_values(), **potential.latent_init(), **(init_values or {})}
    transforms = {name: biject_to(potential.priors[name].support) for name in bnn.site_names}
    raw = {name: transforms[name].inv(start[name]).detach().clone().requires_grad_(True) for name in bnn.site_names}
    weights = {name: float((prior_weights or {}).get(name, 1.0)) for name in bnn.site_names}
    num_data = data.num_data
    history = {key: [] for key in HISTORY_KEYS}

    def values() -> dict:
        return {name: transforms[name](raw[name]) for name in bnn.site_names}

    def particle(xb, yb):
        current = values()
        f = bnn.forward_single({s.name: current[s.name] for s in bnn.sites}, xb)
        log_lik = bnn.likelihood.training_log_prob(f.unsqueeze(0), yb, bnn.latents_of(current)).sum()
        return map_objective(log_lik, current, potential.priors, num_data, xb.shape[0], weights)

    def result() -> MAPFit:
        with torch.no_grad():
            return MAPFit({name: v.detach().clone() for name, v in values().items()}, history)

    with pyro.validation_enabled(False), training_context():
        params = list(raw.values()) + bnn.deterministic_parameters()
        run_training_loop(particle, params, data, config.loop_options(), generator, history, result, desc, progress,
                          objective="log_joint", stop=None if stop is None else lambda epoch: stop(epoch, result().values),
                          on_step=on_step)
    fitted = result()
    fitted.values.update(latents_at_map(bnn, fitted.values, [(x, y)] if y is not None else x.epoch(torch.Generator())))
    return fitted


def stack_members(fits: list[MAPFit]) -> dict:
    """Draws ``{site: [K, 1, *shape]}`` of ``K`` fits (one chain per member, one draw each)."""
    return {name: torch.stack([f.values[name] for f in fits]).unsqueeze(1) for name in fits[0].values}


def run_info(backend: str, config, seed: int, x, started: float, **extra) -> dict:
    """The ``posterior.info`` record of a fit on ``x`` (a tensor, or batches: ``TensorBatches`` or a DataLoader's
    ``LoaderBatches``), the one every backend leaves: ``backend`` (its name), ``config`` (its options as a
    dict), ``seed``, ``num_data`` (N), ``fit_seconds`` (since ``started``, a ``time.perf_counter()``), a
    DataLoader's ``data_loader`` entry, then ``extra`` (which overrides: ``fit_seconds=`` a stacked fit's share
    of its batch's time).  A record made before the fit ends (the training loop fills its ``history``) has
    ``fit_seconds`` set again when the fit ends."""
    num_data = x.shape[0] if isinstance(x, torch.Tensor) else x.num_data
    return {"backend": backend, "config": asdict(config), "seed": seed, "num_data": num_data,
            "fit_seconds": time.perf_counter() - started, **loader_info(x), **extra}
