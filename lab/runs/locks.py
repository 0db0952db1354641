"""The lock of an output folder: :class:`RunLock`, an exclusive ``fcntl.flock`` on ``OUT/.lock``.

One experiment at a time writes an experiment folder.  A second one either waits its turn
(``wait``) or is refused with a :class:`~lab.runs.check.StoreError` naming the holder (pid, host,
command, start time) and what to do.  The kernel releases the lock when its holder exits or is
killed (even by ``SIGKILL``), so a stale lock file never blocks; a planted link or special file
at ``OUT/.lock`` is refused, never followed or written through.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

from .check import _CLOEXEC, _NOFOLLOW, _NONBLOCK, StoreError

__all__ = ["RunLock", "LOCK_NAME"]

#: the lock file of an experiment's output folder
LOCK_NAME = ".lock"
#: seconds between two tries of a lock that another process holds (``RunLock(wait=...)``)
_LOCK_POLL_SECONDS = 0.2


class RunLock:
    """Exclusive lock of an output folder (``OUT/.lock``, ``fcntl.flock``) for one process.

    ``with RunLock(out):`` raises :class:`StoreError` naming the holder (pid, host, command, start
    time) if another process holds it; ``RunLock(out, wait=seconds)`` first waits up to that long
    (``math.inf``: until it is free) for its turn, calling ``on_wait(holder)`` once with the holder's
    description.  The kernel drops the lock when its holder exits or is
    killed, so a stale lock file never blocks.  The lock file is opened without following links
    (``O_NOFOLLOW``) and must be a regular file: a planted link or FIFO is refused, never written through.
    """

    def __init__(self, directory, wait: float = 0.0, on_wait=None):
        self.path = Path(directory) / LOCK_NAME
        self.wait = float(wait)
        self.on_wait = on_wait
        self._fd = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise StoreError(f"{self.path} is a symbolic link; remove it (a lock file is never followed)") from None
            raise StoreError(f"cannot create the lock file {self.path} ({err.strerror})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StoreError(f"{self.path} is not a regular file; remove it")
        deadline, told = time.monotonic() + self.wait, False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = _describe(_read_holder(fd))
                if time.monotonic() >= deadline:
                    waited = f" (waited {self.wait:.0f} s)" if self.wait else ""
                    raise StoreError(f"{self.path.parent} is in use by {holder}{waited}; wait for it to finish "
                                     f"(--wait), or choose another --out")
                if not told and self.on_wait is not None:
                    self.on_wait(holder)
                    told = True
                time.sleep(_LOCK_POLL_SECONDS)
        except BaseException:  # refused, or Ctrl-C while waiting
            os.close(fd)
            raise
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> str:
    """The holder's record; read again briefly while it is empty (a holder that has just taken the lock
    writes its record right after)."""
    for _ in range(20):
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        if text:
            return text
        time.sleep(0.005)
    return text


def _describe(holder: str) -> str:
    try:
        record = json.loads(holder)
        return f"pid {record['pid']} on {record['host']} (since {record['started']}: {record['command']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
