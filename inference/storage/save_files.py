"""Reading a saved posterior's files as untrusted data (:func:`inference.storage.posterior_io.load_posterior`).

Every failure is a :class:`SaveFileError` (a ``ValueError``) naming the file and the problem:

* :func:`open_confined` — a file of the save folder: a regular file inside the folder (links are
  followed only within it, never to FIFOs or devices), at most a given size;
* :func:`read_json` — a JSON object, with the line and column of a syntax error;
* :func:`check_manifest` — the manifest's format version, entries and their JSON types;
* :func:`read_tensors` — ``posterior.pt`` read with ``torch.load(weights_only=True)`` only, after
  its zip directory is checked (a truncated file, another kind of file, or one that unpacks to
  more than the memory available is refused); torch's own advice to disable ``weights_only`` is
  never shown;
* :func:`check_tensor`, :func:`rebuild` — a saved tensor's type, shape and finiteness; an object
  rebuilt from saved values, its failure reported against the file.
"""
from __future__ import annotations

import json
import os
import pickle
import stat
import struct
import zipfile
from pathlib import Path
from typing import Optional

import torch

from zoo.resources import available_memory, format_bytes

__all__ = ["SaveFileError", "MissingSaveError", "MAX_JSON_BYTES", "open_confined", "read_json", "check_manifest",
           "check_entries", "read_tensors", "check_tensor", "rebuild"]

#: the manifest, tensor and record files of a save
MANIFEST, TENSORS, INFO = "posterior.json", "posterior.pt", "info.json"
FORMAT = "bnn-zoo-posterior/1"


class SaveFileError(ValueError):
    """A saved posterior that cannot be loaded; the message names the file and the problem."""


class MissingSaveError(SaveFileError, FileNotFoundError):
    """No saved posterior in the folder given to :func:`load_posterior`."""


#: largest JSON file of a save read (the manifest and the fit's record: loss histories are the bulk)
MAX_JSON_BYTES = 256 * 2**20


def open_confined(directory: Path, name: str, limit: Optional[int] = None):
    """``directory / name`` opened for reading: a regular file inside ``directory`` (links are
    followed only within it), at most ``limit`` bytes."""
    path = directory / name
    try:
        resolved, root = path.resolve(strict=True), directory.resolve(strict=True)
    except FileNotFoundError:
        raise MissingSaveError(f"{path} is missing: the save is incomplete") from None
    except (OSError, RuntimeError) as err:  # a symlink loop, no permission, ...
        raise SaveFileError(f"{path} cannot be opened: {err}") from None
    if not resolved.is_relative_to(root):
        raise SaveFileError(f"{path} is a link to {resolved}, outside the save folder; a save holds its own files only")
    try:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO never blocks
        fh = open(os.open(resolved, flags), "rb")
    except OSError as err:
        raise SaveFileError(f"{path} cannot be opened: {err.strerror or err}") from None
    info = os.fstat(fh.fileno())
    if not stat.S_ISREG(info.st_mode) or (limit is not None and info.st_size > limit):
        fh.close()
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else \
            f"{format_bytes(info.st_size)}, more than the {format_bytes(limit)} a save's file can be"
        raise SaveFileError(f"{path} is {what}")
    return fh


def read_json(directory: Path, name: str) -> dict:
    """The JSON object in ``directory / name`` (:func:`open_confined`, at most :data:`MAX_JSON_BYTES`)."""
    path = directory / name
    with open_confined(directory, name, MAX_JSON_BYTES) as fh:
        raw = fh.read()
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SaveFileError(f"{path} is not a JSON text file (byte {err.start} is not UTF-8)") from None
    except json.JSONDecodeError as err:
        raise SaveFileError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}): the "
                            f"file is truncated or damaged") from None
    except RecursionError:
        raise SaveFileError(f"{path} is JSON nested too deeply to be a save") from None
    if not isinstance(obj, dict):
        raise SaveFileError(f"{path} holds a JSON {type(obj).__name__}; a save's {name} is a JSON object")
    return obj


#: manifest entries and their JSON types
_MANIFEST = {"kind": str, "posterior": dict, "network": dict, "sites": list, "prior": dict, "likelihood": dict,
             "train_deterministic": bool, "output_dim": int, "active_at_prediction": list}
_SITE = {"name": str, "param_shape": list, "fan_in": int, "masked": bool}


