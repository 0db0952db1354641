"""Experiment runner: ``python -m zoo experiment NAME [--fast] [--out DIR] [--executor local|ray]``.

Runs a named grid of :mod:`lab.grids` (dataset × architecture × stochastic subset ×
backend × splits / seeds).  Every run goes through :func:`lab.runs.execute` and is written whole
(:func:`lab.runs.write_run`, extra metrics included) into ``DIR/runs/<key>/``.  A run folder that
:func:`lab.store.verify_run` accepts (sealed, every file of its recorded size and digest) and
whose ``config.json`` holds the same spec is skipped, so an interrupted sweep resumes where it
stopped (and a changed grid, or a damaged run, re-runs what changed).  One experiment at a time
may use ``DIR`` (:class:`lab.store.RunLock` on ``DIR/.lock``; a second one exits with status 2
naming the holder).  Runs execute in local worker processes (``--workers N``, default 2, one torch
thread each; ``--workers 0`` runs them in this process), which die with the experiment even when it
is killed (``SIGKILL``), or, with ``--executor ray``, as Ray tasks on an existing cluster
(``--ray-address``) or a local Ray instance; the run directories must then be on a file system the
Ray workers share.  A run that needs another (``Run.after``) is started once that one has finished.
A run whose fit fails (including :class:`lab.runs.RunFailed`) is listed in ``failures.txt``.
``--only REGEX`` runs the runs whose key matches (and the runs they need) — the tables still cover
every finished run of the grid, so a partial re-run never shrinks them; ``--time-limit S`` starts
no run after S seconds, lets the started ones finish and writes the tables of what is done (the
wall-time line says how many runs were left); ``--runs DIR`` keeps the run folders in DIR
instead of ``OUT/runs``, so grids that hold the same runs (same key and spec: ``bdl-baselines``
and ``uci-benchmark``) fit them once.

Outputs: ``DIR/results.csv`` (one row per run: labels and metrics), ``DIR/summary.csv`` and
``DIR/summary.md`` (mean ± standard error over splits / seeds per configuration, n runs, the number
flagged ``failed_fit`` (:mod:`inference.evaluation.sanity`), published numbers where the grid has them),
``DIR/*.png`` figures, ``DIR/failures.txt`` if runs failed.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import Optional

import torch

from inference.posterior import to_jsonable
from inference.workers import ctrl_c_held, stop_workers, worker_pool
from zoo.data import load_dataset

from .grid_runs import EXTRAS, Experiment, Run, load_run_data
from .grids import EXPERIMENTS
from .run_batches import RunBatch, group_runs, run_batch
from .runs import RUN_FILES, RunSpec, execute, write_run
from .store import RunLock, StoreError, check_folder, verify_run
from .tables import make_figures, summarise, summary_markdown, timing_line

__all__ = ["run_experiment", "run_one", "is_finished", "add_experiment_arguments", "run_experiment_command", "EXECUTORS"]

EXECUTORS = ("local", "ray")


# --------------------------------------------------------------------------------------------
# One run (in a worker)
# --------------------------------------------------------------------------------------------


def _metrics_path(root: Path, key: str) -> Path:
    return Path(root) / key / "metrics.json"


def _jsonable_spec(spec: dict) -> dict:
    return json.loads(json.dumps(to_jsonable(spec)))


def is_finished(root, run: Run) -> bool:
    """Whether ``root/run.key`` holds a complete, undamaged run of the same spec (else it is run again).

    A spec written before a :class:`~lab.runs.RunSpec` field existed counts as having that field
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


def run_one(run: Run, root, prerequisite: Optional[Run] = None, threads: Optional[int] = 1) -> dict:
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
        result.metrics.update(EXTRAS[name](result.prediction, data))
    if prerequisite is not None:  # e.g. the deterministic body a frozen-body head was fitted on
        prerequisite_metrics = json.loads(_metrics_path(root, prerequisite.key).read_text())
        result.metrics["pretrain_seconds"] = prerequisite_metrics["fit_seconds"]
    result.metrics["run_seconds"] = time.perf_counter() - started
    result.metrics["run_cpu_seconds"] = time.process_time() - cpu_started  # the cost on a shared machine
    write_run(result, Path(root) / run.key, overwrite=True)
    return result.metrics


# --------------------------------------------------------------------------------------------
# Executors
# --------------------------------------------------------------------------------------------


