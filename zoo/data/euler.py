"""Per-pixel Euler-angle sequences of a microstructure under increasing strain, and their increments.

The data is that of Bagga, Singh, Lalwani & Senthil 2025 (CS772 project report): one
``IPF_Final_<k>.csv`` per strain step ``k`` = 1..20 (step 6 absent from the release). It has no
stated licence and is not bundled; :func:`load_euler` reads it from a folder you name.
:func:`load_euler` gives their task (angles at step 20 from steps 1..19);
:func:`euler_increments` the same task without the 0°/360° wrap-around.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from zoo.data.checks import DataError
from zoo.data.dataset import Dataset, random_split, regression_dataset
from zoo.data.files import CsvTable, read_csv_table

__all__ = [
    "DEFAULT_EULER_DIR",
    "EULER_ANGLES",
    "EULER_DIR_ENV",
    "EULER_INPUT_STEPS",
    "EULER_PERIODS",
    "EULER_TARGET_STEP",
    "euler_increments",
    "load_euler",
    "wrap_degrees",
]

DEFAULT_EULER_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "euler"
"""Default Euler-angle folder (``<repo>/../shared/data/euler``); override with ``ZOO_EULER_DIR``."""

EULER_DIR_ENV = "ZOO_EULER_DIR"
"""Environment variable naming the Euler-angle folder."""
EULER_ANGLES = ("Phi1", "Phi", "Phi2")
"""The three Bunge Euler angles of each pixel (degrees), the columns read from every file."""
EULER_INPUT_STEPS = tuple(k for k in range(1, 20) if k != 6)
"""Strain steps used as the input sequence: 1..19 without 6 (absent from the original release)."""
EULER_TARGET_STEP = 20
"""Strain step whose angles are the regression target."""
EULER_PERIODS = (360.0, None, 360.0)
"""Periods of (Phi1, Phi, Phi2) in degrees: Phi1 and Phi2 are angles on the full circle; Phi lies in
[0°, 180°] (Bunge convention) and is scored on the real line."""


def _euler_folder(folder) -> Path:
    if folder is None:
        folder = os.environ.get(EULER_DIR_ENV) or DEFAULT_EULER_DIR
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise DataError(
            f"Euler-angle folder {folder} is a file, not a folder; give the folder that holds "
            "IPF_Final_<k>.csv (k = 1..20 without 6), as load_euler(folder=...) or 'euler:PATH'."
        )
    if not folder.is_dir():
        raise DataError(
            f"Euler-angle folder {folder} does not exist. The data (IPF_Final_<k>.csv, k = 1..20 "
            "without 6) is not bundled because it has no licence; pass its folder as "
            f"load_euler(folder=...) or 'euler:PATH', or set {EULER_DIR_ENV}."
        )
    return folder


def _read_euler_step(folder: Path, step: int) -> tuple[CsvTable, np.ndarray]:
    """One step file, read and checked, and its angles, float64 ``[N, 3]`` (degrees)."""
    path = folder / f"IPF_Final_{step}.csv"
    if not path.exists():
        raise DataError(
            f"missing Euler-angle file {path}; strain steps {list(EULER_INPUT_STEPS)} (inputs) and "
            f"{EULER_TARGET_STEP} (target) are needed."
        )
    table = read_csv_table(path, "Euler-angle file")
    missing = [c for c in (*EULER_ANGLES, "X", "Y") if c not in table.columns]
    if missing:
        raise DataError(f"{path} lacks columns {missing}; found {table.columns}.")
    return table, table.numeric(list(EULER_ANGLES))


def _check_same_pixels(table: CsvTable, xy: np.ndarray) -> None:
    """Raise unless ``table`` lists the pixels ``xy`` ``[N, 2]`` (X, Y) in the same order."""
    other = table.frame[["X", "Y"]].to_numpy()
    if len(other) == len(xy) and np.array_equal(other, xy):
        return
    if len(other) != len(xy):
        where = f"it has {len(other)} data rows"
    else:
        row = int(np.flatnonzero(np.any(other != xy, axis=1))[0])
        where = (
            f"line {table.lines([row])[0]} has (X, Y) = {tuple(other[row].tolist())}, not "
            f"{tuple(xy[row].tolist())} ({table.lines.note})"
        )
    raise DataError(
        f"{table.path} does not list the same pixels (X, Y, in the same order, {len(xy)} rows) as "
        f"IPF_Final_{EULER_INPUT_STEPS[0]}.csv: {where}; every step file must hold the same pixels."
    )


def load_euler(folder=None, train_fraction: float = 0.8, seed: int = 0, max_pixels: int | None = None) -> Dataset:
    """Per-pixel Euler-angle sequences of a microstructure under increasing strain.

    Reads ``IPF_Final_<k>.csv`` (columns Phase, Phi1, Phi, Phi2, KAM, Y, X; one row per pixel,
    the same pixels in the same order in every file) for strain steps ``k`` = 1..20; step 6 is
    absent from the original release and is not used. Angles are in degrees and are modelled as
    plain real numbers (no wrapping at 360°), as Bagga et al. 2025 did; the dataset marks Phi1 and
    Phi2 as periodic (``target_period``), so evaluations also score them on the circle.

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

    Each file is checked before any split (:func:`zoo.data.files.read_csv_table`): a missing,
    empty or repeated column, an angle that is not a number, missing, NaN/inf or beyond float32's
    range, or pixels that differ from step 1's raise :class:`DataError` naming the file line
    (1-based, the header is line 1) and the column.
    """
    folder = _euler_folder(folder)
    read = [_read_euler_step(folder, step) for step in (*EULER_INPUT_STEPS, EULER_TARGET_STEP)]
    xy = read[0][0].frame[["X", "Y"]].to_numpy()
    for table, _ in read:
        _check_same_pixels(table, xy)
    angles = np.stack([step_angles for _, step_angles in read], axis=1)
    pixels = np.arange(len(xy))
    if max_pixels is not None:
        if max_pixels < 2:
            raise DataError(f"max_pixels must be at least 2, got {max_pixels}.")
        if max_pixels < len(pixels):
            pixels = np.sort(np.random.default_rng(seed).choice(len(pixels), max_pixels, replace=False))
    train_pos, test_pos = random_split(len(pixels), 1.0 - train_fraction, seed)
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
    return regression_dataset(
        "euler",
        x[train_idx],
        y[train_idx],
        x[test_idx],
        y[test_idx],
        feature_names=list(EULER_ANGLES),
        target_names=list(EULER_ANGLES),
        info=info,
        target_period=list(EULER_PERIODS),
    )


def wrap_degrees(d):
    """Angle differences mapped into [-180, 180) degrees (tensors or arrays, any shape)."""
    return (d + 180.0) % 360.0 - 180.0


def euler_increments(data: Dataset) -> Dataset:
    """The Euler task of :func:`load_euler` without the 0°/360° wrap-around artefact.

    As plain numbers, a pixel whose Phi1 or Phi2 crosses 0°/360° between steps has an error of
    about 360° that dominates any RMSE. Here every pixel's sequence is unwrapped (``np.unwrap``,
    period 360°), the inputs are the per-step changes ``[N, 17, 3]`` (degrees) and the target is
    the change from step 19 to 20, ``wrap(y − x_19)`` in [-180°, 180°) ``[N, 3]``, both
    standardised with training statistics like every loader. The predicted angle is ``x_19 + Δ``,
    so RMSE / log-likelihood / coverage of ``Δ`` are those of the angle under the circular
    distance. ``info`` keeps the raw last input angles and raw targets of the test pixels
    (``last_test``, ``target_test``: float64 ``[N_test, 3]``, degrees).

    Args:
        data: a dataset returned by :func:`load_euler`.
    """
    def convert(x, y):
        x = np.unwrap(data.x_to_original(x).double().numpy(), period=360.0, axis=1)
        y = data.y_to_original(y).double().numpy()
        return np.diff(x, axis=1), wrap_degrees(y - x[:, -1, :]), x[:, -1, :] % 360.0, y

    x_tr, y_tr, _, _ = convert(data.x_train, data.y_train)
    x_te, y_te, last, target = convert(data.x_test, data.y_test)
    info = {**data.info, "euler_target": "increments", "last_test": last, "target_test": target}
    names = [f"d{angle}" for angle in EULER_ANGLES]
    return regression_dataset("euler-increments", x_tr, y_tr, x_te, y_te, feature_names=names, target_names=names,
                               info=info, target_period=list(EULER_PERIODS))
