"""Input validation shared by every loader: :class:`DataError`, the array checks and the file-table checks.

Every bad-input path of :mod:`zoo.data` raises :class:`DataError` (a ``ValueError``) saying what
was wrong and what to do. :func:`check_finite_array` / :func:`check_xy` check arrays in memory
and name rows by 0-based index; the checks of tables read from files (:func:`check_file`,
:func:`check_table`, :func:`check_targets_vary`) run before any split or standardisation and
name the 1-based line of the file (:class:`FileLines`).
"""

from __future__ import annotations

import csv
import re
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "DataError",
    "FileLines",
    "check_file",
    "check_finite_array",
    "check_table",
    "check_targets_vary",
    "check_xy",
    "listing",
]

_MAX_LISTED = 10


class DataError(ValueError):
    """Bad input data or arguments; the message says what was wrong and what to do.

    The message is one line by construction: a line break or other control character in it (from a
    file's path, a column name or a cell) is shown escaped (``\\n``)."""

    def __init__(self, message="", *args):
        super().__init__(_CONTROL_CHARACTERS.sub(lambda m: repr(m.group())[1:-1], str(message)), *args)


#: characters a one-line message shows escaped (control characters other than tab)
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def listing(items) -> str:
    """``[a, b, ...]`` of the first ten items of a sequence, noting how many there are in all."""
    items = [str(i) for i in items]
    shown = ", ".join(items[:_MAX_LISTED])
    if len(items) > _MAX_LISTED:
        shown += f", ... ({len(items)} in total)"
    return f"[{shown}]"


def _nonfinite_mask(arr, name: str) -> tuple[tuple[int, ...], np.ndarray | None]:
    """Shape of ``arr`` and a boolean NaN/inf mask (``None`` when ``arr`` is all finite)."""
    if isinstance(arr, torch.Tensor):
        if arr.is_complex():
            raise DataError(f"{name} must be real-valued, got dtype {arr.dtype}.")
        if not arr.is_floating_point():
            return tuple(arr.shape), None
        bad = ~torch.isfinite(arr.detach())
        return tuple(arr.shape), bad.cpu().numpy() if bad.any() else None
    values = np.asarray(arr)
    if values.dtype.kind not in "biuf":
        raise DataError(f"{name} must be numeric, got dtype {values.dtype}; convert it to numbers first.")
    if values.dtype.kind != "f":
        return values.shape, None
    bad = ~np.isfinite(values)
    return values.shape, bad if bad.any() else None


def check_finite_array(arr, name: str, column_names=None) -> None:
    """Check that ``arr`` (tensor or array-like) is real-valued, has >= 1 row and no NaN/inf.

    Rows are indexed along the first axis and columns along the last axis (for a sequence
    tensor ``[N, T, F]`` a column is a feature ``F``). The error names the first offending
    row indices (0-based) and columns (by ``column_names`` when given, else by index).
    """
    shape, bad = _nonfinite_mask(arr, name)
    if len(shape) == 0 or shape[0] == 0:
        raise DataError(f"{name} has no rows (shape {shape}); at least one row is needed.")
    if bad is None:
        return
    rows = np.flatnonzero(bad.reshape(shape[0], -1).any(axis=1))
    message = f"{name} has {int(bad.sum())} NaN/inf value(s) in rows {listing(rows)} (0-based)"
    if len(shape) > 1:
        cols = np.flatnonzero(bad.reshape(-1, shape[-1]).any(axis=0))
        if column_names is not None:
            cols = [column_names[c] for c in cols]
        message += f" and columns {listing(cols)}"
    raise DataError(message + "; drop or impute those entries before loading.")


def check_xy(x, y, name: str = "data") -> None:
    """Check a pair of inputs ``x`` ``[N, D]`` or ``[N, T, F]`` and targets ``y`` ``[N]`` or ``[N, O]``.

    Both must be finite (:func:`check_finite_array`) and have the same number of rows.
    """
    check_finite_array(x, f"{name} inputs x")
    check_finite_array(y, f"{name} targets y")
    x_shape, y_shape = tuple(np.shape(x)), tuple(np.shape(y))
    if len(x_shape) not in (2, 3):
        raise DataError(
            f"{name} inputs x must be 2-D [N, D] or 3-D [N, T, F], got shape {x_shape}; "
            "reshape a single feature to [N, 1]."
        )
    if len(y_shape) not in (1, 2):
        raise DataError(f"{name} targets y must be 1-D [N] or 2-D [N, O], got shape {y_shape}.")
    if x_shape[0] != y_shape[0]:
        raise DataError(
            f"{name} has {x_shape[0]} input rows but {y_shape[0]} target rows; they must match."
        )


# ---------------------------------------------------------------------------------- tables read from files


