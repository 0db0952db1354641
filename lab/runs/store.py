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
* :func:`verify_run` re-checks a sealed run, which it does not trust (it may come from someone
  else): every name listed in ``COMPLETE`` is a plain relative path inside the folder (no ``..``,
  no absolute path), opened without following any symbolic link, a regular file of its recorded
  size (checked before hashing) and SHA-256 digest; the folder holds no link or special file, and a
  listed sub-folder (``posterior/``) no unlisted file;
* :class:`RunLock` (:mod:`lab.runs.locks`) is an exclusive ``fcntl.flock`` on ``OUT/.lock`` recording the holder's pid,
  host and command; the kernel releases it when the holder dies, even by ``SIGKILL``; a planted
  link or special file there is refused, never followed;
* :func:`write_text_file` replaces one file atomically (a new file made with ``O_EXCL``, renamed
  over the old name, so a link planted there is replaced, not written through);
* an ``OSError`` while writing (disk full, I/O error) becomes a one-line :class:`WriteError`.

Temporary siblings left by killed writers (their names say which host and process wrote them) are
removed by the next write into the same folder (:func:`remove_stale_temporaries`; an experiment also
sweeps its folders when it starts).  Concurrent writers of one destination never mix: the rename into
place is re-checked when another writer got there first.
A run's output path (``--out``) that is itself a symbolic link is refused: the run would be renamed
over the link rather than written where it points.  Its parent folders may be links.  See
``docs/reliability.md`` for the guarantees and the threat model.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from .locks import LOCK_NAME, RunLock
from .check import _CLOEXEC, _NOFOLLOW, COMPLETE, StoreError, _digest, read_manifest, verify_run

__all__ = ["COMPLETE", "LOCK_NAME", "StoreError", "WriteError", "check_destination", "check_folder",
           "staged_directory", "seal", "replace_run_file", "remove_stale_temporaries", "verify_run", "RunLock", "write_text_file",
           "write_bytes_file", "note_interrupt", "interrupted", "read_manifest"]

_PARTIAL = ".partial-"
_OLD = ".old-"
_TMP = ".tmp-"
#: a temporary name this module makes: ``.NAME.partial-HOST-PID-XXXX`` (and ``.old-``, ``.tmp-``)
_TEMPORARY = re.compile(r"^\..+\.(?:partial|old|tmp)-(?P<host>.+)-(?P<pid>[0-9]+)-[^-]*$", re.DOTALL)
_MOVE_ATTEMPTS = 3
_RENAME_EXCHANGE = 2
class WriteError(RuntimeError):
    """Writing a run or an output file failed (disk full, I/O error): nothing was written, and what
    was at the destination before is unchanged.  The message is one line."""


#: Ctrl-C received by this process (set by the CLI's handler; checked before a run is moved into place,
#: so an interrupt that Python swallowed, e.g. inside a finaliser, still stops the write)
_interrupts: list = []


def note_interrupt() -> None:
    """Record a Ctrl-C (called from the SIGINT handler)."""
    _interrupts.append(time.monotonic())


def interrupted(clear: bool = False) -> bool:
    """Whether a Ctrl-C was recorded; ``clear`` forgets it."""
    seen = bool(_interrupts)
    if clear:
        _interrupts.clear()
    return seen


def _check_interrupt() -> None:
    if _interrupts:
        raise KeyboardInterrupt


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
    if path.is_symlink():
        raise StoreError(f"--out {path} is a symbolic link ({_link_target(path)}); a run is renamed into place, which "
                         f"would replace the link itself: give a real folder or a new path")
    if path.exists():
        if not path.is_dir():
            raise StoreError(f"--out {path} is a file, not a run folder")
        if any(path.iterdir()):
            if not overwrite:
                raise StoreError(f"--out {path} already holds a run; pass --overwrite to replace it")
            if not _looks_like_run(path):
                raise StoreError(f"--out {path} is a non-empty folder that is not a run; refusing to replace it")
    _check_writable(path, path.parent)
    return path


def _link_target(path: Path) -> str:
    target = os.readlink(path)
    resolved = path.parent / target
    kind = ("which does not exist" if not resolved.exists() else "a file" if not resolved.is_dir() else
            "a run" if _looks_like_run(resolved) and any(resolved.iterdir()) else
            "an empty folder" if not any(resolved.iterdir()) else "a folder")
    return f"to {target}: {kind}"


def check_folder(path, option: str = "--out") -> Path:
    """Validate ``path`` as an output folder to create or add to (e.g. an experiment's); returns it.

    A symbolic link to a folder is followed (the folder is only added to, never renamed); one that
    dangles or points to a file is refused.
    """
    path = Path(path).absolute()
    if path.is_symlink():
        if not path.exists():
            raise StoreError(f"{option} {path} is a symbolic link to {os.readlink(path)}, which does not exist")
        path = path.resolve()
    if path.exists() and not path.is_dir():
        raise StoreError(f"{option} {path} is a file, not a folder")
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


def seal(directory) -> dict:
    """Write ``directory/COMPLETE`` listing every file (size, SHA-256), after syncing them to disk."""
    directory = Path(directory)
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != COMPLETE):
        _fsync(path)
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            files[path.relative_to(directory).as_posix()] = {"size": size, "sha256": _digest(fd, size)}
        finally:
            os.close(fd)
    manifest = {"format": 1, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files}
    temporary = directory / f"{COMPLETE}.tmp"
    with open(temporary, "x") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, directory / COMPLETE)
    for folder in {directory, *(p.parent for p in directory.rglob("*"))}:
        _fsync(folder)
    return manifest


# ---------------------------------------------------------------- writing
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


