"""Parallel workers: local processes that die with their parent (one pool for ensemble members and
experiment runs), and Ray tasks.

Local workers are spawned (no inherited torch/Pyro state), run one torch thread, ignore Ctrl-C (it
reaches the whole process group; the parent stops them) and, on Linux, ask the kernel for
``SIGKILL`` when the parent dies (``prctl(PR_SET_PDEATHSIG)``), so a parent killed by ``SIGKILL``
leaves no worker behind.

:func:`run_calls` runs independent calls ``fn(*args)`` in such a pool or as Ray tasks (one CPU and
one torch thread each) on the Ray instance this process is connected to — ``ray.init(address=...)``
before the call for a cluster — or, when there is none, on a local Ray instance with ``workers``
CPUs that is shut down afterwards.

This module is the one place that starts worker processes and Ray: :func:`ray_session` (used by
:func:`run_calls` and by the experiment grids' scheduler, :mod:`lab.grids.executors`) connects to or
starts Ray and shuts down what it started; :func:`worker_pool` spawns the local workers.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import ctypes.util
import importlib.util
import multiprocessing
import os
from multiprocessing import resource_tracker
import signal
import sys
import threading
from typing import Callable, Iterator, Optional

import torch

__all__ = ["die_with_parent", "worker_pool", "stop_workers", "run_calls", "check_executor", "ctrl_c_held", "ray_session",
           "EXECUTORS"]

#: where :func:`run_calls` runs: local worker processes or Ray tasks
EXECUTORS = ("local", "ray")

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """In a child process: on Linux, ask the kernel for ``SIGKILL`` when the parent dies
    (``prctl(PR_SET_PDEATHSIG)``); exit at once if ``parent`` has already died."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)


def _init_worker(parent: int) -> None:
    """Worker start: one torch thread; on Linux, die (``SIGKILL``) when the parent process dies."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the parent stops us
    die_with_parent(parent)


@contextlib.contextmanager
def ctrl_c_held():
    """Hold Ctrl-C (``SIGINT`` blocked in this thread) while worker processes are spawned: they inherit
    the blocked signal, so a Ctrl-C during their start-up (seconds of imports) reaches this process
    only — one line, no worker tracebacks — and is raised here as soon as the spawn is done."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    # multiprocessing's resource tracker, started on a pool's first semaphore, *unblocks* SIGINT after
    # spawning itself (CPython 3.11): start it before blocking, so that nothing lifts the block meanwhile
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes that die with this one."""
    return cf.ProcessPoolExecutor(int(workers), mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_init_worker, initargs=(os.getpid(),))


def stop_workers(pool) -> None:
    """Cancel queued calls and kill the pool's worker processes now (on an error, Ctrl-C or SIGTERM)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5)


def check_executor(executor: str, option: str = "executor") -> None:
    """Raise ``ValueError`` for an unknown executor, or ``"ray"`` without Ray installed."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown {option} {executor!r}; valid: {', '.join(EXECUTORS)}")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError(f"{option}='ray' needs Ray: pip install 'bnn-zoo[ray]' (or pip install ray), or use "
                         f"{option}='local'")


@contextlib.contextmanager
def ray_session(cpus: int, address: Optional[str] = None) -> Iterator:
    """The ``ray`` module, connected: to the Ray instance this process is already connected to, else to the
    cluster at ``address``, else to a local Ray instance with ``cpus`` CPUs (no dashboard); what is started
    here is shut down on exit.  ``ValueError`` without Ray installed (:func:`check_executor`)."""
    check_executor("ray")
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        local = {} if address else {"num_cpus": max(int(cpus), 1), "include_dashboard": False}
        ray.init(address=address, log_to_driver=False, configure_logging=False, **local)
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def _ray_call(fn: Callable, args: tuple):
    """A Ray task: ``fn(*args)`` with one torch thread."""
    torch.set_num_threads(1)
    return fn(*args)


def run_calls(fn: Callable, calls: list[tuple], workers: int, executor: str = "local") -> list:
    """``[fn(*args) for args in calls]``, run in parallel, results in call order.

    Args:
        fn: a picklable (module-level) function.
        calls: its argument tuples.
        workers: local processes (``"local"``), or the CPUs of a local Ray instance started here.
        executor: ``"local"`` (:func:`worker_pool`) or ``"ray"`` (module docstring).
    On an error or Ctrl-C the other calls are stopped (local workers killed, Ray tasks cancelled).
    """
    check_executor(executor)
    if executor == "local":
        pool = None
        try:
            with ctrl_c_held():  # the pool spawns its processes on submit; a Ctrl-C meanwhile lands after it
                pool = worker_pool(min(int(workers), len(calls)))
                futures = [pool.submit(fn, *args) for args in calls]
            results = [f.result() for f in futures]
        except BaseException:
            if pool is not None:
                stop_workers(pool)
            raise
        pool.shutdown()
        return results
    with ray_session(workers) as ray:
        handles = []
        try:
            task = ray.remote(num_cpus=1)(_ray_call)
            handles = [task.remote(fn, args) for args in calls]
            return ray.get(handles)
        except BaseException:
            for handle in handles:
                ray.cancel(handle, force=True)
            raise
