"""A run opened for reporting: its files, or the in-memory result of :func:`lab.runs.execution.execute`.

A report reads what the run stored and never predicts again or re-creates the data (a report
of a posterior and its data in memory, :meth:`ReportRun.from_posterior`, predicts once, as a run does):

* ``metrics.json``, ``config.json`` — test metrics, spec, backend options, data summary;
* ``posterior.nc`` — test-set InferenceData whose ``predictions`` group holds the run's own
  prediction (PIT values, predictive mean / sd / intervals, class probabilities) and whose
  ``constant_data`` holds 1-D inputs;
* ``train.nc`` — InferenceData on (a seeded subset of) the training points, for PSIS-LOO;
* ``posterior/`` — the saved posterior, loaded only by sections that read its parameters.

:func:`open_run` refuses a folder that is not a complete run (no ``COMPLETE`` marker, or a
file changed since it was written); :meth:`ReportRun.from_result` wraps an in-memory
:class:`~lab.runs.execution.RunResult` without touching files, and :meth:`ReportRun.from_posterior` builds the
same in-memory run from a fitted posterior and its :class:`~zoo.data.Dataset`.  A section that needs something the run
lacks raises :class:`NotApplicable`, which the report renders as a one-line remark.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from zoo.checks import check_dataset, check_input, check_targets
from zoo.data import DataError, Dataset
from zoo.data.fingerprint import data_fingerprint

from inference.evaluation.arviz_export import load_netcdf
from inference.storage.net_spec import describe_spec, net_spec
from inference.posterior import Posterior, load_posterior, to_jsonable
from lab.runs.evaluation import evaluate_posterior
from lab.runs.execution import RunResult
from lab.runs.store import StoreError, verify_run

__all__ = ["ReportRun", "NotApplicable", "open_run", "as_run", "tensors_as_dataset", "tensors_evaluation",
           "describe_selection", "REQUIRED_FILES"]

#: files every reportable run holds (``train.nc`` and ``posterior/`` are optional)
REQUIRED_FILES = ("metrics.json", "config.json", "posterior.nc")


class NotApplicable(Exception):
    """A report section does not apply to this run (the message says why, in one line)."""


class ReportRun:
    """One run as a report reads it: a run folder read back, or an in-memory result or posterior.

    Args:
        name: the run's label in comparisons (the directory name for a run folder).
        metrics: the ``metrics.json`` record.
        config: the ``config.json`` record (``spec``, ``backend_options``, ``data``, ``prune``).
        idata: test-set InferenceData (``posterior.nc``).
        train_idata: training-subset InferenceData (``train.nc``), or ``None``.
        posterior: the fitted posterior, or ``None``.
        info: the posterior's ``info`` record.
        directory: the run folder, or ``None`` for a run held only in memory.
    """

    def __init__(self, name: str, metrics: dict, config: dict, idata, train_idata=None, posterior=None,
                 info: Optional[dict] = None, directory=None):
        self.name = name
        self.metrics = dict(metrics)
        self.config = dict(config or {})
        self.spec = self.config.get("spec") or {}
        self.info = dict(info or {})
        self.directory = Path(directory) if directory is not None else None
        self._parts = {"idata": idata, "train_idata": train_idata, "posterior": posterior}

    @classmethod
    def from_directory(cls, directory) -> "ReportRun":
        """A complete run folder, verified first (:func:`lab.runs.store.verify_run`: it is not trusted);
        parts are read when first needed, and only files that ``COMPLETE`` lists."""
        directory = Path(directory)
        listed = verify_run(directory, required=REQUIRED_FILES)["files"]
        return cls(
            name=directory.resolve().name,
            metrics=_read_json(directory / "metrics.json"),
            config=_read_json(directory / "config.json"),
            idata=_Deferred(load_netcdf, directory / "posterior.nc"),
            train_idata=_Deferred(load_netcdf, directory / "train.nc") if "train.nc" in listed else None,
            posterior=_Deferred(_load_posterior, directory / "posterior") if any(
                name.startswith("posterior/") for name in listed) else None,
            info=_read_json(directory / "posterior" / "info.json") if "posterior/info.json" in listed else {},
            directory=directory,
        )

    @classmethod
    def from_result(cls, result, name: Optional[str] = None) -> "ReportRun":
        """A :class:`~lab.runs.execution.RunResult` in memory (nothing is read or written)."""
        metrics = to_jsonable(result.metrics)
        if name is None:
            name = (Path(result.directory).name if result.directory is not None else
                    "-".join(str(metrics.get(k, "?")) for k in ("data", "model", "stochastic", "backend"))
                    + f"-seed{metrics.get('seed', '?')}")
        return cls(name, metrics, to_jsonable(result.config), result.idata, result.train_idata, result.posterior,
                   info=to_jsonable(result.posterior.info),
                   directory=result.directory)

    @classmethod
    def from_posterior(cls, posterior: Posterior, data: Dataset, seed: int = 0,
                       name: Optional[str] = None, evaluation: Optional[dict] = None) -> "ReportRun":
        """The run of a fitted ``posterior`` on ``data``, in memory: what :func:`lab.runs.execution.execute` builds.

        Predicts the test set once (``seed``), evaluates it, exports the test-set and LOO
        training-subset InferenceData and records the posterior's identity; ``data`` must be
        the :class:`~zoo.data.Dataset` the posterior was fitted on (its standardisation).
        ``evaluation`` says what ``data``'s two parts are (:attr:`evaluation`; default: a held-out
        test split and the fit's own training points).
        """
        if not isinstance(posterior, Posterior):
            raise ValueError(f"expected a fitted Posterior, got {type(posterior).__name__}")
        if not isinstance(data, Dataset):
            raise ValueError(f"a report of a posterior needs its zoo.data.Dataset (train and test splits), got "
                             f"{type(data).__name__}")
        bnn, info = posterior.bnn, posterior.info
        if bnn.likelihood.task != data.task:
            raise ValueError(f"the posterior is for {bnn.likelihood.task} but the data {data.name!r} are {data.task}")
        evaluated = evaluate_posterior(posterior, data, seed)
        metrics, idata, train_idata = evaluated.metrics, evaluated.idata, evaluated.train_idata
        backend = str(info.get("backend", "?"))
        metrics.update(n_train=data.n_train, n_test=data.n_test, num_random=bnn.num_random, backend=backend,
                       model=describe_spec(net_spec(bnn.net)), data=data.name, seed=info.get("seed", seed), task=data.task,
                       stochastic=describe_selection(bnn))
        if "fit_seconds" in info:
            metrics["fit_seconds"] = info["fit_seconds"]
        model = {"network": metrics["model"], "stochastic": metrics["stochastic"],
                 "random sites": ", ".join(s.name for s in bnn.sites) or "none", "random parameters": bnn.num_random,
                 "prior": repr(bnn.prior), "likelihood": repr(bnn.likelihood),
                 "train_deterministic": bnn.train_deterministic, "fitted on (rows)": info.get("num_data")}
        config = {"spec": {}, "model": model, "backend_options": info.get("config") or {}, "data": data.summary(),
                  "prune": info.get("pruning"), "evaluation": dict(evaluation or {}), "source": "posterior"}
        if name is None:
            name = "-".join(str(metrics[k]) for k in ("data", "model", "backend")) + f"-seed{metrics['seed']}"
        return cls(name, to_jsonable(metrics), to_jsonable(config), idata, train_idata, posterior,
                   info=to_jsonable(info))

    def _part(self, key: str, missing: str):
        value = self._parts[key]
        if value is None:
            raise NotApplicable(missing)
        if isinstance(value, _Deferred):
            value = self._parts[key] = value.load()
        return value

    # ------------------------------------------------------------------ parts
    @property
    def idata(self):
        """Test-set InferenceData (``posterior.nc``)."""
        return self._part("idata", f"the run has no InferenceData of its evaluated points ({self.stored('idata')})")

    @property
    def train_idata(self):
        """InferenceData on the seeded training subset (``train.nc``), for PSIS-LOO / WAIC."""
        return self._part("train_idata", f"the run has no training-set InferenceData ({self.stored('train_idata')})")

    @property
    def posterior(self):
        """The fitted posterior (loaded from ``posterior/`` for a run folder)."""
        return self._part("posterior", "the run has no saved posterior")

    def predictions(self):
        """The ``predictions`` group of ``posterior.nc``: the run's own per-point test-set summaries."""
        idata = self.idata
        if "predictions" not in idata.groups():
            raise NotApplicable(f"{self.stored('idata')} holds no predictions group (exported without the run's "
                                "prediction)")
        return idata.predictions

    # ------------------------------------------------------------------ what the data are
    @property
    def evaluation(self) -> dict:
        """What the report's data are: ``kind`` of the evaluated points — ``"test"`` (a held-out split, the
        default), ``"in-sample"`` (the fit's own training points) or ``"given"`` (points passed to the
        report, not recognised as the fit's) — and ``train``, the points PSIS-LOO reads: ``"fitted"``
        (the fit's own, the default), ``"unknown"`` (not checkable) or ``"other"`` (not the fit's)."""
        return {"kind": "test", "train": "fitted", **(self.config.get("evaluation") or {})}

    def evaluated(self, count=None) -> str:
        """The evaluated points in words, e.g. ``"the 200 held-out test points"``."""
        number = f"{count} " if count is not None else ""
        return {"test": f"the {number}held-out test points",
                "in-sample": f"the {number}training points (in-sample: the fit's own data)",
                "given": f"the {number}points passed to the report"}[self.evaluation["kind"]]

    @property
    def evaluation_word(self) -> str:
        """The adjective of metrics on the evaluated points: ``test``, ``in-sample`` or ``evaluation``."""
        return {"test": "test", "in-sample": "in-sample", "given": "evaluation"}[self.evaluation["kind"]]

    @property
    def is_posterior_report(self) -> bool:
        """Whether this is a posterior reported from memory (:meth:`from_posterior`), with no run files
        (a run folder or a ``RunResult`` has them, written or not)."""
        return self.config.get("source") == "posterior"

    def stored(self, part: str) -> str:
        """Where a part of the run is: its run file (``idata``: ``posterior.nc``, ``train_idata``: ``train.nc``,
        ``metrics``, ``config``), or for a posterior reported from memory what it is there."""
        files = {"idata": "posterior.nc", "train_idata": "train.nc", "metrics": "metrics.json", "config": "config.json"}
        if not self.is_posterior_report:
            return files[part]
        return {"idata": "the report's InferenceData of the evaluated points (in memory)",
                "train_idata": "the report's InferenceData of the training points (in memory)",
                "metrics": "the report's metrics (in memory)", "config": "the posterior's record"}[part]

    # ------------------------------------------------------------------ identity
    @property
    def backend(self) -> str:
        return str(self.metrics.get("backend") or self.spec.get("backend") or self.idata.attrs.get("backend", "?"))

    @property
    def task(self) -> str:
        return str(self.metrics.get("task") or self.idata.attrs.get("task", "regression"))

    @property
    def n_train(self) -> Optional[int]:
        """Training-set size from ``metrics.json`` or the data summary, if recorded."""
        value = self.metrics.get("n_train", (self.config.get("data") or {}).get("n_train"))
        return int(value) if value is not None else None

    def title(self) -> str:
        m = self.metrics
        return (
            f"{m.get('data', '?')} · {m.get('model', '?')} · stochastic={m.get('stochastic', '?')} · "
            f"backend={self.backend} · seed {m.get('seed', '?')}"
        )