def check_file(path, what: str, content: str) -> Path:
    """``path`` as a :class:`~pathlib.Path` once it is an existing, non-empty regular file.

    ``what`` names the file in messages (``"CSV file"``); ``content`` says what it should hold.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{what} {path} is a directory, not a file; give the path of the file itself.")
    if not path.is_file():
        raise DataError(f"{what} {path} does not exist; check the path (it should hold {content}).")
    if path.stat().st_size == 0:
        raise DataError(f"{what} {path} is empty; it should hold {content}.")
    return path


class FileLines:
    """The 1-based file line of each data row of a table read from ``path``, found when an error needs it.

    ``kind="csv"``: rows as ``pandas.read_csv`` reads them (the header is line 1, blank lines
    are skipped, a quoted field may span lines: a row's line is the one it starts on).
    ``kind="text"``: rows as ``numpy.loadtxt`` reads them (no header; blank lines and ``#``
    comments are skipped). Should the scan not find ``n_rows`` rows, rows are numbered from the
    first data row instead, and :attr:`note` says so.
    """

    def __init__(self, path: Path, kind: str, n_rows: int) -> None:
        self.path, self.kind, self.n_rows = Path(path), kind, n_rows

    def _scan(self) -> list[int]:
        with open(self.path, newline="", encoding="utf-8-sig", errors="replace") as handle:
            if self.kind == "text":
                return [number for number, line in enumerate(handle, 1) if line.split("#")[0].strip()]
            reader, lines, start = csv.reader(handle), [], 1
            try:
                for record in reader:
                    if len(record) > 1 or (record and record[0].strip()):
                        lines.append(start)
                    start = reader.line_num + 1
            except csv.Error:  # e.g. a field beyond the csv module's size limit: count rows instead
                return []
            return lines[1:]  # without the header

    @cached_property
    def _lines(self) -> np.ndarray | None:
        lines = self._scan()
        return np.asarray(lines) if len(lines) == self.n_rows else None

    def __call__(self, rows) -> list[int]:
        """File lines (1-based) of the data rows ``rows`` (0-based positions in the table)."""
        rows = np.asarray(rows, dtype=int)
        return (rows + 1 if self._lines is None else self._lines[rows]).tolist()

    @property
    def note(self) -> str:
        """How the lines are counted, for messages."""
        if self._lines is None:
            return "rows are counted 1-based from the first data row"
        return "lines are 1-based, the header is line 1" if self.kind == "csv" else "lines are 1-based, no header"


def _cells(values: np.ndarray, mask: np.ndarray, column_names, lines: FileLines) -> str:
    rows, cols = np.nonzero(mask)
    numbers = lines(rows[:_MAX_LISTED])
    shown = [f"line {n} column {column_names[c]!r} ({values[r, c]:g})" for n, r, c in zip(numbers, rows, cols)]
    if len(rows) > _MAX_LISTED:
        shown.append(f"... ({len(rows)} in total)")
    return ", ".join(shown)


def check_table(values: np.ndarray, source: str, column_names, lines: FileLines) -> None:
    """Check a float64 table ``[N, C]`` read from a file: no NaN/inf and every value finite in float32.

    The models compute in float32, so a value finite in float64 but beyond float32's range
    (about ±3.4e38, e.g. ``1e300``) is an error too. Both errors name the cells by file line
    (``lines``) and column name (``column_names``, C of them); ``source`` names the file.
    """
    if values.shape[0] == 0:
        raise DataError(f"{source} has no data rows; it needs at least one.")
    nonfinite = ~np.isfinite(values)
    if nonfinite.any():
        raise DataError(
            f"{source} has {int(nonfinite.sum())} missing or NaN/inf value(s): "
            f"{_cells(values, nonfinite, column_names, lines)} ({lines.note}); fill in or drop those entries "
            "before loading."
        )
    with np.errstate(over="ignore"):
        overflow = np.isinf(values.astype(np.float32))
    if overflow.any():
        raise DataError(
            f"{source} has {int(overflow.sum())} value(s) beyond the float32 range (±{np.finfo(np.float32).max:.3g}) "
            f"that the models compute in: {_cells(values, overflow, column_names, lines)} ({lines.note}); "
            "rescale those columns (e.g. change their units) before loading."
        )


def check_targets_vary(y: np.ndarray, source: str, target_names, rows: str) -> None:
    """Check that no regression target column ``y[:, o]`` (``y`` is ``[N, O]``) holds one value in every row.

    ``rows`` describes the rows checked in messages, e.g. ``"data rows"``.
    """
    constant = np.flatnonzero(y.max(axis=0) == y.min(axis=0))
    if constant.size:
        names = [f"{target_names[o]!r} (always {y[0, o]:g})" for o in constant]
        raise DataError(
            f"{source}: target column(s) {', '.join(names)} hold a single value in all {len(y)} {rows}; "
            "a regression target must vary, so choose another target column."
        )
