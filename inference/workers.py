"""Local worker processes that die with their parent: one pool for ensemble members and experiment runs.

Workers are spawned (no inherited torch/Pyro state), run one torch thread, ignore Ctrl-C (it
reaches the whole process group; the parent stops them) and, on Linux, ask the kernel for
``SIGKILL`` when the parent dies (``prctl(PR_SET_PDEATHSIG)``), so a parent killed by ``SIGKILL``
leaves no worker behind.
"""
from __future__ import annotations

import concurrent.futures as cf
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys

import torch

__all__ = ["worker_pool", "stop_workers"]

_PR_SET_PDEATHSIG = 1


def _init_worker(parent: int) -> None:
    """Worker start: one torch thread; on Linux, die (``SIGKILL``) when the parent process dies."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the parent stops us
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)


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
