"""Regression data from a CSV file with a header row (``load_dataset("csv:PATH:TARGET")``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from zoo.data.checks import DataError, check_finite_array
from zoo.data.dataset import Dataset, random_split, regression_dataset

__all__ = ["load_csv"]


def _target_names(target_column) -> list[str]:
    if isinstance(target_column, str):
        return [name.strip() for name in target_column.split(",") if name.strip()]
    return [str(name) for name in target_column]


def load_csv(path: str | os.PathLike, target_column, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """Regression data from a CSV file with a header row; every other column is a feature.

    Args:
        path: CSV file (read with ``pandas.read_csv``); all used columns must be numeric.
        target_column: a column name, comma-separated names (``"y1,y2"``) or a list of names.
        test_fraction: share of rows in the test split.
        seed: seed of the random split (:func:`zoo.data.dataset.random_split`).

    Returns:
        A regression :class:`Dataset`, x ``[N, D]`` and y ``[N, O]`` standardised with the
        training statistics. NaN/inf cells raise :class:`DataError` naming the data rows
        (0-based, header not counted) and columns.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"CSV file {path} does not exist; check the path.")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"could not parse CSV file {path}: {err}") from err
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    targets = _target_names(target_column)
    missing = [name for name in targets if name not in columns]
    if not targets or missing:
        raise DataError(
            f"target column(s) {missing or targets} not found in {path}; available columns: {columns}."
        )
    features = [name for name in columns if name not in targets]
    if not features:
        raise DataError(f"{path} has no feature columns besides the targets {targets}.")
    non_numeric = [name for name in columns if not pd.api.types.is_numeric_dtype(frame[name])]
    if non_numeric:
        raise DataError(
            f"{path} has non-numeric columns {non_numeric}; encode or drop them before loading."
        )
    values = frame[features + targets].to_numpy(dtype=np.float64)
    check_finite_array(values, f"CSV file {path}", features + targets)
    train_idx, test_idx = random_split(len(values), test_fraction, seed)
    x, y = values[:, : len(features)], values[:, len(features) :]
    info = {"source": str(path), "seed": seed, "test_fraction": test_fraction}
    return regression_dataset(
        path.stem,
        x[train_idx],
        y[train_idx],
        x[test_idx],
        y[test_idx],
        feature_names=features,
        target_names=targets,
        info=info,
    )
