"""Many small fits as one vectorised program: :func:`fit_many`.

K fits that share an architecture, a backend and its options — data splits, seeds, grid cells that
differ only in data or seed — train as one program over stacked parameters ``[K, ...]``: the
network runs once per step for all fits (``torch.func.vmap`` over the stacked weights, as the
deep-ensemble backend runs its members), one Adam steps every stacked tensor, and each fit keeps
its own data, minibatch order and random numbers (:mod:`inference.multifit.stacked`).  Fit k's
result is what ``fit(bnns[k], xs[k], ys[k], backend=..., seed=seeds[k], **options)`` returns, up to
float rounding (same seed, same protocol; tested in ``tests/test_multifit.py``).

Backends with a stacked engine: ``map`` and ``ensemble`` (its K·M members; :mod:`inference.multifit.map`)
and ``svi`` on its fused ELBO path (the default mean-field Normal guide, Normal weight priors;
:mod:`inference.multifit.svi`).
:func:`batch_blocker` says why a fit cannot join a batch (then it runs one at a time, as before):
another backend or ELBO path, trainable deterministic parameters (one network shared by all draws),
partially random parameters, layers that are random at training time (dropout, batch norm) or
without ``vmap`` rules, or a model that overrides the Pyro program.  Fits in one batch must also
have the same data size N, the same site shapes, likelihood and (MAP) priors (:func:`batch_signature`).
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch

from zoo.bnn import BayesianNetwork

from inference.backends import get_backend

from inference.fitting import preserved_session
from inference.backends.base import check_training_data, parse_config
from inference.multifit.blockers import STACKABLE, batch_blocker
from inference.multifit.map import fit_ensemble_stacked, fit_map_stacked
from inference.multifit.svi import fit_svi_stacked

__all__ = ["STACKED_BACKENDS", "fit_many", "batch_blocker", "batch_signature"]

#: backends with a stacked engine: name -> ``(bnns, xs, ys, config, seeds, progress) -> [Posterior | error]``
STACKED_BACKENDS = dict(zip(STACKABLE, (fit_map_stacked, fit_svi_stacked, fit_ensemble_stacked)))

def _distribution_key(d) -> tuple:
    """What identifies a prior: its type, reinterpreted dims and parameters (exact values)."""
    key = []
    while hasattr(d, "base_dist"):
        key.append((type(d).__name__, getattr(d, "reinterpreted_batch_ndims", None)))
        d = d.base_dist
    params = tuple((name, tuple(torch.as_tensor(getattr(d, name)).reshape(-1).tolist()))
                   for name in sorted(d.arg_constraints) if name in d.__dict__)
    return (*key, type(d).__name__, tuple(d.batch_shape), params)


def batch_signature(bnn: BayesianNetwork, backend: str, x: torch.Tensor, y: torch.Tensor) -> tuple:
    """Fits with equal signatures (and equal options) can share a batch: architecture and sites, the
    non-random parameters and buffers, likelihood, latent priors (and for MAP the weight priors), the data
    shapes, dtype and device.  (``svi`` stacks each fit's own Normal weight-prior parameters.)"""
    sites = tuple((s.name, tuple(s.shape)) for s in bnn.sites)
    fixed = tuple((n, tuple(t.reshape(-1).tolist())) for n, t in
                  [*((n, p) for n, p in bnn.net.named_parameters() if n not in {s.name for s in bnn.sites}),
                   *bnn.net.named_buffers()])
    priors = bnn.latent_priors() if backend == "svi" else bnn.prior_distributions()
    return (type(bnn.net).__name__, repr(bnn.net), sites, fixed, repr(bnn.likelihood),
            tuple((n, _distribution_key(d)) for n, d in priors.items()),
            tuple(x.shape), tuple(y.shape), str(x.dtype), str(x.device), str(bnn.target_scale.dtype))


def fit_many(bnns: Sequence[BayesianNetwork], xs: Sequence, ys: Sequence, backend: str = "svi",
             seeds: Optional[Sequence[int]] = None, progress: bool = False, **options) -> list:
    """Fit K models of one architecture, each on its own data and seed, as one stacked program.

    Args:
        bnns: K :class:`~zoo.bnn.BayesianNetwork` s (each fit's own model, e.g. built under its own seed).
        xs, ys: K training sets (tensors or arrays, as for :func:`inference.fit`; the same number of rows).
        backend: ``"map"``, ``"ensemble"`` or ``"svi"`` (:data:`STACKED_BACKENDS`).
        seeds: K seeds (default ``0, 1, ..., K−1``): fit k's minibatch order and random draws.
        progress: one tqdm bar for the batch.
        **options: the backend's options, shared by every fit (see its ``Config``).
    Returns:
        K results in order: the :class:`~inference.posterior.Posterior` of fit k, or, for a fit stopped by a
        NaN/inf loss or gradient, the :class:`~inference.optim.training.NonFiniteLossError` (its ``.posterior`` the
        last finite point); the other fits are not affected.  ``posterior.info["multifit"]`` holds the
        batch size and the fit's index; ``info["fit_seconds"]`` the fit's share of the batch's time.
    Raises:
        ValueError: empty or mismatched inputs, bad options or data, or fits that cannot share a batch
            (:func:`batch_blocker` / :func:`batch_signature` say why).
    """
    bnns = list(bnns)
    if not bnns:
        raise ValueError("fit_many needs at least one model")
    seeds = list(range(len(bnns))) if seeds is None else [int(s) for s in seeds]
    if not (len(xs) == len(ys) == len(seeds) == len(bnns)):
        raise ValueError(f"fit_many needs one x, y and seed per model: got {len(bnns)} models, {len(xs)} x, "
                         f"{len(ys)} y and {len(seeds)} seeds")
    if len({id(b) for b in bnns}) != len(bnns):
        raise ValueError("fit_many needs a separate model per fit (the same BayesianNetwork was given twice)")
    config = parse_config(get_backend(backend), options)
    data = []
    for k, (bnn, x, y) in enumerate(zip(bnns, xs, ys)):
        x, y = check_training_data(bnn, x, y)
        like = {"device": bnn.target_scale.device, "dtype": bnn.target_scale.dtype}
        x = x.to(**like) if x.is_floating_point() else x.to(like["device"])
        y = y.to(**like) if y.is_floating_point() else y.to(like["device"])
        bnn.check_forward(x)
        blocker = batch_blocker(bnn, backend, config)
        if blocker is not None:
            raise ValueError(f"fit {k} cannot be stacked: {blocker}; fit it with inference.fit instead")
        data.append((x, y))
    signatures = [batch_signature(bnn, backend, x, y) for bnn, (x, y) in zip(bnns, data)]
    differ = [k for k, s in enumerate(signatures) if s != signatures[0]]
    if differ:
        raise ValueError(f"fits {differ} differ from fit 0 in architecture, priors, likelihood or data shape; "
                         f"only fits that differ in data values and seed share a batch")
    xs, ys = torch.stack([x for x, _ in data]), torch.stack([y for _, y in data])
    with contextlib.ExitStack() as stack:
        for bnn in bnns:
            stack.enter_context(preserved_session(bnn))
        return STACKED_BACKENDS[backend](bnns, xs, ys, config, seeds, bool(progress))
