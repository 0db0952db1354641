"""The contract every inference backend follows.

A backend is an object with a ``name``, a ``Config`` dataclass of its options and
``run(bnn, x, y, config, seed, progress) -> Posterior``.  :func:`inference.fit` parses
options into the config (unknown options → a ``ValueError`` listing the valid ones),
validates the data, and dispatches through the ``BACKENDS`` registry.  A backend whose
``accepts_loader`` is true also takes a ``DataLoader``'s batches: ``run`` then gets a
:class:`~inference.optim.batches.LoaderBatches` as ``x`` and ``y=None`` (:func:`check_loader`).
A run that meets a NaN/inf stops with :class:`~inference.optim.training.NonFiniteLossError`;
``minibatches`` gives the shuffled epochs (from :mod:`inference.optim.batches`, re-exported for
the sampling backends).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import typing

import numpy as np
import torch

from zoo.bnn import BayesianNetwork
from zoo.checks import check_input, check_standardised_targets, check_targets

from inference.memory import check_fit_memory
from inference.optim.batches import LoaderBatches, minibatches
from inference.optim.training import LoopOptions, NonFiniteLossError

#: the largest integer option accepted (epochs, samples, steps, ...): more could not finish
MAX_COUNT = 10**9

__all__ = ["Backend", "BUDGETS", "TASKS", "NonFiniteLossError", "parse_config", "check_fit_size", "check_training_data",
           "check_loader", "minibatches"]


#: how a grid sizes a backend's training (:attr:`Backend.budget`): ``"elbo"`` epochs of minibatches of the
#: variational loop; ``"map"`` epochs of MAP minibatches; ``"members"`` MAP members (each a share of the MAP
#: epochs); ``"swag"`` a MAP burn-in then SWAG epochs; ``"map-steps"`` its own full-batch MAP steps (Laplace);
#: ``"chains"`` Markov chains (their own step counts); ``"protocol"`` its paper's own budget
BUDGETS = ("elbo", "map", "members", "swag", "map-steps", "chains", "protocol")
#: the data tasks a backend can fit (:attr:`Backend.tasks`)
TASKS = ("regression", "classification")


class Backend:
    """Base class of inference backends (one file per backend).

    A backend declares what it can do on itself, as class attributes (the backend table,
    :data:`inference.backends.BACKENDS`, is read through them; no caller compares backend names):

    Attributes:
        name: the registry name.
        Config: the dataclass of its options.
        budget: how a grid sizes its training (one of :data:`BUDGETS`).
        tasks: the data tasks it fits (every backend fits every likelihood of these tasks).
        regression_likelihood: the likelihood a run on regression data gets when it names none (``None``:
            the default ``gaussian``).
        prunes: it fits a family with a pruning rule (the ``prune_threshold`` option; ``--prune`` applies).
        fit_stacked: ``fit_stacked(bnns, xs, ys, config, seeds, progress) -> [Posterior | NonFiniteLossError]``,
            K fits as one stacked program (:func:`inference.fit_many`), or ``None`` (no stacked engine).
        stacks_trained_body: its stacked engine also stacks trained deterministic parameters (a last-layer
            model's body).
        stacks_weight_priors: its stacked engine stacks each fit's own Normal weight-prior parameters (so fits
            need equal latent priors only, :func:`inference.fitting.batch_signature`).
    """

    name: str = ""
    Config: type = object
    budget: str = "chains"
    tasks: tuple = TASKS
    regression_likelihood: typing.Optional[str] = None
    prunes: bool = False
    fit_stacked: typing.Optional[typing.Callable] = None
    stacks_trained_body: bool = False
    stacks_weight_priors: bool = False

    def stack_blocker(self, bnn, config) -> typing.Optional[str]:
        """Why a fit of this backend cannot join a stacked batch beyond the model's own reasons
        (:func:`inference.multifit.blockers.model_blocker`), or ``None``."""
        return None

    @property
    def accepts_loader(self) -> bool:
        """Whether ``run`` takes a DataLoader's batches: the backends trained by the one training loop
        (:func:`inference.variational.fit.fit_guide`, options :class:`~inference.optim.training.LoopOptions`).
        A backend with another minibatch loop that reads :class:`~inference.optim.batches.LoaderBatches`
        sets ``accepts_loader = True``."""
        return isinstance(self.Config, type) and issubclass(self.Config, LoopOptions)

    def run(self, bnn, x, y, config, seed: int, progress: bool):  # pragma: no cover - abstract
        raise NotImplementedError


def parse_config(backend: Backend, options: dict):
    """``backend.Config(**options)`` with a clear error for unknown or mistyped options.

    Each value is checked against its ``Config`` field's type (``int``, ``float``, ``bool``,
    ``str``, ``dict``, ``Optional[...]``, ``Literal[...]`` choices): an ``int`` field takes
    integers (or integral floats such as ``1e4``), a ``float`` field any real
    number, a ``bool`` field only ``True``/``False``.  A mismatch raises a ``ValueError``
    naming the option, the value and the expected type.
    """
    fields = {f.name for f in dataclasses.fields(backend.Config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for backend {backend.name!r}; valid options: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(backend.Config)

    def coerce(value, hint):
        """``(ok, value)``: ``value`` converted to ``hint`` where it is one (``ok`` False if not)."""
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is typing.Union:
            if value is None:
                return type(None) in args, None
            for arg in (a for a in args if a is not type(None)):
                ok, converted = coerce(value, arg)
                if ok:
                    return True, converted
            return False, value
        if origin is typing.Literal:
            return value in args, value
        if hint is bool:
            return isinstance(value, bool), value
        if hint is int:
            if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) \
                    and math.isfinite(value) and float(value).is_integer():
                return True, int(value)
            ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
            return ok, int(value) if ok else value
        if hint is float:
            ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)
            return ok, float(value) if ok else value
        if hint in (str, dict, list, tuple):
            return isinstance(value, hint), value
        return True, value  # callables and other objects: the backend checks them

    def expected(hint) -> str:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is typing.Union:
            return " or ".join(expected(a) for a in args)
        if origin is typing.Literal:
            return repr(args[0]) if len(args) == 1 else "one of " + ", ".join(repr(a) for a in args)
        names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a dict",
                 list: "a list", tuple: "a tuple", type(None): "null (None)"}
        return names.get(hint, getattr(hint, "__name__", str(hint)))

    typed = {}
    for name, value in options.items():
        ok, typed[name] = coerce(value, hints.get(name, typing.Any))
        if not ok and isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"option {name!r} of backend {backend.name!r} must be a finite number, got {value!r}")
        if not ok:
            raise ValueError(
                f"option {name!r} of backend {backend.name!r} must be {expected(hints[name])}, "
                f"got {value!r} ({type(value).__name__})"
            )
        if isinstance(typed[name], int) and not isinstance(typed[name], bool) and abs(typed[name]) > MAX_COUNT:
            raise ValueError(
                f"option {name!r} of backend {backend.name!r} is {value!r}; counts above {MAX_COUNT:.0e} are refused: "
                f"that many steps would take over {int(MAX_COUNT * 1e-3 // 86400)} days even at a millisecond each"
            )
    config = backend.Config(**typed)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def check_fit_size(bnn, config, rows=None) -> None:
    """Refuse a configuration whose fit cannot fit in the memory available on the model's device, before
    anything is allocated: stored draws (``num_chains`` × ``num_samples``), chains' states, ensemble
    members, SWAG moments, a dense Laplace GGN and a batch's activations (:mod:`inference.memory`)."""
    _check_model(bnn)
    check_fit_memory(bnn, config, rows)


