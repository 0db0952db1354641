"""Run directories that are never half-written, mixed or silently replaced.

A run is written into a temporary sibling of its destination (``.NAME.partial-HOST-PID-XXXX``),
sealed by a completeness marker :data:`COMPLETE` written last, and renamed into place:

* :func:`check_destination` validates a run's output path before any work (a file, an unwritable
  parent, an existing run without ``overwrite`` → :class:`StoreError`, a ``ValueError``), and
  :func:`check_folder` an output folder that is added to (an experiment's);
* :func:`staged_directory` yields the temporary folder, seals it and moves it into place; on an
  error, Ctrl-C or ``SystemExit`` it removes it.  A replaced run is swapped for the new one in
  one step (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames, between which there is
  no run at the destination) and then deleted whole, so a ``SIGKILL`` at any moment leaves the
  old run or the new one, or (only without the atomic swap) none — never a mix;
* :func:`verify_run` re-checks a sealed run: every file listed in ``COMPLETE`` present, of its
  recorded size and SHA-256 digest (so truncated or deleted files are caught);
* :class:`RunLock` is an exclusive ``fcntl.flock`` on ``OUT/.lock`` recording the holder's pid,
  host and command; the kernel releases it when the holder dies, even by ``SIGKILL``.

Temporary siblings left by killed writers are removed by the next write to the same destination.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["COMPLETE", "LOCK_NAME", "StoreError", "check_destination", "check_folder", "staged_directory", "seal",
           "verify_run", "RunLock"]

#: the completeness marker, written last: ``{"files": {relative path: {"size", "sha256"}}, ...}``
COMPLETE = "COMPLETE"
#: the lock file of an experiment's output folder
LOCK_NAME = ".lock"
_PARTIAL = ".partial-"
_RENAME_EXCHANGE = 2


class StoreError(ValueError):
    """An output path that cannot be written, a run that is incomplete, or an output folder in use."""


def _looks_like_run(path: Path) -> bool:
    """An empty folder or one holding a run's files (what ``overwrite`` may replace)."""
    names = {p.name for p in path.iterdir()}
    return not names or bool(names & {COMPLETE, "metrics.json", "config.json", "posterior", "posterior.nc"})


def check_destination(path, overwrite: bool = False) -> Path:
    """Validate ``path`` as the destination of a new run; returns it (absolute).

    Raises :class:`StoreError` if ``path`` is a file, holds a run (or anything) and ``overwrite``
    is false, holds something other than a run (never replaced, even with ``overwrite``), or if
    its nearest existing parent folder is not writable.
    """
    path = Path(path).absolute()
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise StoreError(f"--out {path} is a file, not a run folder")
        if any(path.iterdir()):
            if not overwrite:
                raise StoreError(f"--out {path} already holds a run; pass --overwrite to replace it")
            if not _looks_like_run(path):
                raise StoreError(f"--out {path} is a non-empty folder that is not a run; refusing to replace it")
    _check_writable(path, path.parent)
    return path


def check_folder(path) -> Path:
    """Validate ``path`` as an output folder to create or add to (e.g. an experiment's); returns it."""
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise StoreError(f"--out {path} is a file, not a folder")
    _check_writable(path, path)
    return path


