"""The public entry points: :func:`fit` checks the data and options, places them on the model's
device, and runs a registered backend without side effects on the caller's session; :func:`fit_many`
runs K fits of one architecture as one stacked program (:mod:`inference.multifit`)."""
from __future__ import annotations

import contextlib
import random
from typing import Optional, Sequence

import numpy as np
import pyro
import torch
from torch.utils.data import DataLoader

from zoo.bnn import BayesianNetwork
from zoo.checks import check_seed
from zoo.data.fingerprint import data_fingerprint

from inference.backends import BACKENDS, get_backend, loader_backends, stacked_backends
from inference.backends.base import check_fit_size, check_loader, check_training_data, parse_config
from inference.multifit.blockers import model_blocker

__all__ = ["fit", "fit_many", "preserved_session", "resolve_device", "batch_signature", "batch_blocker",
           "DEVICE_TYPES"]

#: device types :func:`fit` moves a model to
DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(device) -> torch.device:
    """``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``), checked to exist here.

    Raises:
        ValueError: not a device name, or a device this machine does not have.
    """
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; valid devices: {', '.join(DEVICE_TYPES)} (or 'cuda:N')") from None
    if resolved.type not in DEVICE_TYPES:
        raise ValueError(f"unsupported device {device!r}; valid devices: {', '.join(DEVICE_TYPES)} (or 'cuda:N')")
    missing_cuda = not torch.cuda.is_available() or (resolved.index or 0) >= torch.cuda.device_count()
    if resolved.type == "cuda" and missing_cuda:
        raise ValueError(f"device {device!r} is not available: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s) (torch.cuda.is_available() is {torch.cuda.is_available()}); use device='cpu'")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} is not available on this machine (torch.backends.mps.is_available() "
                         f"is False); use device='cpu'")
    return resolved