class _Inline(cf.Executor):
    """Runs each submitted call at once in this process (``--workers 0``)."""

    def submit(self, fn, *args, **kwargs):
        future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 - handed to the scheduler like a worker's error
            future.set_exception(err)
        return future


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def _wait_futures(handles):
    done, _ = cf.wait(handles, return_when=cf.FIRST_COMPLETED)
    handle = next(iter(done))
    err = handle.exception()
    return handle, None if err is None else _error_text(err)


def _schedule(runs, by_key, finished: set, submit, wait_one, bar, deadline: Optional[float] = None,
              capacity: Optional[int] = None):
    """Submit every run once its prerequisite has finished, at most ``capacity`` at a time and none
    after ``deadline`` (``time.monotonic``).

    Returns ``({key: error} of failed runs, [runs never started])``.
    """
    queue, running, failures = list(runs), {}, {}
    while queue or running:
        past_deadline = deadline is not None and time.monotonic() >= deadline
        for run in [] if past_deadline else list(queue):  # past the deadline: wait for the started runs only
            if capacity is not None and len(running) >= capacity:
                break
            if run.after is None or run.after in finished:
                running[submit(run, by_key.get(run.after))] = run
                queue.remove(run)
            elif run.after in failures:
                failures[run.key] = f"prerequisite {run.after} failed"
                queue.remove(run)
                bar.update()
        if not running:  # nothing started and nothing startable: the rest waits on runs not in the grid
            if not past_deadline:
                failures.update({r.key: f"prerequisite {r.after} is not in the grid" for r in queue})
                queue = []
            break
        handle, error = wait_one(list(running))
        run = running.pop(handle)
        outcomes = {run.key: error}
        if isinstance(run, RunBatch):  # a batch's future returns each run's outcome
            outcomes = handle.result() if error is None else {r.key: error for r in run.runs}
        for key, error in outcomes.items():
            if error is None:
                finished.add(key)
            else:
                failures[key] = error
                bar.write(f"run {key} failed: {error}")
            bar.update()
    return failures, [r for item in queue for r in (item.runs if isinstance(item, RunBatch) else [item])]


class _Workers:
    """The local worker pool, started again when a worker process died (e.g. killed from outside):
    the runs it held fail (``BrokenProcessPool``, listed in failures.txt) and the sweep goes on.
    Workers are spawned with Ctrl-C held (:func:`inference.workers.ctrl_c_held`)."""

    def __init__(self, workers: int):
        with ctrl_c_held():
            self.workers, self.pool = workers, worker_pool(workers)

    def submit(self, *args):
        with ctrl_c_held():  # the pool spawns its processes on submit
            try:
                return self.pool.submit(*args)
            except BrokenProcessPool:
                stop_workers(self.pool)
                self.pool = worker_pool(self.workers)
                return self.pool.submit(*args)


def _run_local(runs, by_key, finished, root, workers, bar, deadline=None):
    pool = _Inline() if workers == 0 else _Workers(workers)
    threads = None if workers == 0 else 1

    def submit(run, prerequisite):
        if isinstance(run, RunBatch):  # fitted as one stacked program (lab.run_batches)
            return pool.submit(run_batch, run, Path(root), partial(run_one, root=root, threads=threads), threads)
        return pool.submit(run_one, run, root, prerequisite, threads)

    try:
        outcome = _schedule(runs, by_key, finished, submit, _wait_futures, bar, deadline, max(int(workers), 1))
    except BaseException:
        if workers:
            stop_workers(pool.pool)
        raise
    if workers:
        pool.pool.shutdown()
    return outcome


def _run_ray(runs, by_key, finished, root, workers, bar, address, deadline=None):
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray: pip install 'bnn-zoo[ray]' (or pip install ray)") from None
    started_here = not ray.is_initialized()
    if started_here:
        local = {} if address else {"num_cpus": max(workers, 1), "include_dashboard": False}
        ray.init(address=address, log_to_driver=False, configure_logging=False, **local)
    remote = ray.remote(num_cpus=1)(run_one)

    def wait_one(handles):
        ready, _ = ray.wait(handles, num_returns=1)
        try:
            ray.get(ready[0])
            return ready[0], None
        except Exception as err:  # noqa: BLE001 - a failed task is a failed run
            return ready[0], _error_text(getattr(err, "cause", None) or err)

    try:
        return _schedule(runs, by_key, finished, lambda r, p: remote.remote(r, str(root), p, 1), wait_one, bar,
                         deadline, None if deadline is None else max(int(workers), 1))
    finally:
        if started_here:
            ray.shutdown()


