"""One reproducible run: data × architecture × stochastic subset × backend → one result.

:class:`RunSpec` is everything that defines a run; :func:`execute` validates it (and the output
path) before any work, fits, predicts the test set once and returns a :class:`RunResult` holding
the metrics, posterior, prediction, ArviZ exports and data.  With an output folder it also writes

* ``metrics.json`` — test metrics in original units (RMSE, test log-likelihood, coverage,
  or accuracy/NLL/Brier/ECE), predictive R-hat/ESS, timings and the run's identity; the fidelity to a
  reference posterior where one is built for the run's data and network (:mod:`lab.references.fidelity`); a
  posterior of several chains (ensemble members, MCMC chains) adds ``members``, the
  per-member and mixture metrics and the members' disagreement (:mod:`inference.evaluation.member_metrics`); the
  trivial predictor's metrics, the ratios to it and ``failed_fit`` / ``failed_fit_reason``
  (:mod:`inference.evaluation.sanity`);
* ``config.json`` — the spec, the resolved backend options and the data summary with its fingerprint;
* ``posterior/`` — the saved :class:`~inference.posterior.Posterior` (reload with
  :func:`inference.load_posterior`);
* ``posterior.nc`` — ArviZ InferenceData on the test set with the run's prediction (NetCDF);
* ``train.nc`` — InferenceData on (a seeded subset of) the training set, for PSIS-LOO / WAIC;
* ``COMPLETE`` — the completeness marker, written last (:mod:`lab.runs.store`).

The folder is written by :func:`lab.runs.store.staged_directory`: it appears whole or not at all,
and an existing run is only replaced (whole) with ``overwrite``.  A fit whose draws are
non-finite or whose every transition diverged raises :class:`lab.runs.evaluation.RunFailed` and
writes nothing.  The CLI (``python -m zoo fit``) and the experiment runner both go through here.

One run's path: :func:`lab.runs.spec.validate_spec` → the data → :func:`lab.runs.spec.resolve_run` (the
:class:`~lab.runs.spec.ResolvedRun`: likelihood and backend options, once) → :func:`lab.runs.model.build_model` → :func:`inference.fit` → :func:`lab.runs.evaluation.check_draws` →
pruning → :func:`lab.runs.evaluation.evaluate_posterior` → :func:`write_run`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from zoo.data import Dataset, load_dataset

from inference.evaluation.arviz_export import MAX_LOO_POINTS, save_netcdf
from inference.evaluation.diagnostics import convergence_warning
from inference.fitting import fit, resolve_device
from inference.memory import check_prediction_memory
from inference.posterior import to_jsonable
from inference.variational.pruning import prune

from lab.references.fidelity import flat_columns, matching_reference, score_prediction
from .isolated import write_in_child
from .evaluation import RunFailed, check_draws, evaluate_posterior
from .model import build_model
from .spec import RunSpec, resolve_run, validate_spec
from .store import check_destination, staged_directory

__all__ = ["RunResult", "RUN_FILES", "execute", "write_run"]

#: what a run folder holds besides its ``COMPLETE`` marker (``posterior`` is a folder)
RUN_FILES = ("metrics.json", "config.json", "posterior", "posterior.nc", "train.nc")


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


def execute(spec: RunSpec, out_dir=None, *, overwrite: bool = False, progress: bool = True,
            data: Optional[Dataset] = None, device: Optional[str] = None, strict: bool = False,
            fitted=None) -> RunResult:
    """Fit, evaluate and export one run; with ``out_dir`` also write its run folder.

    The output path, the spec and every backend option (names and types) are validated before
    the data are loaded or anything is fitted.  ``out_dir`` holding a run raises
    :class:`lab.runs.store.StoreError` unless ``overwrite`` (then it is replaced whole, atomically).
    Raises :class:`~lab.runs.evaluation.RunFailed` for an unusable posterior, and with ``strict`` for a
    fit flagged ``failed_fit`` (worse than the trivial predictor, :func:`inference.evaluation.sanity.fit_check`;
    nothing is written; without ``strict`` it is a ``RuntimeWarning``).  ``device`` (``"cpu"``, ``"cuda"``,
    ``"mps"``; checked first) is where the model is fitted and the data set is moved.  ``fitted``: the
    spec's posterior already fitted on ``data`` (by the stacked engine, :func:`inference.fit_many`,
    with :func:`build_model` and the resolved options), evaluated and written instead of fitting here.
    """
    if out_dir is not None:
        check_destination(out_dir, overwrite)
    checked = validate_spec(spec)
    device = None if device is None else resolve_device(device)
    if data is None:
        data = load_dataset(spec.data, split=spec.split, seed=spec.seed, **spec.data_options)
    run = resolve_run(spec, data, checked)  # once: the likelihood, every option checked and typed, before any fit
    options = run.options
    bnn = build_model(spec, data, run.likelihood) if fitted is None else fitted.bnn  # on the CPU data: fit() moves it
    if fitted is None:  # the test-set prediction's arrays, refused before the fit rather than after it
        check_prediction_memory(bnn, math.prod(run.draws.values()), data.n_test, run.draws,
                                train_points=min(data.n_train, MAX_LOO_POINTS))
    if device is not None:
        data = dataclasses.replace(data, **{f.name: getattr(data, f.name).to(device) for f in dataclasses.fields(data)
                                            if isinstance(getattr(data, f.name), torch.Tensor)})
    started = time.perf_counter()
    posterior = fitted if fitted is not None else _fit(spec, bnn, data, progress, device, options)
    fit_seconds = time.perf_counter() - started if fitted is None else fitted.info["fit_seconds"]
    check_draws(posterior)
    prune_report = None
    if spec.prune != "none":
        posterior, prune_report = prune(posterior, mode=spec.prune, seed=spec.seed)
    evaluation = evaluate_posterior(posterior, data, spec.seed)
    prediction, metrics, idata = evaluation.prediction, evaluation.metrics, evaluation.idata
    predict_seconds = evaluation.predict_seconds
    unmixed = convergence_warning(metrics)
    if unmixed and not (posterior.info.get("convergence") or {}).get("warning"):  # the fit has not warned already
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
    fingerprint = data.fingerprint()
    metrics.update(_fidelity(fingerprint, posterior, prediction, data, spec.seed))
    config = {"spec": spec.to_dict(), "backend_options": options,
              "data": {**data.summary(), "fingerprint": fingerprint}, "prune": prune_report}
    result = RunResult(spec, metrics, config, posterior, prediction, idata, evaluation.train_idata, data)
    if out_dir is not None:
        write_run(result, out_dir, overwrite=overwrite)
    return result


def _fidelity(fingerprint: str, posterior, prediction, data: Dataset, seed: int) -> dict:
    """The fidelity columns (:func:`lab.references.fidelity.flat_columns`, and ``fidelity``) when a built reference posterior
    has this run's data and network (:func:`lab.references.fidelity.matching_reference`), else nothing."""
    reference = matching_reference(fingerprint, posterior.bnn)
    if reference is None:
        return {}
    x_test = reference.x_test.to(data.x_test)
    if not torch.equal(x_test, data.x_test):
        prediction = posterior.predict(x_test, seed=seed)
    record = score_prediction(reference, prediction)
    return {"fidelity": {reference.name: record}, **flat_columns(record)}