def _placed(bnn, x: torch.Tensor, y: torch.Tensor, raw_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked ``(x, y)`` on the model's device, floating inputs and regression targets in its dtype.

    ``raw_y`` is ``y`` before checking: floating targets are converted from it directly, so no
    precision is lost on the way to a float64 model.
    """
    like = {"device": bnn.target_scale.device, "dtype": bnn.target_scale.dtype}
    x = x.to(**like) if x.is_floating_point() else x.to(like["device"])
    if bnn.likelihood.task == "regression" and raw_y.is_floating_point():
        y = raw_y.reshape(y.shape)
    return x, y.to(**like) if y.is_floating_point() else y.to(like["device"])


@contextlib.contextmanager
def preserved_session(bnn):
    """Run a fit without side effects on the caller's session.

    On exit (normal or not) the global random states a backend may seed (torch's CPU generator
    and that of ``bnn``'s CUDA device, numpy's and Python's — ``pyro.set_rng_seed`` seeds all
    three), the names in Pyro's global parameter store and the train/eval mode of every submodule of ``bnn``
    are as they were on entry.  The fit's own draws are unchanged: it still seeds them itself.
    """
    device = bnn.target_scale.device
    cuda = [device.index or 0] if device.type == "cuda" else []
    modes = [(module, module.training) for module in bnn.modules()]
    numpy_state, python_state = np.random.get_state(), random.getstate()
    store = pyro.get_param_store()
    stored_names = set(store.keys())
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
        for name in set(store.keys()) - stored_names:
            del store[name]
        for module, training in modes:
            module.training = training


def fit(bnn, x, y=None, backend: str = "svi", seed: int = 0, progress: bool = True, device=None, **options):
    """Infer the posterior of ``bnn``'s random sites given data ``(x, y)`` or a ``DataLoader``.

    Args:
        bnn: a :class:`zoo.BayesianNetwork`; one made without ``example_input`` / ``output_dim`` is
            completed from the first rows of ``x`` (:meth:`~zoo.BayesianNetwork.build`).
        x: inputs ``[N, ...]`` (the network's input units, usually standardised), or a
            ``torch.utils.data.DataLoader`` over a map-style dataset of ``(x, y)`` rows (then
            ``y`` is ``None``): minibatch backends (:func:`loader_backends`: ``svi``, the
            variational families, the SG-MCMC family, ``map``, ``ensemble``, ``mc-dropout``)
            draw each epoch's batches from it, in its order and batch size, and scale the
            likelihood by N/n with N = ``len(loader.dataset)``.
        y: regression targets ``[N, O]`` in *standardised* units, or class labels ``[N]``.
        backend: a name in ``BACKENDS``.
        seed: fixes every random draw of the run (a DataLoader's shuffling has its own generator).
            The fit leaves the caller's session as it was (:func:`preserved_session`): global
            random states, the network's train/eval modes and Pyro's parameter store.
        progress: show a tqdm progress bar.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``: ``bnn`` is
            moved there (``bnn.to(device)``, in place) before fitting; default: where it is.  The
            data always follow the model: moved to its device, floating inputs and regression
            targets converted to its dtype (``bnn.double()`` fits in float64).
        **options: the backend's options (see its ``Config``).
    Returns:
        a :class:`inference.Posterior`; from tensors, its ``info["data_fingerprint"]`` is
        :func:`zoo.data.fingerprint.data_fingerprint` of the checked ``(x, y)`` (a report uses it to
        recognise the fit's own training points).
    Raises:
        ValueError: bad options or data; a DataLoader given to a backend that needs the full
            data set as tensors (the message lists those that accept one), or with ``y`` or
            ``batch_size``; an unknown or unavailable ``device``; a network whose forward
            does not return one ``[n, O]`` tensor (checked on the first rows, before fitting).
    """
    engine = get_backend(backend)
    seed = check_seed(seed)
    if device is not None:
        bnn.to(resolve_device(device))
    if isinstance(x, DataLoader):
        if not engine.accepts_loader:
            raise ValueError(
                f"backend {backend!r} needs the full training set as tensors, fit(bnn, x, y, ...); a DataLoader "
                f"is accepted by the minibatch backends: {', '.join(loader_backends())}"
            )
        if y is not None:
            raise ValueError("a DataLoader yields the (x, y) batches itself: call fit(bnn, loader, ...) without y")
        if "batch_size" in options:
            raise ValueError("the DataLoader sets the batches: drop batch_size= (give it to the DataLoader instead)")
        config = parse_config(engine, options)
        batches = check_loader(bnn, x)
        check = batches.check
        batches.check = lambda xb, yb: _placed(bnn, *check(xb, yb), yb)
        first = x.collate_fn([x.dataset[0]])  # a one-row batch: the network is checked before fitting
        pair = isinstance(first, (tuple, list)) and len(first) == 2  # (other rows: LoaderBatches' clear error)
        if pair:
            bnn.build(first[0], "the DataLoader's first x")  # a network made without example_input
        check_fit_size(bnn, config)
        if pair:
            bnn.check_forward(_placed(bnn, *check(*first), first[1])[0])
        with preserved_session(bnn):
            return engine.run(bnn, batches, None, config, int(seed), bool(progress))
    config = parse_config(engine, options)
    if isinstance(bnn, BayesianNetwork):
        bnn.build(x, "x")  # a network made without example_input: completed by the data's first rows
    check_fit_size(bnn, config, _batch_rows(config, x))
    x, y = check_training_data(bnn, x, y)  # numpy arrays converted; floating targets keep their precision
    fingerprint = data_fingerprint(x, y)  # lets a report recognise these points as the fit's own
    x, y = _placed(bnn, x, y, y)
    bnn.check_forward(x)
    with preserved_session(bnn):
        posterior = engine.run(bnn, x, y, config, int(seed), bool(progress))
    posterior.info.setdefault("data_fingerprint", fingerprint)
    return posterior


def _batch_rows(config, x) -> Optional[int]:
    """Rows of one training batch (the memory estimate's activations): ``batch_size`` or all of ``x``."""
    shape = getattr(x, "shape", None)
    rows = int(shape[0]) if shape is not None and len(shape) > 0 else None
    batch = getattr(config, "batch_size", None)
    return rows if batch is None or rows is None else min(int(batch), rows)


def batch_blocker(bnn: BayesianNetwork, backend: str, config) -> Optional[str]:
    """Why fit ``(bnn, backend, config)`` cannot be stacked with others, or ``None`` when it can: the backend
    has no stacked engine, the model cannot be stacked (:func:`inference.multifit.blockers.model_blocker`,
    given what the engine stacks), or the backend's own reason (:meth:`~inference.backends.base.Backend.stack_blocker`)."""
    engine = get_backend(backend)
    if engine.fit_stacked is None:
        return f"backend {backend!r} has no stacked engine (only {', '.join(stacked_backends())})"
    trained_body = [name for name, other in BACKENDS.items() if other.fit_stacked is not None and other.stacks_trained_body]
    return model_blocker(bnn, engine.stacks_trained_body, trained_body) or engine.stack_blocker(bnn, config)


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
    """Fits with equal signatures (and equal options) can share a batch: architecture and sites, the shapes
    of the trained deterministic parameters (each fit's own values are stacked), the frozen ones and the
    buffers, likelihood, latent priors (and the weight priors, unless the engine stacks each fit's own Normal
    weight-prior parameters: ``stacks_weight_priors``, ``svi`` and ``radial``), the data shapes, dtype and device."""
    sites = tuple((s.name, tuple(s.shape)) for s in bnn.sites)
    site_names = {s.name for s in bnn.sites}
    trained = tuple((n, tuple(p.shape)) for n, p in bnn.net.named_parameters() if n not in site_names and p.requires_grad)
    fixed = tuple((n, tuple(t.reshape(-1).tolist())) for n, t in
                  [*((n, p) for n, p in bnn.net.named_parameters() if n not in site_names and not p.requires_grad),
                   *bnn.net.named_buffers()])
    priors = bnn.latent_priors() if get_backend(backend).stacks_weight_priors else bnn.prior_distributions()
    return (type(bnn.net).__name__, repr(bnn.net), sites, trained, fixed, repr(bnn.likelihood),
            tuple((n, _distribution_key(d)) for n, d in priors.items()),
            tuple(x.shape), tuple(y.shape), str(x.dtype), str(x.device), str(bnn.target_scale.dtype))


def fit_many(bnns: Sequence[BayesianNetwork], xs: Sequence, ys: Sequence, backend: str = "svi",
             seeds: Optional[Sequence[int]] = None, progress: bool = False, **options) -> list:
    """Fit K models of one architecture, each on its own data and seed, as one stacked program.

    Args:
        bnns: K :class:`~zoo.bnn.BayesianNetwork` s (each fit's own model, e.g. built under its own seed).
        xs, ys: K training sets (tensors or arrays, as for :func:`inference.fit`; the same number of rows).
        backend: a backend with a stacked engine (:func:`inference.backends.stacked_backends`: ``"map"``,
            ``"ensemble"``, ``"svi"``, ``"radial"``, the SG-MCMC backends — their MAP starts stacked, then each
            fit's chains).
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
    engine = get_backend(backend)
    config = parse_config(engine, options)
    data = []
    for k, (bnn, x, y) in enumerate(zip(bnns, xs, ys)):
        if isinstance(bnn, BayesianNetwork):
            bnn.build(x, f"xs[{k}]")
        x, y = check_training_data(bnn, x, y)
        x, y = _placed(bnn, x, y, y)
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
        return engine.fit_stacked(bnns, xs, ys, config, seeds, bool(progress))
