"""Dropout on the inputs of whole-weight ``nn.Linear`` layers and its posterior (Gal & Ghahramani 2016).

Dropout with rate p (keep probability q = 1 − p) acts on the inputs of the *dropout layers*: the
``nn.Linear`` layers whose whole weight is a chosen random site (:func:`dropout_layers`).  The fit is
the MAP optimisation of :func:`inference.optim.map.fit_map` with inverted dropout active on those
inputs (fresh per-example masks each step) and those weights' log prior scaled by q
(:func:`fit_dropout_map`; the penalty q·l²/2·‖M‖² of Gal & Ghahramani 2016 for a N(0, l⁻²) prior).

Dropout on a layer's inputs with a mask z ∈ {0, 1}^in shared by all points equals the weight
W·diag(z)/q, so the posterior stores S mask sets as S weight draws of every dropout layer
(:func:`masked_draws`).  The likelihood's latents (a noise precision) learned while dropout perturbs the
training outputs absorb the dropout's own spread, which the mixture over masks then adds again; the
draws' latents are therefore refitted to the MC predictive on the training rows (:func:`predictive_latents`).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from inference.optim.batches import LoaderBatches
from inference.optim.latent_fit import fit_predictive_latents
from inference.optim.map import MAPFit, fit_map

__all__ = ["dropout_layers", "input_dropout", "masked_draws", "fit_dropout_map", "predictive_latents",
           "PREDICTIVE_ROWS"]

#: training rows (at most, the first ones) on which the latents are refitted to the MC predictive
PREDICTIVE_ROWS = 4096


def dropout_layers(bnn) -> dict[str, nn.Linear]:
    """``{site name: layer}`` of the chosen sites that are whole ``nn.Linear`` weights.

    Raises:
        ValueError: no chosen site is one (MC dropout would have nothing to drop).
    """
    layers = {}
    for site in bnn.sites:
        module_name, _, param = site.name.rpartition(".")
        module = bnn.net.get_submodule(module_name) if module_name else bnn.net
        if param == "weight" and site.mask is None and isinstance(module, nn.Linear):
            layers[site.name] = module
    if not layers:
        raise ValueError(
            f"mc-dropout drops the inputs of nn.Linear layers whose whole weight is random; none of the chosen "
            f"sites ({', '.join(s.name for s in bnn.sites) or 'none'}) is one; choose e.g. stochastic='all' or 'last'"
        )
    return layers


@contextlib.contextmanager
def input_dropout(layers, rate: float):
    """Inverted dropout on the inputs of ``layers`` while active (training forward passes)."""
    hooks = [m.register_forward_pre_hook(lambda m, args: (F.dropout(args[0], rate, True), *args[1:]))
             for m in layers]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def masked_draws(point: dict, layers: dict, rate: float, num_samples: int, seed: int) -> dict:
    """``{site: [1, S, *shape]}``: dropout layers' weights W·diag(z_s)/q, z_s ~ Bernoulli(q)^in; others repeated."""
    generator = torch.Generator().manual_seed(seed)
    keep = 1.0 - rate
    draws = {}
    for name, value in point.items():
        if name in layers:
            masks = torch.bernoulli(torch.full((num_samples, value.shape[-1]), keep), generator=generator).to(value)
            draws[name] = (value.unsqueeze(0) * masks.unsqueeze(1) / keep).to(value.dtype)
        else:
            draws[name] = value.unsqueeze(0).expand(num_samples, *value.shape).clone()
    return {name: v.unsqueeze(0) for name, v in draws.items()}


def fit_dropout_map(bnn, x, y, config, layers: dict, rate: float, seed: int, progress: bool) -> MAPFit:
    """The MAP fit with dropout ``rate`` on ``layers`` and the prior scaled by q = 1 − rate (noise learned).

    ``config`` holds the MAP optimiser's options (:class:`~inference.optim.map.MAPOptions`)."""
    return fit_map(bnn, x, y, config, seed, progress, prior_weights={name: 1.0 - rate for name in layers},
                   training_context=lambda: input_dropout(layers.values(), rate), desc=f"mc-dropout (p={rate:g})")


def predictive_latents(bnn, draws: dict, x, y) -> dict:
    """``draws`` with the likelihood's latents replaced, in every draw, by those that maximise the MC
    dropout predictive's log density on the training rows plus their log prior
    (:func:`~inference.optim.latent_fit.fit_predictive_latents`; the first :data:`PREDICTIVE_ROWS` rows).

    Trained under dropout, a learned noise precision τ fits the residuals *of the dropped-out network*,
    so it already holds the spread the mixture over masks adds at prediction: the predictive counts
    that spread twice and over-covers (energy, defaults: coverage_90 1.00).  Gal & Ghahramani 2016 choose
    τ for the predictive on validation data (``protocol="gal2016"``); this is the same criterion on the
    training rows, without a refit.  ``draws`` ``{site: [1, S, ...]}`` (:func:`masked_draws`); ``x`` the
    inputs ``[N, ...]`` and ``y`` the standardised targets ``[N, T]``, or ``x`` a
    :class:`~inference.optim.batches.LoaderBatches` (``y`` ``None``).  No latents: ``draws`` unchanged."""
    latent_names = set(bnn.latent_priors())
    if not latent_names:
        return draws
    xs, ys = _training_rows(x, y)
    with torch.no_grad():  # the masks' outputs as the predictive computes them: one batched pass, prediction mode
        f = bnn.forward_draws({k: v[0] for k, v in draws.items()}, xs)
    fitted = fit_predictive_latents(bnn.likelihood, f, ys, {k: draws[k][0, 0] for k in latent_names})
    return {k: (fitted[k].expand_as(v[0, 0]).expand(v.shape).clone() if k in fitted else v) for k, v in draws.items()}


def _training_rows(x, y) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, LoaderBatches):
        return x[:PREDICTIVE_ROWS], y[:PREDICTIVE_ROWS]
    xs, ys, rows = [], [], 0
    for xb, yb in x.epoch(torch.Generator()):
        xs.append(xb)
        ys.append(yb)
        rows += xb.shape[0]
        if rows >= PREDICTIVE_ROWS:
            break
    return torch.cat(xs)[:PREDICTIVE_ROWS], torch.cat(ys)[:PREDICTIVE_ROWS]
