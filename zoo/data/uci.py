"""UCI regression benchmarks in the 20-split layout of Hernández-Lobato & Adams 2015.

The bundled copies (package data ``zoo/data/bundled/uci``, provenance and licence in
``zoo/data/bundled/README.md``, installed with the package) are the
train/test layout of Gal & Ghahramani 2016, which reuses the 20 random splits (about 90/10) of
Hernández-Lobato & Adams 2015. :func:`load_uci` reads one of those fixed splits;
:func:`load_uci_full_random_split` draws one seeded random split of all rows instead (the
protocol of Rochussen 2024); :func:`load_uci_gap` makes the "gap" split of one input feature
(Foong et al. 2019: the middle third of the rows sorted by that feature held out).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np

from zoo.data.checks import DataError, FileLines, check_table, check_targets_vary, listing
from zoo.data.dataset import Dataset, random_split, regression_dataset
from zoo.data.files import read_numbers

__all__ = ["BUNDLED_UCI", "STANDARDISE_ON", "UCI_DATA_DIR", "gap_split", "load_uci", "load_uci_full_random_split",
           "load_uci_gap"]

UCI_DATA_DIR = Path(str(files("zoo.data").joinpath("bundled", "uci")))
"""Folder of the bundled UCI datasets: package data of :mod:`zoo.data`, found through
``importlib.resources`` the same way from a checkout, an editable install, a wheel or an sdist."""

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
    lines: FileLines  # data.txt line of each row
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


def _read_indices(path: Path, upper: int, what: str) -> list[int]:
    """Integer indices of a file, each in ``0 .. upper - 1`` and listed once; errors name the file line."""
    values, lines = read_numbers(path, "UCI file", f"0-based {what} in 0..{upper - 1}, one per line", ndmin=2)
    per_line, flat = values.shape[1], values.ravel()
    bad = np.flatnonzero((flat != np.round(flat)) | (flat < 0) | (flat >= upper))
    if bad.size:
        found = [f"{flat[i]:g} at line {line}" for i, line in zip(bad, lines(bad // per_line))]
        raise DataError(f"UCI file {path} must list integer {what} in 0..{upper - 1}; found {listing(found)}.")
    indices = flat.astype(int)
    unique, counts = np.unique(indices, return_counts=True)
    if np.any(counts > 1):
        repeats = [
            f"{v} at lines {', '.join(map(str, sorted(set(lines(np.flatnonzero(indices == v) // per_line)))))}"
            for v in unique[counts > 1]
        ]
        raise DataError(
            f"UCI file {path} lists {what} more than once: {listing(repeats)}; each may appear once, "
            "so remove the repeats."
        )
    return indices.tolist()


def _read_uci_table(name_or_path, targets) -> _UciTable:
    folder = _uci_folder(name_or_path)
    data_path = folder / "data.txt"
    data, lines = read_numbers(data_path, "UCI file", "one line of whitespace-separated numbers per example", ndmin=2)
    n_columns = data.shape[1]
    column_file = folder / "columns.txt"
    column_names = (
        column_file.read_text().split() if column_file.is_file() else [f"col{c}" for c in range(n_columns)]
    )
    if len(column_names) != n_columns:
        raise DataError(f"{column_file} names {len(column_names)} columns but data.txt has {n_columns}.")
    check_table(data, f"UCI file {data_path}", column_names, lines)
    if targets is None:
        targets = _read_indices(folder / "index_target.txt", n_columns, "target columns")
    else:
        targets = [int(t) for t in np.atleast_1d(targets)]
        if not targets or len(set(targets)) != len(targets) or not all(0 <= t < n_columns for t in targets):
            raise DataError(
                f"targets must be distinct column indices in 0..{n_columns - 1} of {data_path}, "
                f"got {targets}; the columns are {column_names}."
            )
    check_targets_vary(data[:, targets], f"UCI file {data_path}", [column_names[t] for t in targets], "rows")
    features = [
        c for c in _read_indices(folder / "index_features.txt", n_columns, "feature columns") if c not in targets
    ]
    if not features:
        raise DataError(f"{folder}: no feature columns are left once the targets {targets} are removed.")
    info = {"source": str(folder)}
    for key in ("n_splits", "n_hidden", "n_epochs"):
        if (folder / f"{key}.txt").is_file():
            info[key] = int(read_numbers(folder / f"{key}.txt", "UCI file", f"the number {key}")[0][0])
    for key in ("dropout_rates", "tau_values"):
        if (folder / f"{key}.txt").is_file():
            info[key] = read_numbers(folder / f"{key}.txt", "UCI file", f"the {key} grid")[0].ravel().tolist()
    if "n_splits" not in info:
        info["n_splits"] = len(list(folder.glob("index_train_*.txt")))
    return _UciTable(folder.name, folder, data, lines, features, targets, column_names, info)


def _check_disjoint(table: _UciTable, train_path: Path, test_path: Path, train_idx, test_idx) -> None:
    shared = np.intersect1d(train_idx, test_idx)
    if shared.size:
        raise DataError(
            f"UCI files {train_path} and {test_path.name} share {shared.size} row index(es) {listing(shared)} "
            f"(0-based rows of data.txt, at its lines {listing(table.lines(shared))}); a row must not be in both "
            "the training and the test split, so fix the split files."
        )


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
        name_or_path: a name in :data:`BUNDLED_UCI` (read from :data:`UCI_DATA_DIR`) or a
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

    Before any split or standardisation the files are checked, each error a :class:`DataError`
    naming the file and its 1-based line (data.txt has no header; ``#`` comments and blank lines
    are skipped but counted): data.txt must hold numbers only, as many on every line, all
    finite and within float32's range, and a target column that varies; index files must list
    integers in range, each once; a split's training and test rows must not overlap, and its
    training targets must vary.
    """
    table = _read_uci_table(name_or_path, targets)
    n_splits = table.info["n_splits"]
    if n_splits < 1:
        raise DataError(f"UCI folder {table.folder} has no split: it needs index_train_0.txt and index_test_0.txt "
                        f"(0-based row indices of the training and test rows; index_train_<k>.txt, ... for more)")
    if not isinstance(split, (int, np.integer)) or not 0 <= split < n_splits:
        raise DataError(
            f"split {split!r} is out of range for {table.name!r}: valid splits are 0..{n_splits - 1}."
        )
    n_rows = table.data.shape[0]
    train_path, test_path = table.folder / f"index_train_{split}.txt", table.folder / f"index_test_{split}.txt"
    train_idx = _read_indices(train_path, n_rows, "training rows")
    test_idx = _read_indices(test_path, n_rows, "test rows")
    _check_disjoint(table, train_path, test_path, train_idx, test_idx)
    target_names = [table.column_names[t] for t in table.targets]
    check_targets_vary(table.data[train_idx][:, table.targets], f"UCI file {train_path}", target_names, "training rows")
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


