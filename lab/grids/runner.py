"""Experiment runner: ``python -m zoo experiment NAME [--fast] [--out DIR] [--executor local|ray]``.

Runs a grid registered in :mod:`lab.grids.registry` (dataset × architecture × stochastic subset ×
backend × splits / seeds).  Every run goes through :func:`lab.runs.execution.execute` and is written whole
(:func:`lab.grids.worker.run_one`, extra metrics included) into ``DIR/runs/<key>/``.  A run folder that
:func:`lab.runs.store.verify_run` accepts (sealed, every file of its recorded size and digest) and
whose ``config.json`` holds the same spec is skipped, so an interrupted sweep resumes where it
stopped (and a changed grid, or a damaged run, re-runs what changed).  One experiment at a time
may use ``DIR`` (:class:`lab.runs.locks.RunLock` on ``DIR/.lock``; a second one exits with status 2
naming the holder, or with ``--wait [SECONDS]`` waits its turn and then skips what the first one finished).
On start it removes what killed writers left in ``DIR`` and its run folder (:func:`lab.runs.store.remove_stale_temporaries`).  Runs execute in local worker processes (``--workers N``, default 2, one torch
thread each; ``--workers 0`` runs them in this process), which die with the experiment even when it
is killed (``SIGKILL``), or, with ``--executor ray``, as Ray tasks on an existing cluster
(``--ray-address``) or a local Ray instance; the run directories must then be on a file system the
Ray workers share (:mod:`lab.grids.executors`).  A run that needs another (``GridRun.after``) is started
once that one has finished.  A run whose fit fails (including :class:`lab.runs.evaluation.RunFailed`)
is listed in ``failures.txt``.
``--only REGEX`` runs the runs whose key matches (and the runs they need) — the tables still cover
every finished run of the grid, so a partial re-run never shrinks them; ``--time-limit S`` starts
no run after S seconds, lets the started ones finish and writes the tables of what is done (the
wall-time line says how many runs were left); ``--runs DIR`` keeps the run folders in DIR
instead of ``OUT/runs``, so grids that hold the same runs (same key and spec: ``bdl-baselines``
and ``uci-benchmark``) fit them once.

Outputs: ``DIR/results.csv`` (one row per run: labels and metrics), ``DIR/summary.csv`` and
``DIR/summary.md`` (mean ± standard error over splits / seeds per configuration, n runs, the number
flagged ``failed_fit`` (:mod:`inference.evaluation.sanity`), published numbers where the grid has them),
``DIR/*.png`` figures, ``DIR/failures.txt`` if runs failed (:func:`lab.grids.tables.write_tables`).
"""
from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path
from typing import Optional

from inference.workers import EXECUTORS, check_executor
from lab.runs.store import RunLock, check_folder, remove_stale_temporaries

from .batches import group_runs
from .executors import run_local, run_ray
from .registry import EXPERIMENTS, get_experiment
from .tables import write_tables
from .worker import is_finished, outdated

