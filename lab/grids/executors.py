"""Where grid runs execute: local worker processes or Ray tasks, scheduled by their prerequisites.

:func:`run_local` (a process pool; ``workers=0``: this process) and :func:`run_ray` (Ray tasks on
an existing cluster or a local Ray instance; a run whose worker process dies is run again,
:data:`RAY_RETRIES` times at most) both start every run once the run it needs
(``GridRun.after``) has finished, through :func:`lab.grids.worker.run_one` (or
:func:`lab.grids.batches.run_batch` for a stacked batch).  Each returns ``({key: error} of failed
runs, [runs never started])``.  The worker pool and the Ray start-up are :mod:`inference.workers`'
(:func:`~inference.workers.worker_pool`, :func:`~inference.workers.ray_session`): one place for both.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import Optional

from inference.workers import ctrl_c_held, ray_session, stop_workers, worker_pool

from .batches import RunBatch, run_batch
from .worker import run_one

__all__ = ["run_local", "run_ray"]

#: times Ray runs a grid run again whose worker process died (killed, out of memory, node lost); an error
#: raised by the run itself is not retried (it is a failed run).  The rerun replaces whatever the dead
#: attempt left (:func:`lab.runs.store.staged_directory` removes a dead writer's temporary folder).
RAY_RETRIES = 3


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


def run_local(runs, by_key, finished, root, workers, bar, deadline=None):
    pool = _Inline() if workers == 0 else _Workers(workers)
    threads = None if workers == 0 else 1

    def submit(run, prerequisite):
        if isinstance(run, RunBatch):  # fitted as one stacked program (lab.grids.batches)
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


def run_ray(runs, by_key, finished, root, workers, bar, address, deadline=None):
    with ray_session(workers, address) as ray:  # the cluster at address, or a local instance of `workers` CPUs
        remote = ray.remote(num_cpus=1, max_retries=RAY_RETRIES)(run_one)  # a run whose worker died is run again

        def wait_one(handles):
            ready, _ = ray.wait(handles, num_returns=1)
            try:
                ray.get(ready[0])
                return ready[0], None
            except Exception as err:  # noqa: BLE001 - a failed task is a failed run
                return ready[0], _error_text(getattr(err, "cause", None) or err)

        return _schedule(runs, by_key, finished, lambda r, p: remote.remote(r, str(root), p, 1), wait_one, bar,
                         deadline, None if deadline is None else max(int(workers), 1))