def _select(runs, only: Optional[str]) -> list:
    """The runs whose key matches the regular expression ``only`` and, recursively, the runs they need."""
    if only is None:
        return runs
    try:
        pattern = re.compile(only)
    except re.error as err:
        raise ValueError(f"--only {only!r} is not a regular expression: {err}") from None
    by_key = {r.key: r for r in runs}
    keep = {r.key for r in runs if pattern.search(r.key)}
    if not keep:
        raise ValueError(f"--only {only!r} matches no run key of this grid (e.g. {runs[0].key!r})")
    todo = list(keep)
    while todo:
        after = by_key[todo.pop()].after
        if after in by_key and after not in keep:
            keep.add(after)
            todo.append(after)
    return [r for r in runs if r.key in keep]


def run_experiment(name: str, out, fast: bool = False, executor: str = "local", workers: int = 2,
                   data_root=None, ray_address: Optional[str] = None, progress: bool = True,
                   only: Optional[str] = None, time_limit: Optional[float] = None, runs_dir=None,
                   batch_fits: int = 10) -> dict:
    """Run grid ``name`` into ``out`` (skipping finished runs) and write its tables and figures.

    ``only``: a regular expression on run keys: only the matching runs and their prerequisites are
    fitted, and the tables hold every finished run of the grid;
    ``time_limit``: seconds after which no run is started; ``runs_dir``: the folder of run
    directories (default ``out/runs``); ``batch_fits``: at most this many runs that differ only in split or
    seed are fitted as one stacked program (:mod:`lab.run_batches`; local executor; 1: every run alone).
    Returns ``{"results": DataFrame, "summary": DataFrame,
    "failures": {key: error}, "skipped": n, "not_started": n, "files": [paths], "wall_seconds": s}``;
    ``summary.md`` ends with the wall time of this invocation and the summed run times of all
    runs in the table.
    """
    started = time.perf_counter()
    from tqdm.auto import tqdm

    experiment = get_experiment(name)
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    if int(batch_fits) < 1:
        raise ValueError(f"--batch-fits must be at least 1 (1: every run fitted alone), got {batch_fits}")
    if int(workers) < 0:
        raise ValueError(f"--workers must be 0 (run in this process) or more, got {workers}")
    if data_root is not None and not Path(data_root).is_dir():
        raise ValueError(f"--data-root {data_root} is not a folder")
    if time_limit is not None and not float(time_limit) > 0:
        raise ValueError(f"--time-limit must be a positive number of seconds, got {time_limit}")
    runs = experiment.build(fast, None if data_root is None else str(Path(data_root).resolve()))
    if not runs:
        raise ValueError(f"experiment {name!r} has no runs here (its backends are not registered)")
    by_key = {r.key: r for r in runs}
    if len(by_key) != len(runs):
        raise ValueError(f"experiment {name!r} has duplicate run keys")
    grid, runs = runs, _select(runs, only)
    out = check_folder(out)
    root = out / "runs" if runs_dir is None else check_folder(runs_dir)
    root.mkdir(parents=True, exist_ok=True)
    deadline = None if time_limit is None else time.monotonic() + float(time_limit)
    with RunLock(out):
        finished = {r.key for r in runs if is_finished(root, r)}
        todo = [r for r in runs if r.key not in finished]
        bar = tqdm(total=len(runs), initial=len(finished), desc=name, unit="run", disable=not progress)
        with bar:
            if executor == "local":
                failures, left = _run_local(group_runs(todo, int(batch_fits)), by_key, finished, root, int(workers),
                                            bar, deadline)
            else:
                failures, left = _run_ray(todo, by_key, finished, root, int(workers), bar, ray_address, deadline)
        timing = {"wall_seconds": time.perf_counter() - started, "workers": int(workers), "executor": executor,
                  "fitted": len(todo) - len(left), "found_done": len(runs) - len(todo), "not_started": len(left)}
        results, summary, files = write_tables(experiment, grid, root, out, failures, timing)
    return {"results": results, "summary": summary, "failures": failures, "skipped": len(runs) - len(todo),
            "not_started": len(left), "files": files, "wall_seconds": timing["wall_seconds"]}


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        names = [n for n, e in EXPERIMENTS.items() if not e.hidden]
        raise ValueError(f"unknown experiment {name!r}; valid experiments: {', '.join(names)}")
    return EXPERIMENTS[name]


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def collect(runs, root):
    """One row per finished run: key, labels and scalar metrics (a pandas DataFrame)."""
    import pandas as pd

    rows = []
    for run in runs:
        if not is_finished(root, run):
            continue
        metrics = json.loads(_metrics_path(root, run.key).read_text())
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or v is None}
        rows.append({"key": run.key, **scalars, **run.labels})
    return pd.DataFrame(rows)


