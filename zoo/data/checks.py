"""Input validation shared by every loader: :class:`DataError` and the finiteness / shape checks.

Every bad-input path of :mod:`zoo.data` raises :class:`DataError` (a ``ValueError``) saying what
was wrong and what to do; the checks here name the offending rows (0-based) and columns.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["DataError", "check_finite_array", "check_xy", "listing"]

_MAX_LISTED = 10


class DataError(ValueError):
    """Bad input data or arguments; the message says what was wrong and what to do."""


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