def _fit(spec: RunSpec, bnn, data: Dataset, progress: bool, device, options: dict):
    """:func:`inference.fit`; a distribution handed non-finite parameters during the fit (torch's "found
    invalid values": the weights diverged, e.g. ``--lr 1e30``) is :class:`~lab.runs.evaluation.RunFailed`
    (exit 1), not a bad-input ``ValueError`` (every input was checked before)."""
    try:
        return fit(bnn, data.x_train, data.y_train, backend=spec.backend, seed=spec.seed, progress=progress,
                   device=device, **options)
    except ValueError as err:
        if "found invalid values" not in str(err):
            raise
        raise RunFailed(f"{spec.backend}: the fit diverged: the network's outputs became non-finite during training "
                        f"(learning rate {options.get('lr', 'default')}); lower --lr, or pass --option "
                        f"optimizer=clipped-adam") from None


def write_run(result: RunResult, directory, *, overwrite: bool = False) -> Path:
    """Write ``result`` as a run folder (:data:`RUN_FILES`, then ``COMPLETE``), atomically; returns it.

    A disk-full or other I/O error raises a one-line :class:`lab.runs.store.WriteError` and leaves
    ``directory`` as it was; the NetCDF files are written in a forked child
    (:func:`lab.runs.isolated.write_in_child`), since h5py can crash the process on a full disk.
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
