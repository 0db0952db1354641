"""Writing a file in a forked child process, so that a crash of the writer cannot take this process down.

h5py/libhdf5 does not fail safely on a full disk: writing ``posterior.nc`` there ended in
``SIGSEGV`` after pages of "Exception ignored" tracebacks from finalisers.  :func:`write_in_child`
runs the write in a ``fork`` of this process with its stderr sent to a temporary file; the parent
waits and turns whatever happened — an exception, a crash by a signal — into one ``OSError``
(with the errno libhdf5 printed, else ``ENOSPC`` when the file system is full), which
:func:`lab.runs.store.staged_directory` reports as a one-line :class:`lab.runs.store.WriteError`.  Ctrl-C kills the child and is raised in the parent.
Where ``fork`` does not exist the write runs in this process.
"""
from __future__ import annotations

import errno
import faulthandler
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable

from inference.workers import die_with_parent

__all__ = ["write_in_child"]

#: free bytes below which a crashed writer is taken to have met a full disk
_FULL_BELOW = 1 << 20
_INTERRUPTED = 130
#: bytes of the child's stderr searched for libhdf5's errno report
_LOG_BYTES = 1 << 20


def write_in_child(write: Callable, path, *args) -> None:
    """``write(*args, path)`` in a forked child; ``OSError`` (or ``KeyboardInterrupt``) here if it failed."""
    path = Path(path)
    if not hasattr(os, "fork"):
        write(*args, path)
        return
    read_end, write_end = os.pipe()
    log = tempfile.TemporaryFile()  # the child's stderr: h5py prints pages of tracebacks on a failed write
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: write, report one line on failure, never return into the caller
        code = 1
        try:
            die_with_parent(parent)  # a writer killed by SIGKILL takes its NetCDF writer with it
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(read_end)
            os.dup2(log.fileno(), 2)
            sys.stderr = open(2, "w", closefd=False)  # also where sys.stderr was replaced (e.g. under pytest)
            faulthandler.disable()  # (it writes to a stderr descriptor of its own)
            write(*args, path)
            code = 0
        except KeyboardInterrupt:
            code = _INTERRUPTED
        except BaseException as err:  # noqa: BLE001 - everything goes back to the parent as one line
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            os.write(write_end, f"{getattr(err, 'errno', None) or 0}\t{text}".encode(errors="replace")[:4000])
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        try:
            _, status = os.waitpid(pid, 0)
        except BaseException:  # Ctrl-C or SIGTERM while waiting: the child goes too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        message = os.read(read_end, 4096).decode(errors="replace")
        log.seek(0)
        printed = log.read(_LOG_BYTES).decode(errors="replace")
    finally:
        os.close(read_end)
        log.close()
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return
    if (os.WIFEXITED(status) and os.WEXITSTATUS(status) == _INTERRUPTED) or (
            os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT):  # the terminal's Ctrl-C reached it
        raise KeyboardInterrupt
    code, _, text = message.partition("\t")
    if os.WIFSIGNALED(status):
        text = f"the writer crashed (signal {os.WTERMSIG(status)})"
        code = "0"
    reported = re.search(r"errno = (\d+)", f"{text}\n{printed}")  # libhdf5's own report of the failed write(2)
    number = int(reported.group(1)) if reported else int(code) if code.isdigit() else 0
    if not number and _free_bytes(path.parent) < _FULL_BELOW:
        number = errno.ENOSPC
    if number:
        raise OSError(number, os.strerror(number), str(path))
    raise OSError(errno.EIO, text or "write failed", str(path))


def _free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return _FULL_BELOW  # unknown: do not claim the disk is full
