"""Datasets for the zoo: bundled UCI regression, 1-D toys, CSV files, digits, moons and Euler angles.

Every loader returns a :class:`Dataset` whose inputs and regression targets are stored
*standardised* with statistics of the training split only (``(v - loc) / scale``; the scale of a
constant column is 1). ``Dataset.y_to_original`` / ``x_to_original`` map back to original units.

Shapes (N rows, D features, T time steps, F features per step, O regression outputs):

- tabular inputs ``x``: float32 ``[N, D]``; sequence inputs: float32 ``[N, T, F]``;
- regression targets ``y``: float32 ``[N, O]`` (2-D even when O == 1);
- classification targets ``y``: int64 ``[N]`` with labels ``0 .. num_classes - 1``.

Every bad-input path raises :class:`DataError` (a ``ValueError``) saying what was wrong and what
to do. :func:`load_dataset` maps a string spec (see :data:`DATASET_SPECS`) to a loader.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

__all__ = [
    "BUNDLED_UCI",
    "DATASET_SPECS",
    "DataError",
    "Dataset",
    "EULER_ANGLES",
    "EULER_INPUT_STEPS",
    "EULER_TARGET_STEP",
    "TOY1D_TEST_RANGE",
    "TOY1D_TRAIN_INTERVALS",
    "check_finite_array",
    "check_xy",
    "load_csv",
    "load_dataset",
    "load_digits_dataset",
    "load_euler",
    "load_uci",
    "load_uci_full_random_split",
    "make_moons_dataset",
    "make_toy1d",
    "toy1d_curve",
]

UCI_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "uci"
"""Folder of the bundled UCI datasets (``<repo>/data/uci``)."""

BUNDLED_UCI = ("bostonHousing", "concrete", "energy", "yacht", "wine-quality-red")
"""Names accepted by :func:`load_uci` without a path."""

DEFAULT_EULER_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "euler"
"""Default Euler-angle folder (``<repo>/../shared/data/euler``); override with ``ZOO_EULER_DIR``."""

EULER_DIR_ENV = "ZOO_EULER_DIR"
EULER_ANGLES = ("Phi1", "Phi", "Phi2")
EULER_INPUT_STEPS = tuple(k for k in range(1, 20) if k != 6)
"""Strain steps used as the input sequence: 1..19 without 6 (absent from the original release)."""
EULER_TARGET_STEP = 20

TOY1D_TRAIN_INTERVALS = ((-0.1, 0.2), (0.55, 0.85))
"""The two x-intervals the 1-D toy's training points are drawn from; (0.2, 0.55) is the gap."""
TOY1D_TEST_RANGE = (-0.5, 1.2)
"""The x-range of the 1-D toy's dense test grid (covers the gap and both outer regions)."""
TOY1D_NOISE_SD = 0.02

DATASET_SPECS = {
    "uci:NAME": "bundled UCI regression set with 20 fixed splits; NAME in " + ", ".join(BUNDLED_UCI),
    "uci:PATH": "UCI-layout folder (data.txt, index_features.txt, index_target.txt, index_*_<k>.txt)",
    "toy1d": "1-D regression toy of Blundell et al. 2015: 40 training points with a gap in x",
    "csv:PATH:TARGET": "CSV regression; TARGET is a column name or comma-separated names; 80/20 split",
    "digits": "scikit-learn 8x8 digits, 10 classes, stratified 75/25 split",
    "moons": "scikit-learn two-moons binary classification, 80/20 split",
    "euler[:PATH]": "Euler-angle sequences under strain (seed 000), not bundled; PATH or $ZOO_EULER_DIR",
}
"""Spec forms accepted by :func:`load_dataset`, each with a one-line description (for ``--help``)."""

_TASKS = ("regression", "classification")
_MAX_LISTED = 10


class DataError(ValueError):
    """Bad input data or arguments; the message says what was wrong and what to do."""


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _listing(indices) -> str:
    """Format the first ``_MAX_LISTED`` items of a sequence, noting how many there are in all."""
    items = [str(i) for i in indices]
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
    message = f"{name} has {int(bad.sum())} NaN/inf value(s) in rows {_listing(rows)} (0-based)"
    if len(shape) > 1:
        cols = np.flatnonzero(bad.reshape(-1, shape[-1]).any(axis=0))
        if column_names is not None:
            cols = [column_names[c] for c in cols]
        message += f" and columns {_listing(cols)}"
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


