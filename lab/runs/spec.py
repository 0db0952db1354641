"""What defines one run: :class:`RunSpec`, its checks (:func:`validate_spec`) and its resolution
(:func:`resolve_run`): the one typed :class:`ResolvedRun` a run is fitted from.

A run's path through here, once each: :func:`validate_spec` refuses a bad name or value before any
data are loaded or anything is fitted, and builds the spec's likelihood for its checks; on the data,
:func:`resolve_run` keeps that likelihood (it is rebuilt only when the data's task changes the
default, e.g. ``categorical`` for classification data) and resolves the backend options a fit
receives (the spec's generic fields, ``backend_options``, and the default epochs of about 5000
optimisation steps), typed by the backend's ``Config``: :func:`resolve_backend_options`.  The
backend is read through its declared options only (its ``Config`` fields and their defaults,
:func:`declared_options`).  :func:`lab.runs.execution.execute` runs a spec.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from zoo.architectures import ARCHITECTURES
from zoo.data import Dataset
from zoo.heads import HEAD_PRESETS, head_selector
from zoo.likelihoods import Likelihood, likelihood_from_spec
from zoo.priors import PRIORS

from inference.backends import BACKENDS, get_backend, parse_config
from inference.optim.start import MAP_BATCH_SIZE, map_budget
from inference.variational.pruning import PRUNE_MODES

__all__ = ["RunSpec", "ResolvedRun", "validate_spec", "resolve_run", "make_run_likelihood", "resolve_backend_options",
           "declared_options", "default_epochs", "map_backend_steps", "GENERIC_OPTIONS"]

#: spec attribute → backend Config field, passed on when set (or defaulted) and the backend has it
GENERIC_OPTIONS = ("epochs", "batch_size", "lr", "num_samples", "pretrain_epochs")

#: optimisation steps the default number of epochs aims for
_TARGET_STEPS = 5000


@dataclass
class RunSpec:
    """Everything that defines one run (all fields JSON-serialisable).

    ``likelihood`` is a :data:`zoo.likelihoods.LIKELIHOODS` name (``None``: ``gaussian`` for
    regression data, ``categorical`` for classification), built with ``likelihood_options``
    (:func:`zoo.likelihoods.make_likelihood` keywords, e.g. ``{"beta": 0.5}`` or
    ``{"dof": 5.0, "learn_dof": False}``).  ``noise`` is ``"learned"`` (Gamma prior on the
    precision) or a fixed noise sd (Gaussian) / scale (Student-t) in standardised target
    units; it does not apply to the heteroscedastic likelihood, whose network predicts the
    variance.  A Student-t's degrees of freedom are learned unless ``likelihood_options``
    fix them.  ``None`` options take the backend's / data's defaults.
    ``backend_options`` holds backend-specific options (e.g. ``num_chains``,
    ``warmup_steps``, ``step_size``, ``mc_kl_samples``).
    """

    data: str
    model: str = "mlp"
    stochastic: str = "all"
    backend: str = "svi"
    split: int = 0
    seed: int = 0
    hidden: Optional[list] = None
    activation: Optional[str] = None
    prior: str = "normal"
    prior_scale: Optional[float] = None
    noise: Union[str, float] = "learned"
    likelihood: Optional[str] = None
    likelihood_options: dict = field(default_factory=dict)
    epochs: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    num_samples: Optional[int] = None
    pretrain_epochs: Optional[int] = None
    prune: str = "none"
    backend_options: dict = field(default_factory=dict)
    data_options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_epochs(num_data: int, batch_size: Optional[int]) -> int:
    """Epochs giving about 5000 optimisation steps, clamped to [100, 2000]."""
    steps_per_epoch = math.ceil(num_data / (batch_size or num_data))
    return int(min(2000, max(100, math.ceil(_TARGET_STEPS / steps_per_epoch))))


def map_backend_steps(num_data: int) -> int:
    """The Adam steps of a run of the ``map`` backend on ``num_data`` rows with its default minibatch: its
    :func:`default_epochs` of ``⌈N / batch⌉`` steps.  A backend whose ``map_steps`` default is ``None`` ("the
    ``map`` backend's own budget": Laplace) gets this in a run, so that its MAP is the run's ``map`` fit."""
    return map_budget(num_data, default_epochs(num_data, min(MAP_BATCH_SIZE, num_data)))


def make_run_likelihood(spec: RunSpec, task: Optional[str] = None) -> Likelihood:
    """The spec's likelihood (:func:`zoo.likelihoods.likelihood_from_spec`; ``ValueError`` for a bad
    name, option or value, or one that does not fit the data's ``task`` when it is given).  Without a
    name, regression data get the backend's ``regression_likelihood`` where it declares one."""
    name = spec.likelihood
    if name is None and task == "regression":  # a backend may name its own (deep-ensemble: mean-variance members)
        name = getattr(BACKENDS.get(spec.backend), "regression_likelihood", None)
    return likelihood_from_spec(name, task, spec.noise, spec.likelihood_options)


def validate_spec(spec: RunSpec) -> Likelihood:
    """Clear ``ValueError``s for a spec's names and values (cheap checks, before any data or fit).

    Returns the likelihood built for the checks (the data's task not yet known), which
    :func:`resolve_run` keeps for the run where the task does not change it."""
    choices = {"backend": BACKENDS, "model": ARCHITECTURES, "prior": PRIORS, "prune": PRUNE_MODES}
    for name, valid in choices.items():
        if getattr(spec, name) not in valid:
            raise ValueError(f"unknown {name} {getattr(spec, name)!r}; valid {name}s: {', '.join(valid)}")
    if spec.noise != "learned":
        try:
            noise_sd = float(spec.noise)
        except (TypeError, ValueError):
            noise_sd = float("nan")
        if not (math.isfinite(noise_sd) and noise_sd > 0):
            raise ValueError(f"--noise must be 'learned' or a positive number, got {spec.noise!r}")
    if not isinstance(spec.likelihood_options, dict):
        raise ValueError(f"likelihood_options must be a dict of likelihood options, got {spec.likelihood_options!r}")
    likelihood = make_run_likelihood(spec)  # name, options and values; the task is checked with the data
    if spec.stochastic in HEAD_PRESETS:
        head_selector(spec.stochastic, likelihood.heads)
    for name in ("split", "seed"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if spec.hidden is not None and not all(isinstance(h, int) and h >= 1 for h in spec.hidden):
        raise ValueError(f"hidden widths must be positive integers, got {spec.hidden!r}")
    if spec.prune != "none":  # refused before the fit, not after it
        prunable = [n for n, e in BACKENDS.items() if e.prunes]
        if spec.backend not in prunable or spec.stochastic == "none":
            raise ValueError(f"--prune {spec.prune} needs random weights fitted by a variational-family backend "
                             f"({', '.join(prunable)}); got --backend {spec.backend} --stochastic {spec.stochastic}")
    return likelihood


@dataclass(frozen=True)
class ResolvedRun:
    """A :class:`RunSpec` resolved once on its data (:func:`resolve_run`): what its fit is built from.

    Attributes:
        spec: the spec.
        likelihood: the run's likelihood, built for the data's task (its network has ``likelihood.heads``
            outputs per target).
        options: the backend options the fit receives (``inference.fit(..., **options)``), typed, the run
            layer's defaults included (:func:`resolve_backend_options`); ``config.json`` records them.
        config: the backend's ``Config`` of those options.
    """

    spec: RunSpec
    likelihood: Likelihood
    options: dict
    config: Any

    @property
    def draws(self) -> dict:
        """What sets the draws of the run's test-set prediction: ``{option: value}`` of ``num_samples``,
        ``num_chains`` and ``num_members`` where the backend has them (their product; {} for a point estimate)."""
        return {name: int(getattr(self.config, name) or 1) for name in ("num_samples", "num_chains", "num_members")
                if hasattr(self.config, name)}


def resolve_run(spec: RunSpec, data: Dataset, checked: Optional[Likelihood] = None) -> ResolvedRun:
    """``spec`` resolved on ``data``: its likelihood and its backend options, once.

    ``checked`` is the likelihood :func:`validate_spec` returned for ``spec``: it is the run's when the
    spec names one, or when the data are regression data and the backend declares no
    ``regression_likelihood`` of its own; otherwise (and without it) the likelihood is built here for
    ``data.task`` (``ValueError`` for one that does not fit the task)."""
    task_free = spec.likelihood is not None or (
        data.task == "regression" and getattr(BACKENDS.get(spec.backend), "regression_likelihood", None) is None)
    if checked is not None and task_free and checked.task == data.task:
        likelihood = checked
    else:
        likelihood = make_run_likelihood(spec, data.task)
    options, config = _backend_options(spec, data)
    return ResolvedRun(spec, likelihood, options, config)


def declared_options(backend) -> dict:
    """``{option: default}`` of a backend's declared options (the fields of its ``Config`` dataclass;
    ``dataclasses.MISSING`` for a required one)."""
    return {f.name: f.default for f in dataclasses.fields(backend.Config)}


def resolve_backend_options(spec: RunSpec, data: Dataset) -> dict:
    """The backend options of ``spec``'s fit on ``data``: ``backend_options`` with the spec's
    :data:`GENERIC_OPTIONS` that are set, each checked to apply to the backend and given once, typed
    by the backend's ``Config``; ``epochs`` defaults to :func:`default_epochs` (unless the backend
    keeps its own budget) and ``pretrain_epochs`` to a quarter of them for a random selection."""
    return _backend_options(spec, data)[0]


def _backend_options(spec: RunSpec, data: Dataset) -> tuple[dict, Any]:
    """:func:`resolve_backend_options` and the backend ``Config`` of the options it returns."""
    engine = get_backend(spec.backend)
    declared = declared_options(engine)
    options = dict(spec.backend_options)
    for name in GENERIC_OPTIONS:
        value = getattr(spec, name)
        if value is None:
            continue
        if name not in declared:
            raise ValueError(
                f"option {name!r} does not apply to backend {spec.backend!r}; its options are: {', '.join(sorted(declared))}"
            )
        if name in options:
            raise ValueError(f"option {name!r} is given twice: as --{name.replace('_', '-')} (RunSpec.{name}) and "
                             f"as --option (backend_options)")
        options[name] = value
    config = parse_config(engine, options)  # names and types checked, values typed (e.g. 1e3 -> 1000)
    options = {name: getattr(config, name) for name in options}
    defaults = {}
    if "epochs" in declared and "epochs" not in options and not getattr(config, "own_budget", False):  # a paper's budget
        batch = options.get("batch_size", declared.get("batch_size"))
        defaults["epochs"] = default_epochs(data.n_train, batch)
    if "map_steps" in declared and "map_steps" not in options and declared["map_steps"] is None:
        defaults["map_steps"] = map_backend_steps(data.n_train)  # "the map backend's budget": the one it gets here
    if "pretrain_epochs" in declared and "pretrain_epochs" not in options and spec.stochastic != "none" \
            and "epochs" in {**options, **defaults}:  # (a backend keeping its own budget sets its pretraining too)
        defaults["pretrain_epochs"] = {**options, **defaults}["epochs"] // 4
    return {**options, **defaults}, dataclasses.replace(config, **defaults) if defaults else config
