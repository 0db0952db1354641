"""One grid run in a worker: :func:`run_one` executes and writes it, :func:`is_finished` says whether it is done.

A grid run (:class:`lab.grids.experiment.GridRun`) goes through :func:`lab.runs.execution.execute` with its own data
(:func:`lab.grids.experiment.load_run_data`) and is written whole, its extra metrics included, into
``root/<key>/`` (:func:`lab.runs.execution.write_run`).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import torch

from inference.posterior import to_jsonable
from zoo.data import load_dataset

from .experiment import EXTRAS, GridRun, load_run_data
from lab.runs.spec import RunSpec
from lab.runs.execution import RUN_FILES, execute, write_run
from lab.runs.store import StoreError, verify_run

__all__ = ["run_one", "is_finished", "outdated", "metrics_path"]


def metrics_path(root, key: str) -> Path:
    """``root/key/metrics.json``: the metrics of grid run ``key``."""
    return Path(root) / key / "metrics.json"


def _jsonable_spec(spec: dict) -> dict:
    return json.loads(json.dumps(to_jsonable(spec)))


def is_finished(root, run: GridRun) -> bool:
    """Whether ``root/run.key`` holds a complete, undamaged run of the same spec (else it is run again).

    A spec written before a :class:`~lab.runs.spec.RunSpec` field existed counts as having that field
    at its default (so adding a field does not invalidate finished runs).
    """
    directory = Path(root) / run.key
    try:
        verify_run(directory, RUN_FILES)
        config = json.loads((directory / "config.json").read_text())
    except (StoreError, OSError, json.JSONDecodeError):
        return False
    stored = config.get("spec")
    if not isinstance(stored, dict):
        return False
    defaults = _jsonable_spec(RunSpec(data=run.spec.data).to_dict())
    return {**defaults, **stored} == _jsonable_spec(run.spec.to_dict())


def outdated(root, runs) -> list:
    """Keys of ``runs`` whose folder in ``root`` holds a complete run of *another* spec: the grid's settings changed
    since it was fitted, so it is neither taken from the cache nor shown in the tables until it is refitted."""
    keys = []
    for run in runs:
        try:
            verify_run(Path(root) / run.key, RUN_FILES)
        except (StoreError, OSError):
            continue
        if not is_finished(root, run):
            keys.append(run.key)
    return keys


def run_one(run: GridRun, root, prerequisite: Optional[GridRun] = None, threads: Optional[int] = 1) -> dict:
    """Execute ``run`` and write it, with its extra metrics, into ``root/run.key``; returns the metrics.

    A damaged or stale folder at ``root/run.key`` is replaced whole.
    """
    if threads:
        torch.set_num_threads(threads)
    started, cpu_started = time.perf_counter(), time.process_time()
    spec = run.spec
    data = load_run_data(run, root, prerequisite)
    if data is None:
        data = load_dataset(spec.data, split=spec.split, seed=spec.seed, **spec.data_options)
    result = execute(spec, progress=False, data=data)
    for name in run.extras:
        result.metrics.update(EXTRAS[name].compute(result.prediction, data))
    if prerequisite is not None:  # e.g. the deterministic body a frozen-body head was fitted on
        prerequisite_metrics = json.loads(metrics_path(root, prerequisite.key).read_text())
        result.metrics["pretrain_seconds"] = prerequisite_metrics["fit_seconds"]
    result.metrics["run_seconds"] = time.perf_counter() - started
    result.metrics["run_cpu_seconds"] = time.process_time() - cpu_started  # the cost on a shared machine
    write_run(result, Path(root) / run.key, overwrite=True)
    return result.metrics
