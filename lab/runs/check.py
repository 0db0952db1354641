"""A run folder received from someone else, read without trusting it.

:func:`verify_run` re-checks a sealed run (:mod:`lab.runs.store` writes and seals it): its ``COMPLETE``
manifest is read with a size limit and its shape checked; every name it lists must be a plain
relative path inside the folder (no ``..``, no absolute path, no backslash or NUL), is opened
component by component without following any symbolic link (``O_NOFOLLOW`` relative to the
folder's descriptor, so a link swapped in meanwhile is not followed either), must be a regular
file (``O_NONBLOCK``: a FIFO never blocks), and its size is compared with the recorded one before
a byte is hashed, reading never more than that size (``../../dev/zero`` or a 1 TB sparse file
cannot make it read forever).  The folder may hold no link or special file anywhere, and a
listed sub-folder (``posterior/``) no file that ``COMPLETE`` does not list, since readers load
whatever is there.  Every failure is a one-line :class:`StoreError`.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

__all__ = ["COMPLETE", "StoreError", "MAX_LISTED", "MAX_MANIFEST_BYTES", "read_manifest", "verify_run"]

#: the completeness marker, written last: ``{"files": {relative path: {"size", "sha256"}}, ...}``
COMPLETE = "COMPLETE"
#: the most names a ``COMPLETE`` manifest may list, and its largest size in bytes
MAX_LISTED = 10_000
MAX_MANIFEST_BYTES = 16 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class StoreError(ValueError):
    """An output path that cannot be written, a run that is incomplete or damaged, or an output folder in use."""


def _digest(fd: int, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of the open file ``fd`` (never reads more)."""
    sha = hashlib.sha256()
    left = size
    while left > 0:
        block = os.read(fd, min(left, 1 << 20))
        if not block:
            break
        sha.update(block)
        left -= len(block)
    return sha.hexdigest()



def _parts(directory: Path, name) -> list:
    """The components of a name listed in ``COMPLETE``: a plain relative path inside the run, else StoreError."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise StoreError(f"{directory}/{COMPLETE} lists {name!r}, which is not a file name inside the run folder")
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise StoreError(f"{directory}/{COMPLETE} lists {name!r}, a path outside the run folder (absolute or "
                         f"with '..'); refusing to read it")
    return parts


def _open_inside(root_fd: int, directory: Path, parts: list) -> int:
    """A read-only descriptor of the regular file ``directory/parts``, no symbolic link followed at any level."""
    name = "/".join(parts)
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise StoreError(f"{directory}/{name}: {part} is a symbolic link or not a folder; a run "
                                     f"folder holds neither (refusing to follow it)") from None
                raise
            os.close(fd)
            fd = child
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=fd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise StoreError(f"{directory}/{name} is a symbolic link; a run folder holds regular files only "
                                 f"(refusing to follow it)") from None
            raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise StoreError(f"{directory}/{name} is not a regular file; a run folder holds regular files only")
    return leaf


def read_manifest(directory) -> dict:
    """The ``COMPLETE`` manifest of ``directory``, its shape checked (nothing else is verified)."""
    directory = Path(directory)
    try:
        fd = _open_inside_root(directory, [COMPLETE])
    except FileNotFoundError:
        raise StoreError(f"{directory} is not a complete run (no {COMPLETE} marker: unfinished or "
                         f"interrupted)") from None
    try:
        size = os.fstat(fd).st_size
        if size > MAX_MANIFEST_BYTES:
            raise StoreError(f"{directory}/{COMPLETE} has {size} bytes, more than any run writes "
                             f"({MAX_MANIFEST_BYTES}); the run folder is damaged or not a run")
        text = os.read(fd, MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    try:
        manifest = json.loads(text)
        files = manifest["files"]
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        raise StoreError(f"{directory}/{COMPLETE} is unreadable ({type(err).__name__})") from None
    if not isinstance(files, dict) or len(files) > MAX_LISTED:
        raise StoreError(f"{directory}/{COMPLETE} is unreadable (its 'files' is not a list of at most "
                         f"{MAX_LISTED} files)")
    for name, record in files.items():
        _parts(directory, name)
        if not (isinstance(record, dict) and type(record.get("size")) is int and record["size"] >= 0
                and isinstance(record.get("sha256"), str) and len(record["sha256"]) == 64):
            raise StoreError(f"{directory}/{COMPLETE} is unreadable (the record of {name!r} is not a size and a "
                             f"SHA-256 digest)")
    return manifest


def _open_inside_root(directory: Path, parts: list) -> int:
    try:
        root_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise StoreError(f"no run folder at {directory}") from None
    try:
        return _open_inside(root_fd, directory, parts)
    finally:
        os.close(root_fd)


def _check_tree(directory: Path, files: dict) -> None:
    """No link or special file anywhere in the run; no unlisted file in a listed sub-folder."""
    listed_folders = {name.rsplit("/", 1)[0] for name in files if "/" in name}
    seen = 0
    for folder, dirnames, filenames in os.walk(directory):
        relative = Path(folder).relative_to(directory).as_posix()
        for entry in [*dirnames, *filenames]:
            seen += 1
            if seen > 2 * MAX_LISTED:
                raise StoreError(f"{directory} holds more than {2 * MAX_LISTED} entries; not a run folder")
            path = Path(folder) / entry
            mode = os.lstat(path).st_mode
            name = entry if relative == "." else f"{relative}/{entry}"
            if stat.S_ISLNK(mode):
                raise StoreError(f"{path} is a symbolic link; a run folder holds regular files and folders only "
                                 f"(refusing to read the run)")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise StoreError(f"{path} is not a regular file; a run folder holds regular files and folders only")
            if stat.S_ISREG(mode) and relative in listed_folders and name not in files:
                raise StoreError(f"{path} is not listed in {COMPLETE}: it was added after the run was written")


def verify_run(directory, required=()) -> dict:
    """The ``COMPLETE`` manifest of a sealed run, after re-checking every file it lists.

    The folder is not trusted: raises :class:`StoreError` (one line) if the run is missing, unsealed
    (interrupted), its manifest malformed, a listed name is absolute or leaves the folder, a listed
    file is missing, a link or not a regular file, of another size (checked before reading it) or
    digest, a name in ``required`` is not listed, or the folder holds a link, a special file, or an
    unlisted file inside a listed sub-folder.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise StoreError(f"no run folder at {directory}")
    manifest = read_manifest(directory)
    files = manifest["files"]
    for name in required:
        if not any(f == name or f.startswith(f"{name}/") for f in files):
            raise StoreError(f"{directory} lacks {name}")
    _check_tree(directory, files)
    root_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        for name, record in files.items():
            path = directory / name
            try:
                fd = _open_inside(root_fd, directory, _parts(directory, name))
            except OSError as err:
                raise StoreError(f"{path} is missing or unreadable ({err.strerror or type(err).__name__})") from None
            try:
                size = os.fstat(fd).st_size
                if size != record["size"]:
                    raise StoreError(f"{path} has {size} bytes, {record['size']} were written: the run is damaged")
                if _digest(fd, size) != record["sha256"]:
                    raise StoreError(f"{path} differs from what was written (SHA-256): the run is damaged")
            except OSError as err:
                raise StoreError(f"{path} is unreadable ({err.strerror or type(err).__name__})") from None
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)
    return manifest