__all__ = ["run_experiment", "add_experiment_arguments", "run_experiment_command"]


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
                   batch_fits: int = 10, wait: float = 0.0) -> dict:
    """Run grid ``name`` into ``out`` (skipping finished runs) and write its tables and figures.

    ``only``: a regular expression on run keys: only the matching runs and their prerequisites are
    fitted, and the tables hold every finished run of the grid;
    ``time_limit``: seconds after which no run is started; ``runs_dir``: the folder of run
    directories (default ``out/runs``); ``batch_fits``: at most this many runs that differ only in split or
    seed are fitted as one stacked program (:mod:`lab.grids.batches`; local executor; 1: every run alone);
    ``wait``: seconds to wait for another experiment holding ``out`` to finish (``math.inf``: as long as
    it takes; 0: refuse at once, naming the holder).
    Returns ``{"results": DataFrame, "summary": DataFrame,
    "failures": {key: error}, "skipped": n, "not_started": n, "files": [paths], "wall_seconds": s}``;
    ``summary.md`` ends with the wall time of this invocation and the summed run times of all
    runs in the table.
    """
    started = time.perf_counter()
    from zoo.progress import tqdm

    experiment = get_experiment(name)
    check_executor(executor)  # a known one, and Ray installed for "ray"
    if int(batch_fits) < 1:
        raise ValueError(f"--batch-fits must be at least 1 (1: every run fitted alone), got {batch_fits}")
    if int(workers) < 0:
        raise ValueError(f"--workers must be 0 (run in this process) or more, got {workers}")
    if data_root is not None and not Path(data_root).is_dir():
        raise ValueError(f"--data-root {data_root} is not a folder")
    if time_limit is not None and not float(time_limit) > 0:
        raise ValueError(f"--time-limit must be a positive number of seconds, got {time_limit}")
    if not float(wait) >= 0:
        raise ValueError(f"--wait must be a number of seconds >= 0, got {wait}")
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
    def waiting(holder: str) -> None:
        print(f"{out} is in use by {holder}; waiting for it to finish", file=sys.stderr, flush=True)

    with RunLock(out, wait=float(wait), on_wait=waiting):
        for folder in (out, root):  # what writers killed earlier left (their process is gone)
            remove_stale_temporaries(folder)
        finished = {r.key for r in runs if is_finished(root, r)}
        todo = [r for r in runs if r.key not in finished]
        bar = tqdm(total=len(runs), initial=len(finished), desc=name, unit="run", disable=not progress)
        with bar:
            if executor == "local":
                failures, left = run_local(group_runs(todo, int(batch_fits)), by_key, finished, root, int(workers),
                                            bar, deadline)
            else:
                failures, left = run_ray(todo, by_key, finished, root, int(workers), bar, ray_address, deadline)
        timing = {"wall_seconds": time.perf_counter() - started, "workers": int(workers), "executor": executor,
                  "fitted": len(todo) - len(left), "found_done": len(runs) - len(todo), "not_started": len(left)}
        results, summary, files = write_tables(experiment, grid, root, out, failures, timing)
        stale = outdated(root, [r for r in grid if r.key not in {r.key for r in runs}] + list(left))
    return {"results": results, "summary": summary, "failures": failures, "skipped": len(runs) - len(todo),
            "not_started": len(left), "files": files, "wall_seconds": timing["wall_seconds"], "outdated": stale}


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
    parser.add_argument("--wait", nargs="?", type=float, const=math.inf, default=0.0, metavar="SECONDS",
                        help="if another experiment is writing --out, wait for it to finish (up to SECONDS; "
                             "no value: as long as it takes) instead of exiting with status 2")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run_experiment_command(args) -> int:
    suffix = "-fast" if args.fast else ""
    out = Path(args.out or f"runs/experiments/{args.name}{suffix}")
    started = time.perf_counter()
    report = run_experiment(args.name, out, fast=args.fast, executor=args.executor, workers=args.workers,
                            data_root=args.data_root, ray_address=args.ray_address, progress=not args.quiet,
                            only=args.only, time_limit=args.time_limit, runs_dir=args.runs,
                            batch_fits=args.batch_fits, wait=args.wait)
    if (out / "summary.md").is_file():
        print((out / "summary.md").read_text())
    print(f"{len(report['results'])} finished runs in the tables; this invocation: {report['skipped']} found done, "
          f"{len(report['failures'])} failed, {report['not_started']} not started, "
          f"{time.perf_counter() - started:.0f} s")
    if report["outdated"]:
        stale = report["outdated"]
        print(f"{len(stale)} finished run(s) of the grid left out of the tables: fitted with other settings than the "
              f"grid's now ({', '.join(stale[:3])}{', ...' if len(stale) > 3 else ''}); refit them with --only")
    for path in report["files"]:
        print(f"  wrote {path}")
    return 1 if report["failures"] else 0