def open_run(directory) -> ReportRun:
    """A :class:`ReportRun` of a complete run folder, or a one-line ``StoreError`` saying why not.

    The folder must carry the ``COMPLETE`` marker written last by :func:`lab.runs.execution.execute` and
    every file it lists, unchanged: a half-written or damaged run is never rendered.
    """
    try:
        return ReportRun.from_directory(directory)
    except StoreError as err:
        raise StoreError(f"cannot report on {directory}: {err} (runs are written by "
                         "'python -m zoo fit ... --out DIR')") from None


def tensors_as_dataset(bnn, data: Sequence[torch.Tensor]) -> Dataset:
    """``(x, y)`` or ``(x_train, y_train, x_test, y_test)`` in the units given to :func:`inference.fit`
    as a :class:`~zoo.data.Dataset` for a report.

    Inputs are taken as the network takes them (no input scaling); regression targets ``[N, T]``
    are standardised by the model's ``target_loc`` / ``target_scale`` (its original units are
    ``y * target_scale + target_loc``), class labels are ``[N]`` integers.  With two tensors the
    same points are the training points (PSIS-LOO) and the evaluation points of the report
    (:func:`tensors_evaluation` says whether they are the fit's own).
    """
    if len(data) not in (2, 4) or not all(isinstance(t, torch.Tensor) for t in data):
        kinds = ", ".join(type(t).__name__ for t in data)
        raise ValueError(f"data= must be a zoo.data.Dataset, or 2 or 4 tensors (x, y) / (x_train, y_train, x_test, "
                         f"y_test) as given to fit; got {len(data)} item(s): {kinds}")
    x_train, y_train, x_test, y_test = data if len(data) == 4 else (*data, *data)
    task = bnn.likelihood.task
    like = {"dtype": torch.float32}
    if task == "regression":
        y_train, y_test = (y.reshape(y.shape[0], -1).to(**like) for y in (y_train, y_test))
    else:
        y_train, y_test = y_train.long(), y_test.long()
    width = x_train.shape[-1]
    try:
        return Dataset(
            name="data passed to the report", task=task,
            x_train=x_train.to(**like), y_train=y_train, x_test=x_test.to(**like), y_test=y_test,
            x_loc=torch.zeros(width), x_scale=torch.ones(width),
            y_loc=bnn.target_loc.detach().cpu().to(**like), y_scale=bnn.target_scale.detach().cpu().to(**like),
            num_classes=bnn.output_dim if task == "classification" else None,
        )
    except DataError as err:
        raise ValueError(f"data= for the report: {err}") from None