def check_training_data(bnn, x, y) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate training data against the model; return tensors with canonical dtypes/shapes.

    ``x`` and ``y`` are tensors or numpy arrays (converted), checked by
    :func:`zoo.checks.check_input` (finite, the network's input layout, one forward on two rows)
    and :func:`zoo.checks.check_targets` (one target row per input; regression ``[N, T]`` in its
    own floating precision, classification int64 labels in range); regression targets far from standardised
    under an identity target scaling warn (:func:`zoo.checks.check_standardised_targets`).
    """
    _check_model(bnn)
    if y is None:
        raise ValueError("y is missing: pass the targets, fit(bnn, x, y, ...), or a DataLoader of (x, y) batches "
                         "as fit(bnn, loader, ...)")
    x = check_input(bnn, x, "x")
    y = check_targets(bnn, y, x.shape[0], "y")
    check_standardised_targets(bnn, y)
    return x, y


def _check_model(bnn) -> None:
    if not isinstance(bnn, BayesianNetwork):
        raise ValueError(f"bnn must be a zoo.BayesianNetwork, got {type(bnn).__name__}; wrap a plain network first: "
                         f"BayesianNetwork(net, stochastic=..., example_input=x[:2])")


def check_loader(bnn, loader) -> LoaderBatches:
    """A ``DataLoader`` of ``(x, y)`` batches as :class:`~inference.optim.batches.LoaderBatches`.

    The dataset must be map-style (``len(loader.dataset)`` is N, for the N/n likelihood scaling);
    every batch is checked with :func:`check_training_data` as it is drawn.
    """
    _check_model(bnn)
    try:
        num_data, num_batches = len(loader.dataset), len(loader)
    except TypeError:
        raise ValueError("the DataLoader's dataset has no len(): a DataLoader passed to fit needs a map-style "
                         "dataset (e.g. a TensorDataset) so that the data size N is known") from None
    if num_data == 0 or num_batches == 0:
        raise ValueError("the DataLoader yields no batches (empty dataset)")
    return LoaderBatches(loader, lambda xb, yb: check_training_data(bnn, xb, yb))
