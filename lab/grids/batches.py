"""Grid runs that differ only in split or seed, fitted as one stacked program (:func:`inference.fit_many`).

:func:`group_runs` puts runs of a backend with a stacked engine (``map``, ``ensemble``, ``svi``, ``radial``) whose specs are
equal but for ``split`` and ``seed`` (no dataset builder, no prerequisite, no pruning) into
:class:`RunBatch` es of at most ``size`` runs; every other run stays alone.  :func:`run_batch` (in
a worker) loads each run's data, builds each run's model as :func:`lab.runs.execution.execute` would, fits
them together and then evaluates and writes each run into its own folder through
:func:`lab.runs.execution.execute` (``fitted=``) and :func:`lab.runs.execution.write_run`, so a batched run's folder
is a one-at-a-time run's folder: same files, same metrics (the fit agrees to float rounding).
A batch whose fits cannot be stacked after all (another data size, a blocker found on the built
model) runs its runs one at a time.  ``metrics.json`` records ``batched_fits`` (K) and
``run_cpu_seconds`` = the run's share of the batch's fit plus its own evaluation.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Optional

import torch

from inference.backends import stacked_backends
from inference.fitting import fit_many
from inference.posterior import to_jsonable
from zoo.data import load_dataset

from .experiment import EXTRAS, GridRun
from lab.runs.model import build_model
from lab.runs.spec import resolve_run, validate_spec
from lab.runs.execution import execute, write_run

__all__ = ["RunBatch", "batch_key", "group_runs", "run_batch"]


@dataclass
class RunBatch:
    """Runs fitted together; scheduled like one run (``key`` names the batch, ``after`` is ``None``)."""

    runs: list
    after: Optional[str] = None

    @property
    def key(self) -> str:
        return f"{self.runs[0].key} (+{len(self.runs) - 1} batched)"


def batch_key(run: GridRun) -> Optional[str]:
    """What runs must share to be stacked (their spec but split and seed), or ``None`` for a run fitted alone."""
    spec = run.spec
    if spec.backend not in stacked_backends() or run.dataset is not None or run.after is not None \
            or spec.prune != "none":
        return None
    identity = {k: v for k, v in spec.to_dict().items() if k not in ("split", "seed")}
    return json.dumps([to_jsonable(identity), sorted(run.extras)], sort_keys=True, default=str)


def group_runs(runs: list, size: int) -> list:
    """``runs`` as :class:`GridRun` s and :class:`RunBatch` es of at most ``size`` compatible runs, in the
    order of each group's first run (``size`` ≤ 1: every run alone)."""
    if size <= 1:
        return list(runs)
    groups, order = {}, []
    for run in runs:
        key = batch_key(run)
        if key is None:
            order.append(run)
            continue
        if key not in groups or len(groups[key].runs) >= size:
            groups[key] = RunBatch([])
            order.append(groups[key])
        groups[key].runs.append(run)
    return [item.runs[0] if isinstance(item, RunBatch) and len(item.runs) == 1 else item for item in order]


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def run_batch(batch: RunBatch, root, run_alone, threads: Optional[int] = 1) -> dict:
    """Fit ``batch``'s runs together and write each into ``root/<key>``; ``{key: None or error text}``.

    ``run_alone(run)`` runs one run by itself (the fallback when the fits cannot be stacked).
    """
    if threads:
        torch.set_num_threads(threads)
    runs, outcome = batch.runs, {}
    cpu_started = time.process_time()
    try:
        checked = [validate_spec(run.spec) for run in runs]
        datas = [load_dataset(r.spec.data, split=r.spec.split, seed=r.spec.seed, **r.spec.data_options) for r in runs]
        resolved = [resolve_run(r.spec, d, c) for r, d, c in zip(runs, datas, checked)]
        if any(r.options != resolved[0].options for r in resolved):
            raise ValueError("the runs' resolved options differ")
        bnns = [build_model(r.spec, d, res.likelihood) for r, d, res in zip(runs, datas, resolved)]
        fits = fit_many(bnns, [d.x_train for d in datas], [d.y_train for d in datas], backend=runs[0].spec.backend,
                        seeds=[r.spec.seed for r in runs], **resolved[0].options)
    except ValueError:  # not stackable after all: one at a time, as without batching
        for run in runs:
            try:
                run_alone(run)
                outcome[run.key] = None
            except Exception as err:  # noqa: BLE001 - one failed run, listed in failures.txt
                outcome[run.key] = _error_text(err)
        return outcome
    fit_cpu = (time.process_time() - cpu_started) / len(runs)
    for run, data, fitted in zip(runs, datas, fits):
        started, cpu = time.perf_counter(), time.process_time()
        try:
            if isinstance(fitted, Exception):
                raise fitted
            result = execute(run.spec, progress=False, data=data, fitted=fitted)
            for name in run.extras:
                result.metrics.update(EXTRAS[name].compute(result.prediction, data))
            result.metrics["run_seconds"] = time.perf_counter() - started + fitted.info["fit_seconds"]
            result.metrics["run_cpu_seconds"] = time.process_time() - cpu + fit_cpu
            result.metrics["batched_fits"] = len(runs)
            write_run(result, root / run.key, overwrite=True)
            outcome[run.key] = None
        except Exception as err:  # noqa: BLE001 - one failed run, listed in failures.txt
            outcome[run.key] = _error_text(err)
    return outcome