# --------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------


@dataclass
class Dataset:
    """A train/test pair, stored standardised with training-split statistics.

    Attributes:
        name: dataset name, e.g. ``"energy"``.
        task: ``"regression"`` or ``"classification"``.
        x_train, x_test: float32 ``[N, D]`` (or ``[N, T, F]`` for sequences), standardised.
        y_train, y_test: regression: float32 ``[N, O]``, standardised; classification: int64 ``[N]``.
        x_loc, x_scale: float32, broadcastable to x (``[D]``, or ``[1, 1, F]`` for sequences);
            original-unit inputs are ``x * x_scale + x_loc``.
        y_loc, y_scale: float32 ``[O]`` (classification: ``zeros(1)`` / ``ones(1)``).
        num_classes: number of classes (classification) or ``None``.
        split: index of a fixed published split (UCI) or ``None`` for seeded random splits.
        feature_names: names of the D (or F) input features.
        target_names: regression: names of the O outputs; classification: class names.
        info: provenance and extras (source, seed, units, recommended n_hidden / n_epochs, ...).
    """

    name: str
    task: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_loc: torch.Tensor
    x_scale: torch.Tensor
    y_loc: torch.Tensor
    y_scale: torch.Tensor
    num_classes: int | None = None
    split: int | None = None
    feature_names: list[str] = field(default_factory=list)
    target_names: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in _TASKS:
            raise DataError(f"task must be one of {_TASKS}, got {self.task!r}.")
        check_xy(self.x_train, self.y_train, f"{self.name} training split")
        check_xy(self.x_test, self.y_test, f"{self.name} test split")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DataError(
                f"{self.name}: training inputs have shape {tuple(self.x_train.shape)} but test "
                f"inputs {tuple(self.x_test.shape)}; all but the first dimension must match."
            )
        if self.task == "classification":
            labels = (self.y_train, self.y_test)
            if self.num_classes is None or any(y.dim() != 1 or y.dtype != torch.int64 for y in labels):
                raise DataError(f"{self.name}: classification needs num_classes and int64 targets of shape [N].")
            if any(y.min() < 0 or y.max() >= self.num_classes for y in labels):
                raise DataError(f"{self.name}: class labels must lie in 0..{self.num_classes - 1}.")
        elif self.y_train.dim() != 2 or self.y_train.shape[1] != self.y_test.shape[1]:
            raise DataError(
                f"{self.name}: regression targets must be [N, O] with the same O in both splits, got "
                f"{tuple(self.y_train.shape)} and {tuple(self.y_test.shape)}."
            )

    @property
    def n_train(self) -> int:
        """Number of training rows."""
        return self.x_train.shape[0]

    @property
    def n_test(self) -> int:
        """Number of test rows."""
        return self.x_test.shape[0]

    @property
    def input_dim(self) -> int:
        """Features per row (D), or per time step (F) for sequence data."""
        return self.x_train.shape[-1]

    @property
    def output_dim(self) -> int:
        """Regression outputs (O), or ``num_classes`` for classification."""
        return self.num_classes if self.task == "classification" else self.y_train.shape[1]

    def x_to_original(self, x: torch.Tensor) -> torch.Tensor:
        """Map standardised inputs (shaped like ``x_train``) back to original units."""
        return x * self.x_scale + self.x_loc

    def y_to_original(self, y: torch.Tensor) -> torch.Tensor:
        """Map standardised regression targets or predictions ``[..., O]`` to original units.

        Classification labels are returned unchanged. A predictive standard deviation in
        original units is ``sd * y_scale`` (no shift).
        """
        if self.task == "classification":
            return y
        return y * self.y_scale + self.y_loc

    def y_train_original(self) -> torch.Tensor:
        """Training targets in original units (``[N, O]``; labels for classification)."""
        return self.y_to_original(self.y_train)

    def y_test_original(self) -> torch.Tensor:
        """Test targets in original units (``[N, O]``; labels for classification)."""
        return self.y_to_original(self.y_test)

    def summary(self) -> dict:
        """Short description for reports: name, task, sizes, dimensions and split."""
        return {
            "name": self.name,
            "task": self.task,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "split": self.split,
        }


# --------------------------------------------------------------------------------------------
# Shared construction helpers
# --------------------------------------------------------------------------------------------