def tensors_evaluation(posterior: Posterior, data: Sequence[torch.Tensor]) -> dict:
    """What tensors passed to a report are (:attr:`ReportRun.evaluation`), by their
    :func:`~zoo.data.fingerprint.data_fingerprint` against the one :func:`inference.fit` recorded
    (``info["data_fingerprint"]``): the fit's own training points (equal values, a copy or the tensors
    themselves) or other points.  Without a recorded fingerprint (a fit from a DataLoader, an older
    save) the training part is ``"unknown"`` and the evaluated points are ``"given"``."""
    recorded = posterior.info.get("data_fingerprint")
    x_train, y_train, x_test, y_test = data if len(data) == 4 else (*data, *data)

    def fitted(x, y) -> Optional[bool]:
        if recorded is None:
            return None
        x = check_input(posterior.bnn, x, "data x")
        return data_fingerprint(x, check_targets(posterior.bnn, y, x.shape[0], "data y")) == recorded

    train = fitted(x_train, y_train)
    same = len(data) == 2 or all(a is b for a, b in ((x_train, x_test), (y_train, y_test)))
    test = train if same else fitted(x_test, y_test)
    return {"kind": "in-sample" if test else "given", "train": {True: "fitted", False: "other"}.get(train, "unknown")}


def describe_selection(bnn) -> str:
    """The model's ``stochastic`` selection in words: the name given (``"last"``, ``"fc2,out"``) or, for a
    selector object or masks, its type and the random sites."""
    selection = bnn.selection
    if isinstance(selection, str):
        return selection
    if isinstance(selection, (list, tuple)) and all(isinstance(p, str) for p in selection):
        return ",".join(selection)
    sites = ", ".join(s.name for s in bnn.sites) or "none"
    return f"{type(selection).__name__} (sites {sites})"


