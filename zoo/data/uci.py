"""UCI regression benchmarks in the 20-split layout of Hernández-Lobato & Adams 2015.

The bundled copies (``<repo>/data/uci``, provenance and licence in ``data/README.md``) are the
train/test layout of Gal & Ghahramani 2016, which reuses the 20 random splits (about 90/10) of
Hernández-Lobato & Adams 2015. :func:`load_uci` reads one of those fixed splits;
:func:`load_uci_full_random_split` draws one seeded random split of all rows instead (the
protocol of Rochussen 2024).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.data.checks import DataError, check_finite_array, listing
from zoo.data.dataset import Dataset, random_split, regression_dataset

__all__ = ["BUNDLED_UCI", "STANDARDISE_ON", "UCI_DATA_DIR", "load_uci", "load_uci_full_random_split"]

UCI_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "uci"
"""Folder of the bundled UCI datasets (``<repo>/data/uci``)."""

BUNDLED_UCI = ("bostonHousing", "concrete", "energy", "yacht", "wine-quality-red")
"""Names accepted by :func:`load_uci` without a path."""

STANDARDISE_ON = ("train", "all")
"""Values of ``standardise_on`` in :func:`load_uci_full_random_split`."""


@dataclass
class _UciTable:
    """The contents of one UCI-layout folder: raw data and column choices."""

    name: str
    folder: Path
    data: np.ndarray  # float64 [N, C]
    features: list[int]
    targets: list[int]
    column_names: list[str]
    info: dict


def _uci_folder(name_or_path: str | os.PathLike) -> Path:
    if str(name_or_path) in BUNDLED_UCI:
        return UCI_DATA_DIR / str(name_or_path)
    folder = Path(name_or_path)
    if not folder.is_dir():
        raise DataError(
            f"UCI dataset {str(name_or_path)!r} is neither a bundled name ({', '.join(BUNDLED_UCI)}) "
            "nor an existing folder; give a bundled name or the path of a folder in the UCI split "
            "layout (data.txt, index_features.txt, index_target.txt, index_train_<k>.txt, ...)."
        )
    return folder


def _read_numbers(path: Path) -> np.ndarray:
    """Whitespace-separated numbers of a text file (1-D for one number per line)."""
    if not path.is_file():
        raise DataError(f"missing file {path}; a UCI-layout folder needs it.")
    try:
        return np.loadtxt(path, ndmin=1)
    except ValueError as err:
        raise DataError(f"{path} must hold whitespace-separated numbers only: {err}") from err


def _read_indices(path: Path, upper: int, what: str) -> list[int]:
    """Integer indices of a file, each checked to lie in ``0 .. upper - 1``."""
    values = _read_numbers(path).ravel()
    if values.size == 0 or np.any(values != np.round(values)) or values.min() < 0 or values.max() >= upper:
        raise DataError(f"{path} must list integer {what} in 0..{upper - 1}, got {listing(values)}.")
    return [int(v) for v in values]


def _read_uci_table(name_or_path, targets) -> _UciTable:
    folder = _uci_folder(name_or_path)
    data = _read_numbers(folder / "data.txt")
    if data.ndim != 2:
        data = data.reshape(1, -1)
    if data.size == 0:
        raise DataError(f"{folder / 'data.txt'} holds no data; it needs one row of numbers per example.")
    n_columns = data.shape[1]
    column_file = folder / "columns.txt"
    column_names = (
        column_file.read_text().split() if column_file.is_file() else [f"col{c}" for c in range(n_columns)]
    )
    if len(column_names) != n_columns:
        raise DataError(f"{column_file} names {len(column_names)} columns but data.txt has {n_columns}.")
    check_finite_array(data, str(folder / "data.txt"), column_names)
    if targets is None:
        targets = _read_indices(folder / "index_target.txt", n_columns, "target columns")
    else:
        targets = [int(t) for t in np.atleast_1d(targets)]
        if not targets or len(set(targets)) != len(targets) or not all(0 <= t < n_columns for t in targets):
            raise DataError(
                f"targets must be distinct column indices in 0..{n_columns - 1} of {folder / 'data.txt'}, "
                f"got {targets}; the columns are {column_names}."
            )
    features = [
        c for c in _read_indices(folder / "index_features.txt", n_columns, "feature columns") if c not in targets
    ]
    if not features:
        raise DataError(f"{folder}: no feature columns are left once the targets {targets} are removed.")
    info = {"source": str(folder)}
    for key in ("n_splits", "n_hidden", "n_epochs"):
        if (folder / f"{key}.txt").is_file():
            info[key] = int(_read_numbers(folder / f"{key}.txt")[0])
    for key in ("dropout_rates", "tau_values"):
        if (folder / f"{key}.txt").is_file():
            info[key] = _read_numbers(folder / f"{key}.txt").ravel().tolist()
    if "n_splits" not in info:
        info["n_splits"] = len(list(folder.glob("index_train_*.txt")))
    return _UciTable(folder.name, folder, data, features, targets, column_names, info)


def _uci_dataset(table: _UciTable, train_idx, test_idx, info: dict, split=None, fit_all=False) -> Dataset:
    x = table.data[:, table.features]
    y = table.data[:, table.targets]
    return regression_dataset(
        table.name,
        x[train_idx],
        y[train_idx],
        x[test_idx],
        y[test_idx],
        feature_names=[table.column_names[c] for c in table.features],
        target_names=[table.column_names[c] for c in table.targets],
        info=info,
        split=split,
        fit_x=x if fit_all else None,
        fit_y=y if fit_all else None,
    )


def load_uci(name_or_path: str | os.PathLike, split: int = 0, targets=None) -> Dataset:
    """One of the 20 standard train/test splits of a UCI regression dataset.

    Args:
        name_or_path: a name in :data:`BUNDLED_UCI` (read from ``<repo>/data/uci/<name>``) or a
            folder in the same layout: ``data.txt`` (whitespace-separated numbers, [rows, columns]),
            ``index_features.txt``, ``index_target.txt`` (0-based column indices),
            ``index_train_<k>.txt`` / ``index_test_<k>.txt`` (0-based row indices), optional
            ``n_splits.txt``, ``n_hidden.txt``, ``n_epochs.txt``, ``columns.txt`` (column names).
        split: split index ``k`` in ``0 .. n_splits - 1``.
        targets: column indices overriding ``index_target.txt`` (they are also removed from the
            features), e.g. ``[8, 9]`` for both energy outputs where data.txt has them.

    Returns:
        A regression :class:`Dataset`: x ``[N, D]``, y ``[N, O]``, both standardised with the
        training split's statistics; ``info`` holds the source folder, ``n_splits`` and, when the
        folder has them, the recommended ``n_hidden`` / ``n_epochs`` and the ``dropout_rates`` /
        ``tau_values`` grids of Gal & Ghahramani 2016.
    """
    table = _read_uci_table(name_or_path, targets)
    n_splits = table.info["n_splits"]
    if not isinstance(split, (int, np.integer)) or not 0 <= split < n_splits:
        raise DataError(
            f"split {split!r} is out of range for {table.name!r}: valid splits are 0..{n_splits - 1}."
        )
    n_rows = table.data.shape[0]
    train_idx = _read_indices(table.folder / f"index_train_{split}.txt", n_rows, "training rows")
    test_idx = _read_indices(table.folder / f"index_test_{split}.txt", n_rows, "test rows")
    info = {**table.info, "protocol": f"fixed split {split} of {n_splits}"}
    return _uci_dataset(table, train_idx, test_idx, info, split=int(split))


def load_uci_full_random_split(
    name: str | os.PathLike,
    test_fraction: float = 0.2,
    seed: int = 0,
    targets=None,
    standardise_on: str = "train",
) -> Dataset:
    """One seeded random train/test split of all rows of a UCI dataset (the protocol of Rochussen 2024).

    Args:
        name: bundled UCI name or UCI-layout folder, as for :func:`load_uci`.
        test_fraction: share of rows in the test split (default 0.2, i.e. 80/20).
        seed: seed of the random permutation (NumPy ``default_rng``).
        targets: column indices overriding ``index_target.txt``, as for :func:`load_uci`.
        standardise_on: one of :data:`STANDARDISE_ON`. ``"train"`` (default) standardises x and y
            with the training split's statistics, like every other loader; ``"all"`` uses all rows,
            as the reference code of Rochussen 2024 did (it leaks test statistics; use it only to
            reproduce that protocol's numbers).

    Returns:
        A regression :class:`Dataset` with ``split=None``; x ``[N, D]``, y ``[N, O]``.
    """
    if standardise_on not in STANDARDISE_ON:
        raise DataError(f"standardise_on must be one of {STANDARDISE_ON}, got {standardise_on!r}.")
    table = _read_uci_table(name, targets)
    train_idx, test_idx = random_split(table.data.shape[0], test_fraction, seed)
    info = {
        **table.info,
        "protocol": f"random split, test fraction {test_fraction}, seed {seed}",
        "seed": seed,
        "standardised_on": standardise_on,
    }
    return _uci_dataset(table, train_idx, test_idx, info, fit_all=standardise_on == "all")