def _standardiser(fit_on: np.ndarray, axes) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (ddof 0) over ``axes``; the scale of constant columns is 1."""
    loc = fit_on.mean(axis=axes)
    scale = fit_on.std(axis=axes)
    scale[fit_on.max(axis=axes) == fit_on.min(axis=axes)] = 1.0
    return loc, scale


def _float32(arr: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(arr, dtype=np.float32))


def _random_split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test row indices of a seeded random split of ``n`` rows."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction must be strictly between 0 and 1, got {test_fraction}.")
    n_test = int(round(n * test_fraction))
    if n_test < 1 or n_test >= n:
        raise DataError(
            f"a test fraction of {test_fraction} of {n} rows leaves an empty training or test split; "
            "use more rows or a different fraction."
        )
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def _regression_dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    feature_names: list[str],
    target_names: list[str],
    info: dict,
    split: int | None = None,
    fit_x: np.ndarray | None = None,
    fit_y: np.ndarray | None = None,
) -> Dataset:
    """Standardise raw float arrays (statistics of ``fit_x`` / ``fit_y``, default the training
    split) and wrap them. ``x`` is ``[N, D]`` (stats per column) or ``[N, T, F]`` (stats per
    feature over rows and steps, loc/scale shaped ``[1, 1, F]``); ``y`` is ``[N, O]``."""
    fit_x = x_train if fit_x is None else fit_x
    fit_y = y_train if fit_y is None else fit_y
    x_axes = 0 if x_train.ndim == 2 else (0, 1)
    x_loc, x_scale = _standardiser(fit_x, x_axes)
    if x_train.ndim == 3:
        x_loc, x_scale = x_loc.reshape(1, 1, -1), x_scale.reshape(1, 1, -1)
    y_loc, y_scale = _standardiser(fit_y, 0)
    return Dataset(
        name=name,
        task="regression",
        x_train=_float32((x_train - x_loc) / x_scale),
        y_train=_float32((y_train - y_loc) / y_scale),
        x_test=_float32((x_test - x_loc) / x_scale),
        y_test=_float32((y_test - y_loc) / y_scale),
        x_loc=_float32(x_loc),
        x_scale=_float32(x_scale),
        y_loc=_float32(y_loc),
        y_scale=_float32(y_scale),
        split=split,
        feature_names=feature_names,
        target_names=target_names,
        info=info,
    )


def _classification_dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    num_classes: int,
    feature_names: list[str],
    target_names: list[str],
    info: dict,
) -> Dataset:
    """Standardise ``[N, D]`` inputs with training statistics and wrap them with int64 labels."""
    x_loc, x_scale = _standardiser(x_train, 0)
    return Dataset(
        name=name,
        task="classification",
        x_train=_float32((x_train - x_loc) / x_scale),
        y_train=torch.as_tensor(y_train, dtype=torch.int64),
        x_test=_float32((x_test - x_loc) / x_scale),
        y_test=torch.as_tensor(y_test, dtype=torch.int64),
        x_loc=_float32(x_loc),
        x_scale=_float32(x_scale),
        y_loc=torch.zeros(1),
        y_scale=torch.ones(1),
        num_classes=num_classes,
        feature_names=feature_names,
        target_names=target_names,
        info=info,
    )


# --------------------------------------------------------------------------------------------
# UCI regression (20-split layout)
# --------------------------------------------------------------------------------------------


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
        raise DataError(f"{path} must list integer {what} in 0..{upper - 1}, got {_listing(values)}.")
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
    return _regression_dataset(
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
        name_or_path: a bundled name (``bostonHousing``, ``concrete``, ``energy``, ``yacht``,
            ``wine-quality-red``; read from ``<repo>/data/uci/<name>``) or a folder in the same
            layout: ``data.txt`` (whitespace-separated numbers, [rows, columns]),
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
        ``tau_values`` grids of the dropout-uncertainty experiments.
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
    """One seeded random train/test split of all rows of a UCI dataset (seed 003's protocol).

    Args:
        name: bundled UCI name or UCI-layout folder, as for :func:`load_uci`.
        test_fraction: share of rows in the test split (default 0.2, i.e. 80/20).
        seed: seed of the random permutation (NumPy ``default_rng``).
        targets: column indices overriding ``index_target.txt``, as for :func:`load_uci`.
        standardise_on: ``"train"`` (default) standardises x and y with the training split's
            statistics, like every other loader; ``"all"`` uses all rows, as seed 003's reference
            code did (it leaks test statistics; use it only to reproduce that protocol's numbers).

    Returns:
        A regression :class:`Dataset` with ``split=None``; x ``[N, D]``, y ``[N, O]``.
    """
    if standardise_on not in ("train", "all"):
        raise DataError(f"standardise_on must be 'train' or 'all', got {standardise_on!r}.")
    table = _read_uci_table(name, targets)
    train_idx, test_idx = _random_split(table.data.shape[0], test_fraction, seed)
    info = {
        **table.info,
        "protocol": f"random split, test fraction {test_fraction}, seed {seed}",
        "seed": seed,
        "standardised_on": standardise_on,
    }
    return _uci_dataset(table, train_idx, test_idx, info, fit_all=standardise_on == "all")


# --------------------------------------------------------------------------------------------
# 1-D toy regression
# --------------------------------------------------------------------------------------------


def toy1d_curve(x: np.ndarray, noise: np.ndarray | float = 0.0) -> np.ndarray:
    """The toy signal ``x + 0.3 sin(2π(x+ε)) + 0.3 sin(4π(x+ε)) + ε``; ``noise`` is ε (0: noiseless)."""
    shifted = x + noise
    return x + 0.3 * np.sin(2 * math.pi * shifted) + 0.3 * np.sin(4 * math.pi * shifted) + noise


def make_toy1d(n_train: int = 40, n_test: int = 500, seed: int = 0) -> Dataset:
    """The 1-D regression toy of Blundell et al. 2015, as used in seed 002 §4.1.3.

    ``y = x + 0.3 sin(2π(x+ε)) + 0.3 sin(4π(x+ε)) + ε`` with ``ε ~ N(0, 0.02²)`` drawn per point.
    Training x: half of the points (rounded down) uniform in ``[-0.1, 0.2]``, the rest uniform in
    ``[0.55, 0.85]`` (:data:`TOY1D_TRAIN_INTERVALS`), leaving the gap ``(0.2, 0.55)`` empty.
    Test x: ``n_test`` evenly spaced points on ``[-0.5, 1.2]`` (:data:`TOY1D_TEST_RANGE`),
    covering the gap and both outer regions, with noisy targets drawn the same way.

    Returns:
        A regression :class:`Dataset` with x ``[N, 1]`` and y ``[N, 1]``, standardised with the
        training statistics (``x_to_original`` recovers x on the scale above).
    """
    if n_train < 2 or n_test < 1:
        raise DataError(f"make_toy1d needs n_train >= 2 and n_test >= 1, got {n_train} and {n_test}.")
    rng = np.random.default_rng(seed)
    (low_a, high_a), (low_b, high_b) = TOY1D_TRAIN_INTERVALS
    n_first = n_train // 2
    x_train = np.concatenate(
        [rng.uniform(low_a, high_a, n_first), rng.uniform(low_b, high_b, n_train - n_first)]
    )
    x_test = np.linspace(*TOY1D_TEST_RANGE, n_test)
    y_train = toy1d_curve(x_train, rng.normal(0.0, TOY1D_NOISE_SD, n_train))
    y_test = toy1d_curve(x_test, rng.normal(0.0, TOY1D_NOISE_SD, n_test))
    info = {
        "source": "synthetic (Blundell et al. 2015 signal)",
        "seed": seed,
        "noise_sd": TOY1D_NOISE_SD,
        "train_intervals": TOY1D_TRAIN_INTERVALS,
        "test_range": TOY1D_TEST_RANGE,
    }
    return _regression_dataset(
        "toy1d",
        x_train[:, None],
        y_train[:, None],
        x_test[:, None],
        y_test[:, None],
        feature_names=["x"],
        target_names=["y"],
        info=info,
    )


# --------------------------------------------------------------------------------------------
# CSV files
# --------------------------------------------------------------------------------------------


def load_csv(path: str | os.PathLike, target_column, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """Regression data from a CSV file with a header row; every other column is a feature.

    Args:
        path: CSV file (read with ``pandas.read_csv``); all used columns must be numeric.
        target_column: a column name, comma-separated names (``"y1,y2"``) or a list of names.
        test_fraction: share of rows in the test split.
        seed: seed of the random split.

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
    if isinstance(target_column, str):
        targets = [name.strip() for name in target_column.split(",") if name.strip()]
    else:
        targets = [str(name) for name in target_column]
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
    train_idx, test_idx = _random_split(len(values), test_fraction, seed)
    x, y = values[:, : len(features)], values[:, len(features) :]
    info = {"source": str(path), "seed": seed, "test_fraction": test_fraction}
    return _regression_dataset(
        path.stem,
        x[train_idx],
        y[train_idx],
        x[test_idx],
        y[test_idx],
        feature_names=features,
        target_names=targets,
        info=info,
    )


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------


def load_digits_dataset(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), stratified split.

    Pixel intensities (0..16) are scaled to [0, 1], then standardised with the training
    statistics (``x_loc`` / ``x_scale`` are in [0, 1] units; constant pixels keep scale 1).

    Returns:
        A classification :class:`Dataset`: x float32 ``[N, 64]``, y int64 ``[N]`` in 0..9.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=test_fraction, stratify=digits.target, random_state=seed
    )
    return _classification_dataset(
        "digits",
        x_train,
        y_train,
        x_test,
        y_test,
        num_classes=10,
        feature_names=[f"pixel_{r}_{c}" for r in range(8) for c in range(8)],
        target_names=[str(k) for k in range(10)],
        info={"source": "sklearn.datasets.load_digits (UCI optical digits)", "seed": seed},
    )


def make_moons_dataset(n: int = 500, noise: float = 0.2, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's two interleaving half-moons: ``n`` points in all, stratified split.

    Returns:
        A classification :class:`Dataset`: x float32 ``[N, 2]`` standardised, y int64 ``[N]`` in {0, 1}.
    """
    from sklearn.datasets import make_moons
    from sklearn.model_selection import train_test_split

    x, y = make_moons(n_samples=n, noise=noise, random_state=seed)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, stratify=y, random_state=seed
    )
    return _classification_dataset(
        "moons",
        x_train,
        y_train,
        x_test,
        y_test,
        num_classes=2,
        feature_names=["x1", "x2"],
        target_names=["0", "1"],
        info={"source": "sklearn.datasets.make_moons", "seed": seed, "noise": noise},
    )


# --------------------------------------------------------------------------------------------
# Euler angles under strain (seed 000)
# --------------------------------------------------------------------------------------------


def _euler_folder(folder) -> Path:
    if folder is None:
        folder = os.environ.get(EULER_DIR_ENV) or DEFAULT_EULER_DIR
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(
            f"Euler-angle folder {folder} does not exist. The data (IPF_Final_<k>.csv, k = 1..20 "
            "without 6) is not bundled because it has no licence; pass its folder as "
            f"load_euler(folder=...) or 'euler:PATH', or set {EULER_DIR_ENV}."
        )
    return folder


def _read_euler_step(folder: Path, step: int) -> pd.DataFrame:
    path = folder / f"IPF_Final_{step}.csv"
    if not path.is_file():
        raise DataError(
            f"missing Euler-angle file {path}; strain steps {list(EULER_INPUT_STEPS)} (inputs) and "
            f"{EULER_TARGET_STEP} (target) are needed."
        )
    frame = pd.read_csv(path)
    missing = [c for c in (*EULER_ANGLES, "X", "Y") if c not in frame.columns]
    if missing:
        raise DataError(f"{path} lacks columns {missing}; found {list(frame.columns)}.")
    check_finite_array(frame[list(EULER_ANGLES)].to_numpy(dtype=np.float64), str(path), list(EULER_ANGLES))
    return frame


def load_euler(folder=None, train_fraction: float = 0.8, seed: int = 0, max_pixels: int | None = None) -> Dataset:
    """Per-pixel Euler-angle sequences of a microstructure under increasing strain (seed 000).

    Reads ``IPF_Final_<k>.csv`` (columns Phase, Phi1, Phi, Phi2, KAM, Y, X; one row per pixel,
    the same pixels in the same order in every file) for strain steps ``k`` = 1..20; step 6 is
    absent from the original release and is not used. Angles are in degrees and are treated as
    plain real numbers (no wrapping at 360°).

    Args:
        folder: data folder; default ``$ZOO_EULER_DIR`` or ``<repo>/../shared/data/euler``.
        train_fraction: share of pixels in the training split (random per-pixel split).
        seed: seed of the pixel split (and of the pixel subset when ``max_pixels`` is set).
        max_pixels: if set, a random subset of this many pixels is used (for quick runs).

    Returns:
        A regression :class:`Dataset`: x ``[N, 18, 3]`` = (Phi1, Phi, Phi2) at steps 1..19
        except 6, standardised per angle with training statistics (``x_loc`` / ``x_scale`` of
        shape ``[1, 1, 3]``); y ``[N, 3]`` = the angles at step 20, standardised.
        ``info["xy_train"]`` / ``info["xy_test"]`` hold the pixels' (X, Y) as int64 ``[N, 2]``.
    """
    folder = _euler_folder(folder)
    frames = [_read_euler_step(folder, step) for step in (*EULER_INPUT_STEPS, EULER_TARGET_STEP)]
    xy = frames[0][["X", "Y"]].to_numpy()
    for step, frame in zip((*EULER_INPUT_STEPS, EULER_TARGET_STEP), frames):
        if len(frame) != len(xy) or not np.array_equal(frame[["X", "Y"]].to_numpy(), xy):
            raise DataError(
                f"{folder / f'IPF_Final_{step}.csv'} does not list the same pixels (X, Y, in the same "
                f"order, {len(xy)} rows) as IPF_Final_{EULER_INPUT_STEPS[0]}.csv; every step file "
                "must hold the same pixels."
            )
    angles = np.stack([frame[list(EULER_ANGLES)].to_numpy(dtype=np.float64) for frame in frames], axis=1)
    pixels = np.arange(len(xy))
    if max_pixels is not None:
        if max_pixels < 2:
            raise DataError(f"max_pixels must be at least 2, got {max_pixels}.")
        if max_pixels < len(pixels):
            pixels = np.sort(np.random.default_rng(seed).choice(len(pixels), max_pixels, replace=False))
    train_pos, test_pos = _random_split(len(pixels), 1.0 - train_fraction, seed)
    train_idx, test_idx = pixels[train_pos], pixels[test_pos]
    x, y = angles[:, :-1, :], angles[:, -1, :]
    info = {
        "source": str(folder),
        "seed": seed,
        "units": "degrees",
        "input_steps": list(EULER_INPUT_STEPS),
        "target_step": EULER_TARGET_STEP,
        "xy_train": torch.as_tensor(xy[train_idx], dtype=torch.int64),
        "xy_test": torch.as_tensor(xy[test_idx], dtype=torch.int64),
    }
    return _regression_dataset(
        "euler",
        x[train_idx],
        y[train_idx],
        x[test_idx],
        y[test_idx],
        feature_names=list(EULER_ANGLES),
        target_names=list(EULER_ANGLES),
        info=info,
    )


# --------------------------------------------------------------------------------------------
# Spec dispatch
# --------------------------------------------------------------------------------------------


def load_dataset(spec: str, split: int = 0, seed: int = 0, **kwargs) -> Dataset:
    """Load a dataset from a string spec (forms in :data:`DATASET_SPECS`).

    ``uci:NAME`` / ``uci:PATH`` use the fixed ``split``; every other spec draws its split (and
    any synthetic data) from ``seed`` and ignores ``split``. ``csv:PATH:TARGET`` splits on the
    last ``:``. Extra keyword arguments go to the loader, e.g. ``load_dataset("toy1d", n_train=20)``.
    """
    kind, _, rest = spec.partition(":")
    if kind == "uci" and rest:
        return load_uci(rest, split=split, **kwargs)
    if kind == "csv" and ":" in rest:
        path, target = rest.rsplit(":", 1)
        return load_csv(path, target, seed=seed, **kwargs)
    if kind == "euler":
        return load_euler(rest or None, seed=seed, **kwargs)
    if spec == "toy1d":
        return make_toy1d(seed=seed, **kwargs)
    if spec == "digits":
        return load_digits_dataset(seed=seed, **kwargs)
    if spec == "moons":
        return make_moons_dataset(seed=seed, **kwargs)
    forms = "; ".join(f"{form}: {text}" for form, text in DATASET_SPECS.items())
    raise DataError(
        f"unknown dataset spec {spec!r}. Valid forms: {forms}. Bundled UCI names: {', '.join(BUNDLED_UCI)}."
    )