def as_run(run, data: Optional[Dataset] = None, seed: int = 0) -> ReportRun:
    """``run`` as a :class:`ReportRun`: a ReportRun, a :class:`~lab.runs.execution.RunResult`, a run folder, or a
    fitted :class:`~inference.posterior.Posterior` with its ``data`` (:meth:`ReportRun.from_posterior`, ``seed``)."""
    if isinstance(run, Posterior):
        if data is None:
            raise ValueError("a report of a posterior needs the data it was fitted on: pass data=dataset "
                             "(a zoo.data.Dataset) or data=(x, y) / (x_train, y_train, x_test, y_test) tensors "
                             "as given to fit, e.g. write_report(posterior, 'report.html', data=(x, y))")
        evaluation = None
        if isinstance(data, (tuple, list)):  # the points given: the fit's own size is not required
            tensors, data = data, tensors_as_dataset(run.bnn, data)
            check_dataset(run.bnn, data, "data")
            evaluation = tensors_evaluation(run, tensors)
        else:  # the Dataset the posterior was fitted on: its scaling and training size must match
            check_dataset(run.bnn, data, "data", num_data=run.info.get("num_data"))
        return ReportRun.from_posterior(run, data, seed=seed, evaluation=evaluation)
    if data is not None:
        raise ValueError(f"data= is for a report of a Posterior; a {type(run).__name__} holds its own data")
    if isinstance(run, ReportRun):
        return run
    if isinstance(run, RunResult):
        return ReportRun.from_result(run)
    return open_run(run)


class _Deferred:
    """A file read when a section first needs it."""

    def __init__(self, read, path: Path):
        self.read, self.path = read, path

    def load(self):
        return self.read(self.path)


def _load_posterior(path: Path):
    try:
        return load_posterior(path)
    except FileNotFoundError as err:
        raise NotApplicable(f"the saved posterior is unavailable ({err})") from None


def _read_json(path: Path) -> dict:
    """A JSON object from a verified run file; anything else is a one-line :class:`StoreError`."""
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError, RecursionError) as err:
        raise StoreError(f"{path} is not readable JSON ({type(err).__name__})") from None
    if not isinstance(value, dict):
        raise StoreError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value