def write_tables(experiment: Experiment, runs, root, out, failures, timing: Optional[dict] = None):
    """Write results.csv, summary.csv, summary.md, failures.txt and figures into ``out``.

    ``timing`` (``wall_seconds``, ``workers``, ``executor``, ``fitted``, ``found_done``, optionally
    ``not_started``) adds the wall-time line to ``summary.md``.
    """
    out = Path(out)
    results = collect(runs, root)
    for entry in out.iterdir():  # a link at an output name (e.g. planted in a received folder) is replaced,
        if entry.is_symlink() and entry.suffix in (".csv", ".md", ".txt", ".png"):  # never written through
            entry.unlink()
    files = []
    if failures:
        (out / "failures.txt").write_text("".join(f"{k}\t{v}\n" for k, v in sorted(failures.items())))
        files.append(out / "failures.txt")
    else:
        (out / "failures.txt").unlink(missing_ok=True)  # from an earlier, failed attempt
    if results.empty:
        return results, results, files
    summary = summarise(results, experiment.group)
    results.to_csv(out / "results.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    flagged = results.loc[results["failed_fit"].eq(True), "key"] if "failed_fit" in results else ()
    (out / "summary.md").write_text(summary_markdown(experiment, summary, failures, flagged)
                                    + timing_line(results, timing))
    files += [out / "results.csv", out / "summary.csv", out / "summary.md"]
    files += make_figures(experiment.name, summary, out)
    return results, summary, files


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def add_experiment_arguments(parser) -> None:
    listing = "; ".join(f"{n}: {e.description}" for n, e in EXPERIMENTS.items() if not e.hidden)
    parser.add_argument("name", help=f"the grid to run. {listing}")
    parser.add_argument("--fast", action="store_true", help="the reduced grid (fewer splits/seeds/epochs)")
    parser.add_argument("--out", help="output folder (default runs/experiments/NAME[-fast])")
    parser.add_argument("--executor", default="local", choices=EXECUTORS,
                        help="local worker processes (default) or Ray tasks")
    parser.add_argument("--workers", type=int, default=2,
                        help="local worker processes / local Ray CPUs (default 2; 0: run in this process)")
    parser.add_argument("--data-root", help="data folder: a folder of UCI-layout datasets (uci-benchmark, "
                        "structured-stochasticity: its energy/) or the Euler CSV folder (euler-stochasticity)")
    parser.add_argument("--ray-address", help="address of a running Ray cluster (default: a local Ray instance)")
    parser.add_argument("--only", metavar="REGEX", help="run only the runs whose key matches (and the runs they "
                        "need); the tables cover every finished run of the grid")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="start no run after this many seconds; the tables show what finished")
    parser.add_argument("--runs", metavar="DIR", help="folder of the run directories (default OUT/runs); grids "
                        "holding the same runs (uci-benchmark, bdl-baselines) share them through one DIR")
    parser.add_argument("--batch-fits", type=int, default=10, metavar="K",
                        help="fit up to K runs that differ only in split or seed (map, ensemble, svi) as one "
                             "vectorised program (default 10; 1: every run alone; local executor)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run_experiment_command(args) -> int:
    suffix = "-fast" if args.fast else ""
    out = Path(args.out or f"runs/experiments/{args.name}{suffix}")
    started = time.perf_counter()
    report = run_experiment(args.name, out, fast=args.fast, executor=args.executor, workers=args.workers,
                            data_root=args.data_root, ray_address=args.ray_address, progress=not args.quiet,
                            only=args.only, time_limit=args.time_limit, runs_dir=args.runs,
                            batch_fits=args.batch_fits)
    if (out / "summary.md").is_file():
        print((out / "summary.md").read_text())
    print(f"{len(report['results'])} finished runs in the tables; this invocation: {report['skipped']} found done, "
          f"{len(report['failures'])} failed, {report['not_started']} not started, "
          f"{time.perf_counter() - started:.0f} s")
    for path in report["files"]:
        print(f"  wrote {path}")
    return 1 if report["failures"] else 0