def _remove(path: Path, ignore_errors: bool = False) -> None:
    """Delete ``path``: a folder whole; a link or file (never what a link points to) by unlinking it."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path)
    except OSError:
        if not ignore_errors:
            raise


def _write_error(err: OSError, path: Path, replacing: bool) -> WriteError:
    where = f" ({Path(err.filename).name})" if getattr(err, "filename", None) else ""
    kept = "the run already there is unchanged" if replacing else "nothing was written"
    return WriteError(f"could not write the run {path}: {err.strerror or str(err).splitlines()[0] or type(err).__name__}"
                      f"{where}; {kept}")


@contextlib.contextmanager
def staged_directory(path, overwrite: bool = False):
    """Yield a temporary sibling of ``path`` to write a run into; seal it and move it to ``path``.

    ``path`` is checked with :func:`check_destination` first and again just before the move (a run
    that appeared meanwhile is not replaced without ``overwrite``).  On any exception, including
    ``KeyboardInterrupt``, the temporary folder is removed and ``path`` is untouched; an
    ``OSError`` (disk full, I/O error) is raised as a one-line :class:`WriteError`.  A Ctrl-C
    recorded by :func:`note_interrupt` stops the write before the run is moved into place.
    """
    path = check_destination(path, overwrite)
    replacing = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}{_PARTIAL}{_owner()}-", dir=path.parent))
    except OSError as err:
        raise _write_error(err, path, replacing) from None
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; a run folder gets the usual mode
        yield staging
        _check_interrupt()
        seal(staging)
        _check_interrupt()
        _move_into_place(staging, path, overwrite)
        _fsync(path.parent)
    except OSError as err:
        _remove(staging, ignore_errors=True)
        raise _write_error(err, path, replacing) from None
    except BaseException:
        _remove(staging, ignore_errors=True)
        raise


def _move_into_place(staging: Path, path: Path, overwrite: bool) -> None:
    """Rename the sealed ``staging`` folder to ``path``: onto nothing or an empty folder, or (``overwrite``)
    swapped with the run there.  Another writer may put a run at ``path`` between the check and the
    rename (``ENOTEMPTY``): the destination is then checked again, so without ``overwrite`` the loser
    gets "already holds a run" and with it the winner's run is replaced whole — never a mix."""
    for _ in range(_MOVE_ATTEMPTS):
        check_destination(path, overwrite)
        if path.exists() and any(path.iterdir()):
            if _exchange(staging, path):
                _remove(staging)  # now the old run
            else:
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}{_OLD}{_owner()}-", dir=path.parent))
                os.replace(path, old / "run")
                try:
                    os.replace(staging, path)
                except BaseException:
                    os.replace(old / "run", path)  # put the old run back
                    raise
                shutil.rmtree(old)
            return
        try:
            os.replace(staging, path)  # also onto an empty folder
            return
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    raise StoreError(f"--out {path} kept changing while this run was moved into place (other writers); "
                     f"nothing was written")


def _owner() -> str:
    """``HOST-PID``: names this process in its temporary files, so that a later writer can tell a dead one's."""
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_temporaries(folder) -> list:
    """Delete what killed writers left in ``folder``: run folders being written (``.NAME.partial-HOST-PID-*``),
    old runs being deleted (``.NAME.old-HOST-PID-*``) and files being replaced (``.NAME.tmp-HOST-PID-*``) whose
    process (on this host) is gone.  Returns the paths removed.  A live writer's files are left alone,
    as is anything whose name does not say who wrote it."""
    folder = Path(folder)
    removed = []
    host = socket.gethostname()
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match is None or match.group("host") != host or _alive(int(match.group("pid"))):
            continue
        _remove(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or a name that is not a pid): leave it
    return True


def replace_run_file(directory, name: str, text: str) -> Path:
    """Replace (or add) the top-level file ``name`` of the sealed run ``directory`` with ``text`` (UTF-8),
    keeping the run complete: the run is verified (:func:`verify_run`), copied aside with the new file,
    sealed anew and swapped in whole (:func:`staged_directory`), so a reader sees the old run or the new
    one, never a file that its ``COMPLETE`` does not vouch for.  Unlisted top-level files (a report
    written after the run) are carried over and listed.  The caller keeps other writers out (e.g. a
    :class:`RunLock` on the parent folder)."""
    directory = Path(directory).absolute()
    if not name or "/" in name or name in (COMPLETE, LOCK_NAME, ".", ".."):
        raise StoreError(f"cannot replace {name!r} in a run: give the name of a top-level file")
    manifest = verify_run(directory)
    listed = set(manifest["files"])
    extra = {p.name for p in directory.iterdir() if p.is_file() and not p.is_symlink()
             and p.name not in (COMPLETE, LOCK_NAME) and not p.name.startswith(".")}
    with staged_directory(directory, overwrite=True) as staging:
        for relative in sorted((listed | extra) - {name}):
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(directory / relative, target, follow_symlinks=False)
        (staging / name).write_text(text, encoding="utf-8")
    return directory


def write_text_file(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_bytes_file`)."""
    return write_bytes_file(path, text.encode("utf-8"))


def write_bytes_file(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: into a new file made with ``O_EXCL`` beside it (named after
    this process, so a killed writer's is recognised and removed later), then renamed over ``path`` — a
    link planted at ``path`` is replaced, never written through, and a failure or a kill leaves the old
    file.  ``OSError`` becomes :class:`WriteError`."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise StoreError(f"{path} is a folder; cannot write a file there")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}{_TMP}{_owner()}-", dir=path.parent)
    except OSError as err:
        raise WriteError(f"could not write {path}: {err.strerror or type(err).__name__}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(handle, 0o666 & ~umask)
        with os.fdopen(handle, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    except OSError as err:
        Path(temporary).unlink(missing_ok=True)
        raise WriteError(f"could not write {path}: {err.strerror or type(err).__name__}; it is unchanged") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
