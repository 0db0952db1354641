"""One reproducible run: data × architecture × stochastic subset × backend → one result.

:class:`RunSpec` is everything that defines a run; :func:`execute` validates it (and the output
path) before any work, fits, predicts the test set once and returns a :class:`RunResult` holding
the metrics, posterior, prediction, ArviZ exports and data.  With an output folder it also writes

* ``metrics.json`` — test metrics in original units (RMSE, test log-likelihood, coverage,
  or accuracy/NLL/Brier/ECE), predictive R-hat/ESS, timings and the run's identity; a
  posterior of several chains (ensemble members, MCMC chains) adds ``members``, the
  per-member and mixture metrics and the members' disagreement (:mod:`inference.evaluation.member_metrics`); the
  trivial predictor's metrics, the ratios to it and ``failed_fit`` / ``failed_fit_reason``
  (:mod:`inference.evaluation.sanity`);
* ``config.json`` — the spec, the resolved backend options and the data summary;
* ``posterior/`` — the saved :class:`~inference.posterior.Posterior` (reload with
  :func:`inference.load_posterior`);
* ``posterior.nc`` — ArviZ InferenceData on the test set with the run's prediction (NetCDF);
* ``train.nc`` — InferenceData on (a seeded subset of) the training set, for PSIS-LOO / WAIC;
* ``COMPLETE`` — the completeness marker, written last (:mod:`lab.store`).

The folder is written by :func:`lab.store.staged_directory`: it appears whole or not at all,
and an existing run is only replaced (whole) with ``overwrite``.  A fit whose draws are
non-finite or whose every transition diverged raises :class:`RunFailed` and writes nothing.
The CLI (``python -m zoo fit``) and the experiment runner both go through here.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch

from zoo.architectures import ARCHITECTURES, build_architecture
from zoo.bnn import BayesianNetwork
from zoo.data import Dataset, load_dataset
from zoo.heads import HEAD_PRESETS, head_selector
from zoo.likelihoods import Likelihood, likelihood_from_spec
from zoo.priors import PRIORS, make_prior
from zoo.stochastic import ElementMasks
from zoo.structured import STRUCTURED_PRESETS, parse_structured, preset_masks

from inference.evaluation.arviz_export import loo_subset, save_netcdf
from inference.backends import BACKENDS, get_backend, parse_config
from inference.fitting import fit, resolve_device
from inference.evaluation.diagnostics import convergence_metrics, convergence_warning
from inference.evaluation.member_metrics import member_metrics
from inference.evaluation.metrics import evaluate
from inference.evaluation.sanity import fit_check, training_fit
from inference.posterior import SamplePosterior, to_jsonable
from inference.variational.pruning import PRUNE_MODES, prune

from .isolated import write_in_child
from .store import check_destination, staged_directory

__all__ = ["RunSpec", "RunResult", "RunFailed", "RUN_FILES", "build_model", "execute", "evaluate_posterior",
           "Evaluation", "write_run", "validate_spec", "make_run_likelihood",
           "GENERIC_OPTIONS", "default_epochs"]

#: spec attribute → backend Config field, passed on when set (or defaulted) and the backend has it
GENERIC_OPTIONS = ("epochs", "batch_size", "lr", "num_samples", "pretrain_epochs")

#: optimisation steps the default number of epochs aims for
_TARGET_STEPS = 5000

#: what a run folder holds besides its ``COMPLETE`` marker (``posterior`` is a folder)
RUN_FILES = ("metrics.json", "config.json", "posterior", "posterior.nc", "train.nc")

#: runs with at most this many random parameters keep the weight draws in ``posterior.nc``
_MAX_EXPORTED_WEIGHTS = 20000


class RunFailed(RuntimeError):
    """The fit finished but its posterior is unusable (non-finite draws or predictions, or a
    sampler whose every post-warm-up transition diverged); nothing is written."""


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


def make_run_likelihood(spec: RunSpec, task: Optional[str] = None) -> Likelihood:
    """The spec's likelihood (:func:`zoo.likelihoods.likelihood_from_spec`; ``ValueError`` for a bad
    name, option or value, or one that does not fit the data's ``task`` when it is given).  Without a
    name, regression data get the backend's ``regression_likelihood`` where it declares one."""
    name = spec.likelihood
    if name is None and task == "regression":  # a backend may name its own (deep-ensemble: mean-variance members)
        name = getattr(BACKENDS.get(spec.backend), "regression_likelihood", None)
    return likelihood_from_spec(name, task, spec.noise, spec.likelihood_options)


