"""The network of a run: :func:`build_model` builds a :class:`~lab.runs.spec.RunSpec`'s Bayesian network.

The architecture comes from the one registry (:data:`zoo.architectures.ARCHITECTURES`) by
``spec.model``: no architecture is special here.  A selection whose random weights are not only
the output layer's samples the network under ``vmap``, so it gets the entry's ``vmap_options``.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from zoo.architectures import ARCHITECTURES, build_architecture
from zoo.bnn import BayesianNetwork
from zoo.data import Dataset
from zoo.heads import head_selector
from zoo.likelihoods import Likelihood
from zoo.priors import make_prior
from zoo.stochastic import ElementMasks
from zoo.structured import STRUCTURED_PRESETS, parse_structured, preset_masks

from inference.fitting import fit

from .spec import RunSpec, make_run_likelihood, resolve_backend_options

__all__ = ["build_model", "OUTPUT_LAYER_SELECTIONS"]

#: stochastic selections whose random weights, if any, are the output layer's only (the net need not vmap)
OUTPUT_LAYER_SELECTIONS = ("none", "last", "last-mean-head")


def build_model(spec: RunSpec, data: Dataset, likelihood: Optional[Likelihood] = None) -> BayesianNetwork:
    """The spec's architecture with its priors, sized for ``data`` and seeded by ``spec.seed``.

    ``likelihood``: the run's, when it is resolved already (:attr:`lab.runs.spec.ResolvedRun.likelihood`);
    else it is built here (:func:`lab.runs.spec.make_run_likelihood`).

    ``stochastic="structured:PRESET"`` applies a :data:`zoo.structured.STRUCTURED_PRESETS`
    pattern (Rochussen 2024); ``*-map`` presets first fit the same net deterministically
    (``stochastic="none"``, SVI backend, the spec's epochs / batch size / lr) and fix the
    pattern's entries at those MAP values, the other weights starting from a fresh init.
    Unless the selection is one of :data:`OUTPUT_LAYER_SELECTIONS`, the architecture is built with
    its registry entry's ``vmap_options`` (e.g. ``multilstm``: the vmap-able unrolled LSTM).
    The network has ``likelihood.heads`` outputs per target (mean and log-variance for the
    heteroscedastic likelihood); ``stochastic="mean-head"`` / ``"last-mean-head"``
    (:data:`zoo.heads.HEAD_PRESETS`) keep its variance head deterministic.
    """
    likelihood = make_run_likelihood(spec, data.task) if likelihood is None else likelihood
    preset = parse_structured(spec.stochastic)
    stochastic = head_selector(spec.stochastic, likelihood.heads) or spec.stochastic
    map_state = _map_state(spec, data) if preset and STRUCTURED_PRESETS[preset]["fixed_value"] == "map" else None
    entry = ARCHITECTURES.get(spec.model)  # an unknown name is refused by build_architecture
    vmap_options = entry.vmap_options if entry is not None and spec.stochastic not in OUTPUT_LAYER_SELECTIONS else {}
    torch.manual_seed(spec.seed)
    net = build_architecture(
        spec.model, data.input_dim, data.output_dim * likelihood.heads, hidden=spec.hidden,
        activation=spec.activation, heads=likelihood.heads, **vmap_options,
    )
    if preset:
        stochastic = ElementMasks(*preset_masks(net, preset, pretrained_state=map_state, seed=spec.seed))
    return BayesianNetwork(
        net,
        stochastic=stochastic,
        prior=make_prior(spec.prior, spec.prior_scale),
        likelihood=likelihood,
        example_input=data.x_train[:2],
        target_loc=data.y_loc if data.task == "regression" else None,
        target_scale=data.y_scale if data.task == "regression" else None,
    )


def _map_state(spec: RunSpec, data: Dataset) -> dict:
    """State dict of the spec's net fitted deterministically (for MAP-valued structured presets)."""
    det = dataclasses.replace(spec, stochastic="none", backend="svi", backend_options={}, prune="none")
    bnn = build_model(det, data)
    fit(bnn, data.x_train, data.y_train, backend="svi", seed=spec.seed, progress=False,
        **resolve_backend_options(det, data))
    return {k: v.detach().clone() for k, v in bnn.net.state_dict().items()}
