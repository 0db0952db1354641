"""Regression data from a CSV file with a header row (``load_dataset("csv:PATH:TARGET")``)."""

from __future__ import annotations

import os

from zoo.data.checks import DataError, check_targets_vary
from zoo.data.dataset import Dataset, random_split, regression_dataset
from zoo.data.files import read_csv_table

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
        training statistics.

    Before the split, the file is checked (:func:`zoo.data.files.read_csv_table`): a directory,
    an empty file, a header without data rows, a column name given twice, a missing target
    column, a cell that is not a number, a missing or NaN/inf cell, a value beyond float32's
    range and a constant target each raise :class:`DataError` naming the file line (1-based,
    the header is line 1) and the column.
    """
    table = read_csv_table(path)
    columns = table.columns
    targets = _target_names(target_column)
    missing = [name for name in targets if name not in columns]
    if not targets or missing:
        raise DataError(
            f"target column(s) {missing or targets} not found in {table.path}; available columns: {columns}."
        )
    if len(set(targets)) != len(targets):
        raise DataError(f"target columns {targets} name a column more than once; give each once.")
    features = [name for name in columns if name not in targets]
    if not features:
        raise DataError(f"{table.path} has no feature columns besides the targets {targets}.")
    values = table.numeric(features + targets)
    check_targets_vary(values[:, len(features) :], table.source, targets, "data rows")
    train_idx, test_idx = random_split(len(values), test_fraction, seed)
    x, y = values[:, : len(features)], values[:, len(features) :]
    info = {"source": str(table.path), "seed": seed, "test_fraction": test_fraction}
    return regression_dataset(
        table.path.stem,
        x[train_idx],
        y[train_idx],
        x[test_idx],
        y[test_idx],
        feature_names=features,
        target_names=targets,
        info=info,
    )