def _check_writable(path: Path, folder: Path) -> None:
    """:class:`StoreError` unless a file can be created in ``folder`` or its nearest existing parent."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise StoreError(f"--out {path}: {folder} is a file, not a folder")
    try:  # a real probe: os.access says yes to root everywhere, even on read-only file systems
        handle, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise StoreError(f"--out {path}: cannot write in {folder} ({err.strerror or type(err).__name__})") from None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def seal(directory) -> dict:
    """Write ``directory/COMPLETE`` listing every file (size, SHA-256), after syncing them to disk."""
    directory = Path(directory)
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != COMPLETE):
        _fsync(path)
        files[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size, "sha256": _digest(path)}
    manifest = {"format": 1, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files}
    temporary = directory / f"{COMPLETE}.tmp"
    with open(temporary, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, directory / COMPLETE)
    for folder in {directory, *(p.parent for p in directory.rglob("*"))}:
        _fsync(folder)
    return manifest


def verify_run(directory, required=()) -> dict:
    """The ``COMPLETE`` manifest of a sealed run, after re-checking every file it lists.

    Raises :class:`StoreError` (one line) if the run is missing, unsealed (interrupted), a listed
    file is missing, of another size or digest, or a name in ``required`` is not listed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise StoreError(f"no run folder at {directory}")
    try:
        manifest = json.loads((directory / COMPLETE).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        raise StoreError(f"{directory} is not a complete run (no {COMPLETE} marker: unfinished or "
                         f"interrupted)") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise StoreError(f"{directory}/{COMPLETE} is unreadable ({type(err).__name__})") from None
    for name in required:
        if not any(f == name or f.startswith(f"{name}/") for f in files):
            raise StoreError(f"{directory} lacks {name}")
    for name, record in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
            if size != record["size"]:
                raise StoreError(f"{path} has {size} bytes, {record['size']} were written: the run is damaged")
            if _digest(path) != record["sha256"]:
                raise StoreError(f"{path} differs from what was written (SHA-256): the run is damaged")
        except OSError as err:
            raise StoreError(f"{path} is missing or unreadable ({err.strerror or type(err).__name__})") from None
    return manifest


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
        return False  # file system without RENAME_EXCHANGE
    raise OSError(code, os.strerror(code), str(b))


def _remove_stale_partials(path: Path) -> None:
    """Delete temporary siblings of ``path`` whose writer (a process on this host) has died."""
    prefix = f".{path.name}{_PARTIAL}{socket.gethostname()}-"
    for sibling in path.parent.glob(f".{path.name}{_PARTIAL}*"):
        if not sibling.name.startswith(prefix):
            continue
        try:
            pid = int(sibling.name[len(prefix):].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(sibling, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


@contextlib.contextmanager
def staged_directory(path, overwrite: bool = False):
    """Yield a temporary sibling of ``path`` to write a run into; seal it and move it to ``path``.

    ``path`` is checked with :func:`check_destination` first and again just before the move (a run
    that appeared meanwhile is not replaced without ``overwrite``).  On any exception, including
    ``KeyboardInterrupt``, the temporary folder is removed and ``path`` is untouched.
    """
    path = check_destination(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}{_PARTIAL}{socket.gethostname()}-{os.getpid()}-",
                                    dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; a run folder gets the usual mode
    try:
        yield staging
        seal(staging)
        check_destination(path, overwrite)
        if path.exists() and any(path.iterdir()):
            if _exchange(staging, path):
                shutil.rmtree(staging)  # now the old run
            else:
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
                os.replace(path, old / "run")
                try:
                    os.replace(staging, path)
                except BaseException:
                    os.replace(old / "run", path)  # put the old run back
                    raise
                shutil.rmtree(old)
        else:
            os.replace(staging, path)  # also onto an empty folder
        _fsync(path.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class RunLock:
    """Exclusive lock of an output folder (``OUT/.lock``, ``fcntl.flock``) for one process.

    ``with RunLock(out):`` raises :class:`StoreError` naming the holder (pid, host, command, start
    time) if another process holds it.  The kernel drops the lock when its holder exits or is
    killed, so a stale lock file never blocks.
    """

    def __init__(self, directory):
        self.path = Path(directory) / LOCK_NAME
        self._fd = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace")
            os.close(fd)
            raise StoreError(f"{self.path.parent} is in use by {_describe(holder)}; wait for it to finish or "
                             f"choose another --out") from None
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


def _describe(holder: str) -> str:
    try:
        record = json.loads(holder)
        return f"pid {record['pid']} on {record['host']} (since {record['started']}: {record['command']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