def gap_split(values) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test row indices of the gap split of one feature (Foong et al. 2019).

    The rows are ordered by ``values`` ``[N]`` (a stable sort: tied rows keep their file order) and the
    ordered positions ``round(N/3) .. round(2N/3) − 1`` — the middle third — are the test rows; the
    lower and upper thirds are the training rows.  Where the feature takes few distinct values the
    boundary cuts through tied rows, so test and training rows can share a value (no gap in that
    feature): :func:`load_uci_gap` records how many.
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    if values.ndim != 1 or n < 3:
        raise DataError(f"a gap split needs one feature's values [N] with N >= 3, got shape {values.shape}.")
    order = np.argsort(values, kind="stable")
    low, high = int(round(n / 3)), int(round(2 * n / 3))
    return np.sort(np.concatenate([order[:low], order[high:]])), np.sort(order[low:high])


def load_uci_gap(name_or_path: str | os.PathLike, split: int = 0, targets=None) -> Dataset:
    """The gap split of input feature ``split`` of a UCI regression dataset (Foong et al. 2019).

    Foong et al. 2019 ("'In-between' uncertainty in Bayesian neural networks") sort the rows by one
    input and hold out the middle third as the test set, once per input: a dataset of D inputs has
    D gap splits, and a posterior that is over-confident between two clusters of data scores a low
    test log-likelihood there.  Rows and features are :func:`load_uci`'s; :func:`gap_split` makes the
    split.

    Args:
        name_or_path: a name in :data:`BUNDLED_UCI` or a folder in the UCI split layout (its
            ``index_*_<k>.txt`` files are not used).
        split: the input feature ``k`` in ``0 .. D − 1`` (the order of ``feature_names``) whose
            middle third is held out (``--split`` of ``uci-gap:NAME``).
        targets: column indices overriding ``index_target.txt``, as for :func:`load_uci`.

    Returns:
        A regression :class:`Dataset` (``split`` = the feature index), standardised with the training
        rows' statistics (as in Foong et al.'s shared loader); ``info`` holds ``n_splits`` = D, the
        ``gap_feature`` name, its training and test value ranges and ``test_rows_sharing_values``: the
        test rows whose value of the feature also occurs among the training rows (0 for a clean gap).
    """
    table = _read_uci_table(name_or_path, targets)
    n_features = len(table.features)
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 <= split < n_features:
        raise DataError(
            f"--split {split!r} names no input feature of uci-gap:{table.name}: a gap split holds out the middle "
            f"third of one input, so the splits are the features 0..{n_features - 1} "
            f"({', '.join(f'{k}={table.column_names[c]}' for k, c in enumerate(table.features))})."
        )
    values = table.data[:, table.features[split]]
    train_idx, test_idx = gap_split(values)
    target_names = [table.column_names[t] for t in table.targets]
    check_targets_vary(table.data[train_idx][:, table.targets], f"UCI gap split {split} of {table.folder}",
                       target_names, "training rows")
    feature = table.column_names[table.features[split]]
    shared = int(np.isin(values[test_idx], values[train_idx]).sum())
    info = {**{k: v for k, v in table.info.items() if k != "n_splits"}, "n_splits": n_features,
            "protocol": f"gap split of feature {split} ({feature}): the middle third of the rows sorted by it held "
                        f"out (Foong et al. 2019)",
            "gap_feature": feature, "train_range": [float(values[train_idx].min()), float(values[train_idx].max())],
            "test_range": [float(values[test_idx].min()), float(values[test_idx].max())],
            "test_rows_sharing_values": shared}
    return _uci_dataset(table, train_idx, test_idx, info, split=int(split))