def build_model(spec: RunSpec, data: Dataset) -> BayesianNetwork:
    """The spec's architecture with its priors, sized for ``data`` and seeded by ``spec.seed``.

    ``stochastic="structured:PRESET"`` applies a :data:`zoo.structured.STRUCTURED_PRESETS`
    pattern (Rochussen 2024); ``*-map`` presets first fit the same net deterministically
    (``stochastic="none"``, SVI backend, the spec's epochs / batch size / lr) and fix the
    pattern's entries at those MAP values, the other weights starting from a fresh init.
    A ``multilstm`` whose LSTM weights are random uses the vmap-able unrolled LSTM.
    The network has ``likelihood.heads`` outputs per target (mean and log-variance for the
    heteroscedastic likelihood); ``stochastic="mean-head"`` / ``"last-mean-head"``
    (:data:`zoo.heads.HEAD_PRESETS`) keep its variance head deterministic.
    """
    likelihood = make_run_likelihood(spec, data.task)
    preset = parse_structured(spec.stochastic)
    stochastic = head_selector(spec.stochastic, likelihood.heads) or spec.stochastic
    map_state = _map_state(spec, data) if preset and STRUCTURED_PRESETS[preset]["fixed_value"] == "map" else None
    unrolled = spec.model == "multilstm" and spec.stochastic not in ("none", "last", "last-mean-head")
    torch.manual_seed(spec.seed)
    net = build_architecture(
        spec.model, data.input_dim, data.output_dim * likelihood.heads, hidden=spec.hidden,
        activation=spec.activation, heads=likelihood.heads, **({"unrolled": True} if unrolled else {}),
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
    fit(bnn, data.x_train, data.y_train, backend="svi", seed=spec.seed, progress=False, **_backend_options(det, data))
    return {k: v.detach().clone() for k, v in bnn.net.state_dict().items()}


def _backend_options(spec: RunSpec, data: Dataset) -> dict:
    engine = get_backend(spec.backend)
    fields = {f.name for f in dataclasses.fields(engine.Config)}
    options = dict(spec.backend_options)
    for name in GENERIC_OPTIONS:
        value = getattr(spec, name)
        if value is None:
            continue
        if name not in fields:
            raise ValueError(
                f"option {name!r} does not apply to backend {spec.backend!r}; its options are: {', '.join(sorted(fields))}"
            )
        if name in options:
            raise ValueError(f"option {name!r} is given twice: as --{name.replace('_', '-')} (RunSpec.{name}) and "
                             f"as --option (backend_options)")
        options[name] = value
    config = parse_config(engine, options)  # names and types checked, values typed (e.g. 1e3 -> 1000)
    options = {name: getattr(config, name) for name in options}
    if "epochs" in fields and "epochs" not in options and not getattr(config, "own_budget", False):  # a paper's budget
        batch = options.get("batch_size", _field_default(engine.Config, "batch_size"))
        options["epochs"] = default_epochs(data.n_train, batch)
    if "pretrain_epochs" in fields and "pretrain_epochs" not in options and spec.stochastic != "none":
        options["pretrain_epochs"] = options["epochs"] // 4
    return options


def _field_default(config_cls, name):
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            return f.default
    return None


@dataclass
class RunResult:
    """Everything one run produced, in memory (:func:`execute` writes it with :func:`write_run`).

    Attributes:
        spec: the :class:`RunSpec`.
        metrics: the ``metrics.json`` record (test metrics in original units, diagnostics, timings).
        config: the ``config.json`` record (spec, resolved backend options, data summary, pruning).
        posterior: the fitted :class:`~inference.posterior.Posterior` (after pruning, if any).
        prediction: the test-set :class:`~inference.posterior.Prediction`, original units.
        idata: test-set ``InferenceData`` including the prediction's ``predictions`` group.
        train_idata: ``InferenceData`` on a seeded training subset (PSIS-LOO / WAIC).
        data: the :class:`~zoo.data.Dataset`.
        directory: the run folder once written, else ``None``.
    """

    spec: RunSpec
    metrics: dict
    config: dict
    posterior: Any
    prediction: Any
    idata: Any
    train_idata: Any
    data: Dataset
    directory: Optional[Path] = None


def validate_spec(spec: RunSpec) -> None:
    """Clear ``ValueError``s for a spec's names and values (cheap checks, before any data or fit)."""
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
        prunable = [n for n, e in BACKENDS.items() if "prune_threshold" in {f.name for f in dataclasses.fields(e.Config)}]
        if spec.backend not in prunable or spec.stochastic == "none":
            raise ValueError(f"--prune {spec.prune} needs random weights fitted by a variational-family backend "
                             f"({', '.join(prunable)}); got --backend {spec.backend} --stochastic {spec.stochastic}")



@dataclass
class Evaluation:
    """A posterior evaluated once on a dataset: the test-set prediction (original units), its
    metrics (with member and convergence metrics), the test-set and LOO training-subset
    InferenceData, and the prediction time in seconds."""

    prediction: Any
    metrics: dict
    idata: Any
    train_idata: Any
    predict_seconds: float


def evaluate_posterior(posterior, data: Dataset, seed: int) -> Evaluation:
    """Predict ``data``'s test set once (``seed``), evaluate it and export what reports read.

    ``metrics`` also compare the prediction with the trivial predictor and the fit's own training
    points (:func:`inference.evaluation.sanity.fit_check`: ``trivial_*``, ratios, ``failed_fit`` and
    ``failed_fit_reason``).  Raises :class:`RunFailed` when the predictions are non-finite.
    Used by :func:`execute` and
    by reports of an in-memory posterior, so both hold the same numbers.
    """
    backend = posterior.info.get("backend", "the posterior")
    regression = data.task == "regression"
    y_test = data.y_test_original() if regression else data.y_test
    started = time.perf_counter()
    prediction = posterior.predict(data.x_test, y=y_test, seed=seed)
    predict_seconds = time.perf_counter() - started
    if not bool(torch.isfinite(prediction.f).all()):
        raise RunFailed(f"{backend}: the test-set predictions are non-finite; the posterior is unusable")
    metrics = evaluate(prediction, y_test)
    if isinstance(posterior, SamplePosterior) and posterior.num_chains > 1:  # a mixture of members (chains)
        metrics["members"] = member_metrics(posterior, data.x_test, y_test, prediction, seed=seed)
        metrics["member_disagreement"] = metrics["members"]["disagreement"]  # a scalar for results tables
    include_weights = posterior.bnn.num_random <= _MAX_EXPORTED_WEIGHTS
    idata = posterior.to_arviz(data.x_test, y_test, seed=seed, include_weights=include_weights, prediction=prediction)
    index = loo_subset(data.n_train, seed=seed)
    y_train = data.y_train_original() if regression else data.y_train
    train_idata = posterior.to_arviz(data.x_train[index], y_train[index], seed=seed, include_weights=False)
    metrics.update(convergence_metrics(idata))
    train_log_lik = torch.as_tensor(train_idata.log_likelihood["obs"].values)  # [chain, draw, n]
    train_fit = training_fit(data.task, train_log_lik.reshape(-1, train_log_lik.shape[-1]), y_train[index],
                             y_train)
    metrics.update(fit_check(prediction, y_test, y_train, metrics, train=train_fit))
    return Evaluation(prediction, metrics, idata, train_idata, predict_seconds)


def execute(spec: RunSpec, out_dir=None, *, overwrite: bool = False, progress: bool = True,
            data: Optional[Dataset] = None, device: Optional[str] = None, strict: bool = False,
            fitted=None) -> RunResult:
    """Fit, evaluate and export one run; with ``out_dir`` also write its run folder.

    The output path, the spec and every backend option (names and types) are validated before
    the data are loaded or anything is fitted.  ``out_dir`` holding a run raises
    :class:`lab.store.StoreError` unless ``overwrite`` (then it is replaced whole, atomically).
    Raises :class:`RunFailed` for an unusable posterior, and with ``strict`` for a fit flagged
    ``failed_fit`` (worse than the trivial predictor, :func:`inference.evaluation.sanity.fit_check`; nothing is
    written; without ``strict`` it is a ``RuntimeWarning``).  ``device`` (``"cpu"``, ``"cuda"``,
    ``"mps"``; checked first) is where the model is fitted and the data set is moved.  ``fitted``: the
    spec's posterior already fitted on ``data`` (by the stacked engine, :func:`inference.multifit.fit_many`,
    with :func:`build_model` and the resolved options), evaluated and written instead of fitting here.
    """
    if out_dir is not None:
        check_destination(out_dir, overwrite)
    validate_spec(spec)
    device = None if device is None else resolve_device(device)
    if data is None:
        data = load_dataset(spec.data, split=spec.split, seed=spec.seed, **spec.data_options)
    options = _backend_options(spec, data)  # every option checked (and typed) before any fitting
    bnn = build_model(spec, data) if fitted is None else fitted.bnn  # on the CPU data: fit() moves it
    if device is not None:
        data = dataclasses.replace(data, **{f.name: getattr(data, f.name).to(device) for f in dataclasses.fields(data)
                                            if isinstance(getattr(data, f.name), torch.Tensor)})
    started = time.perf_counter()
    posterior = fitted if fitted is not None else _fit(spec, bnn, data, progress, device, options)
    fit_seconds = time.perf_counter() - started if fitted is None else fitted.info["fit_seconds"]
    _check_draws(posterior)
    prune_report = None
    if spec.prune != "none":
        posterior, prune_report = prune(posterior, mode=spec.prune, seed=spec.seed)
    evaluation = evaluate_posterior(posterior, data, spec.seed)
    prediction, metrics, idata = evaluation.prediction, evaluation.metrics, evaluation.idata
    predict_seconds = evaluation.predict_seconds
    unmixed = convergence_warning(metrics)
    if unmixed:
        warnings.warn(f"{spec.backend}: {unmixed}", RuntimeWarning, stacklevel=2)
    if metrics["failed_fit"]:
        if strict:
            raise RunFailed(f"{spec.backend}: failed fit (strict): {metrics['failed_fit_reason']}")
        warnings.warn(f"{spec.backend}: failed fit: {metrics['failed_fit_reason']}", RuntimeWarning, stacklevel=2)
    if prune_report is not None:
        metrics["sparsity"] = float(prune_report["sparsity"])
    metrics.update(
        {
            "fit_seconds": fit_seconds,
            "predict_seconds": predict_seconds,
            "n_train": data.n_train,
            "n_test": data.n_test,
            "num_random": bnn.num_random,
            "backend": spec.backend,
            "stochastic": spec.stochastic,
            "model": spec.model,
            "data": spec.data,
            "split": spec.split,
            "seed": spec.seed,
            "task": data.task,
        }
    )
    config = {"spec": spec.to_dict(), "backend_options": options, "data": data.summary(), "prune": prune_report}
    result = RunResult(spec, metrics, config, posterior, prediction, idata, evaluation.train_idata, data)
    if out_dir is not None:
        write_run(result, out_dir, overwrite=overwrite)
    return result


def _fit(spec: RunSpec, bnn, data: Dataset, progress: bool, device, options: dict):
    """:func:`inference.fit`; a distribution handed non-finite parameters during the fit (torch's "found
    invalid values": the weights diverged, e.g. ``--lr 1e30``) is :class:`RunFailed` (exit 1), not a
    bad-input ``ValueError`` (every input was checked before)."""
    try:
        return fit(bnn, data.x_train, data.y_train, backend=spec.backend, seed=spec.seed, progress=progress,
                   device=device, **options)
    except ValueError as err:
        if "found invalid values" not in str(err):
            raise
        raise RunFailed(f"{spec.backend}: the fit diverged: the network's outputs became non-finite during training "
                        f"(learning rate {options.get('lr', 'default')}); lower --lr, or pass --option "
                        f"optimizer=clipped-adam") from None


def _check_draws(posterior) -> None:
    """:class:`RunFailed` for non-finite stored draws or a sampler whose every transition diverged."""
    if not isinstance(posterior, SamplePosterior):
        return
    backend = posterior.info.get("backend", "the sampler")
    bad = [name for name, value in posterior.draws.items() if not bool(torch.isfinite(value).all())]
    if bad:
        raise RunFailed(f"{backend}: non-finite draws of {', '.join(bad)}; the posterior is unusable")
    diverging = posterior.sample_stats.get("diverging")
    if diverging is not None and diverging.numel() and bool(diverging.bool().all()):
        raise RunFailed(f"{backend}: every one of the {diverging.numel()} post-warm-up transitions diverged; "
                        f"the draws are not from the posterior (lower step_size, raise target_accept or "
                        f"warmup_steps)")


def write_run(result: RunResult, directory, *, overwrite: bool = False) -> Path:
    """Write ``result`` as a run folder (:data:`RUN_FILES`, then ``COMPLETE``), atomically; returns it.

    A disk-full or other I/O error raises a one-line :class:`lab.store.WriteError` and leaves
    ``directory`` as it was; the NetCDF files are written in a forked child
    (:func:`lab.isolated.write_in_child`), since h5py can crash the process on a full disk.
    """
    with staged_directory(directory, overwrite) as staging:
        result.posterior.save(staging / "posterior")
        write_in_child(save_netcdf, staging / "posterior.nc", result.idata)  # h5py may crash on a full disk
        write_in_child(save_netcdf, staging / "train.nc", result.train_idata)
        _write_json(staging / "config.json", result.config)
        _write_json(staging / "metrics.json", result.metrics)
    result.directory = Path(directory).absolute()
    return result.directory


def _write_json(path: Path, obj) -> None:
    with open(path, "w") as fh:
        json.dump(to_jsonable(obj), fh, indent=2)