def check_manifest(manifest: dict, path: Path, kinds) -> None:
    """Format version first, then every entry's presence and JSON type (sites included); ``kinds``: the
    known posterior kinds."""
    if "format" not in manifest:
        raise SaveFileError(f"{path} has no 'format' entry: it is not a posterior manifest (expected {FORMAT!r})")
    if manifest["format"] != FORMAT:
        raise SaveFileError(f"{path} has format {manifest['format']!r} (another version of this library); this "
                            f"library reads {FORMAT!r}")
    check_entries(manifest, _MANIFEST, path, "")
    if manifest["kind"] not in kinds:
        raise SaveFileError(f"{path}: unknown posterior kind {manifest['kind']!r}; known: {', '.join(kinds)}")
    if manifest["output_dim"] < 1:
        raise SaveFileError(f"{path}: 'output_dim' is {manifest['output_dim']}; expected a positive integer")
    for index, record in enumerate(manifest["sites"]):
        where = f"sites[{index}]"
        if not isinstance(record, dict):
            raise SaveFileError(f"{path}: {where} is a {type(record).__name__}; expected a JSON object")
        check_entries(record, _SITE, path, where + ".")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in record["param_shape"]):
            raise SaveFileError(f"{path}: {where}.param_shape is {record['param_shape']!r}; expected a list of sizes")
    if not all(isinstance(name, str) for name in manifest["active_at_prediction"]):
        raise SaveFileError(f"{path}: 'active_at_prediction' must list module names (strings)")


def check_entries(obj: dict, types: dict, path: Path, prefix: str) -> None:
    """Each key of ``types`` present in ``obj`` with that JSON type; ``prefix`` locates ``obj`` in the file."""
    for key, kind in types.items():
        if key not in obj:
            raise SaveFileError(f"{path} has no {prefix}{key!r} entry: the file is damaged or was edited")
        value = obj[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SaveFileError(f"{path}: {prefix}{key!r} is {value!r:.80} ({type(value).__name__}); expected a "
                                f"JSON {_JSON_NAMES[kind]}")


_JSON_NAMES = {str: "string", dict: "object", list: "list", bool: "true/false", int: "integer"}


def read_tensors(directory: Path) -> dict:
    """``posterior.pt`` read with ``weights_only=True`` and its layout checked (never pickled objects)."""
    path = directory / TENSORS
    limit = available_memory()
    with open_confined(directory, TENSORS, limit) as fh:
        try:
            unpacked = sum(entry.file_size for entry in zipfile.ZipFile(fh).infolist())
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, struct.error):
            # (a damaged directory entry can claim a zip version or compression zipfile does not implement)
            raise SaveFileError(f"{path} is not a torch.save archive (no readable zip directory): the file is "
                                f"truncated, damaged or another kind of file") from None
        if limit is not None and unpacked > limit:
            raise SaveFileError(f"{path} unpacks to {format_bytes(unpacked)}, more than the {format_bytes(limit)} of "
                                f"memory available")
        fh.seek(0)
        try:
            payload = torch.load(fh, weights_only=True, map_location="cpu")  # a GPU fit loads anywhere; .to() moves it
        except pickle.UnpicklingError:
            raise SaveFileError(f"{path} holds objects other than tensors, numbers, strings, lists and dicts; a "
                                f"posterior save never does, and such objects are never unpickled") from None
        except Exception as err:  # torch's zip reader and unpickler fail in many ways on a damaged file
            reason = (str(err).strip().splitlines() or [""])[0]
            reason = "" if "weights_only" in reason else f" ({type(err).__name__}: {reason:.200})"
            raise SaveFileError(f"{path} cannot be read{reason}: the file is damaged or truncated") from None
    if not isinstance(payload, dict):
        raise SaveFileError(f"{path} holds a {type(payload).__name__}; a save holds a dict of tensors")
    for key in ("net", "buffers", "sites", "posterior"):
        if not isinstance(payload.get(key), dict):
            raise SaveFileError(f"{path} has no {key!r} dict: the file is damaged or was not written by Posterior.save")
    for name, value in list(payload["net"].items()) + [(f"buffers[{k!r}]", payload["buffers"].get(k))
                                                       for k in ("target_loc", "target_scale")]:
        check_tensor(value, name, path)
    return payload


def check_tensor(value, name: str, path: Path, shape=None) -> None:
    """``value`` a tensor (of ``shape`` when given) whose floating entries are finite."""
    if not isinstance(value, torch.Tensor):
        raise SaveFileError(f"{path}: {name} is a {type(value).__name__}, not a tensor")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise SaveFileError(f"{path}: {name} has shape {tuple(value.shape)}; expected {tuple(shape)}")
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise SaveFileError(f"{path}: {name} holds NaN or infinite values")


def rebuild(path: Path, what: str, build):
    """``build()``, its failure on saved values a :class:`SaveFileError` naming ``path`` and ``what``."""
    try:
        return build()
    except SaveFileError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as err:
        reason = " ".join(str(err).split())
        raise SaveFileError(f"{path}: {what} cannot be rebuilt from the saved values ({type(err).__name__}: "
                            f"{reason:.300})") from None
