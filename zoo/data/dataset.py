"""The :class:`Dataset` every loader returns, the one standardiser, and the seeded random split.

A dataset stores inputs and regression targets *standardised* with statistics of the training
split only: ``(v - loc) / scale`` with the mean and the standard deviation (ddof 0) as ``loc`` and
``scale``, and scale 1 for a constant column (:func:`standardiser`). :func:`regression_dataset`
and :func:`classification_dataset` build a :class:`Dataset` from raw NumPy arrays that way.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from zoo.data.checks import DataError, check_targets_vary, check_xy

__all__ = [
    "TASKS",
    "SHIFT_KINDS",
    "Dataset",
    "ShiftSet",
    "classification_dataset",
    "random_split",
    "regression_dataset",
    "standardiser",
]

TASKS = ("regression", "classification")
"""Values of :attr:`Dataset.task`."""

SHIFT_KINDS = ("rotation", "ood")
"""Values of :attr:`ShiftSet.kind`: a labelled shift of the test inputs (scored like the test set, per
intensity) or out-of-distribution inputs without a label among the model's classes (scored against the
in-distribution test set)."""


@dataclass(frozen=True)
class ShiftSet:
    """Test inputs under one condition of a distribution shift, standardised like the dataset's ``x_test``.

    Attributes:
        name: the condition, e.g. ``"rotation 45°"`` or ``"held-out classes 5-9"``.
        kind: one of :data:`SHIFT_KINDS`.
        value: the shift's intensity in its own units (``"rotation"``: the angle in degrees); NaN for ``"ood"``.
        x: float32 ``[M, D]``, in the network's (standardised) input units.
        y: int64 labels ``[M]`` in the dataset's classes (``"rotation"``), or ``None`` (``"ood"``: no label applies).
    """

    name: str
    kind: str
    value: float
    x: torch.Tensor
    y: Optional[torch.Tensor] = None


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
        target_period: regression: per output, its period in original units when it is an angle on a
            circle (e.g. ``360.0`` for an angle in degrees), else ``None``; ``None`` for all outputs
            when the whole field is ``None``.  Evaluations score periodic outputs on the circle too
            (``test_ll_circular``, :func:`inference.evaluation.circular.circular_log_predictive_density`).
        shift_sets: :class:`ShiftSet` s evaluated beside the test set (rotated test images, held-out
            classes; :mod:`zoo.data.digits_shift`), empty for an ordinary dataset.
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
    target_period: list | None = None
    shift_sets: tuple = ()

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise DataError(f"task must be one of {TASKS}, got {self.task!r}.")
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
        self._check_target_period()
        for shift in self.shift_sets:
            self._check_shift_set(shift)

    def _check_target_period(self) -> None:
        if self.target_period is None:
            return
        if self.task != "regression":
            raise DataError(f"{self.name}: target_period is for regression outputs; a classification has none.")
        periods = list(self.target_period)
        if len(periods) != self.y_train.shape[1]:
            raise DataError(f"{self.name}: target_period has {len(periods)} entries for {self.y_train.shape[1]} "
                            f"outputs; give one per output (None for an output on the real line).")
        for name, period in zip(self.target_names or range(len(periods)), periods):
            if period is not None and not (isinstance(period, (int, float)) and 0 < float(period) < float("inf")):
                raise DataError(f"{self.name}: the period of output {name} must be a positive number or None, "
                                f"got {period!r}.")

    def _check_shift_set(self, shift) -> None:
        if not isinstance(shift, ShiftSet) or shift.kind not in SHIFT_KINDS:
            raise DataError(f"{self.name}: shift_sets must hold ShiftSets of a kind in {SHIFT_KINDS}, got {shift!r:.80}.")
        if tuple(shift.x.shape[1:]) != tuple(self.x_test.shape[1:]):
            raise DataError(f"{self.name}: shift set {shift.name!r} has inputs {tuple(shift.x.shape)}; they must be "
                            f"shaped like the test inputs {tuple(self.x_test.shape)} but for the first dimension.")
        if (shift.y is None) != (shift.kind == "ood"):
            raise DataError(f"{self.name}: shift set {shift.name!r} of kind {shift.kind!r} must "
                            f"{'not ' if shift.kind == 'ood' else ''}have labels.")
        if shift.y is not None and (self.task != "classification" or shift.y.shape != shift.x.shape[:1]
                                    or shift.y.dtype != torch.int64 or shift.y.min() < 0
                                    or shift.y.max() >= self.num_classes):
            raise DataError(f"{self.name}: shift set {shift.name!r} needs int64 labels [M] in 0..{self.output_dim - 1} "
                            "of a classification dataset.")

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

    def fingerprint(self) -> str:
        """SHA-256 of what a fit conditions on and predicts in: the training inputs and targets as the network
        sees them (float32; labels int64) and the targets' units ``y_loc``, ``y_scale``.  Two runs with the
        same fingerprint saw the same training data."""
        sha = hashlib.sha256()
        for tensor in (self.x_train.float(), self.y_train, self.y_loc.float(), self.y_scale.float()):
            array = np.ascontiguousarray(tensor.detach().cpu().numpy())
            sha.update(f"{array.dtype.str}{array.shape}".encode())
            sha.update(array.tobytes())
        return sha.hexdigest()

    def summary(self) -> dict:
        """Short description for reports: name, task, sizes, dimensions and split (and the shift sets' names
        and sizes, where there are any)."""
        summary = {
            "name": self.name,
            "task": self.task,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "split": self.split,
        }
        if self.shift_sets:
            summary["shift_sets"] = {shift.name: int(shift.x.shape[0]) for shift in self.shift_sets}
        return summary


def standardiser(fit_on: np.ndarray, axes) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (ddof 0) of ``fit_on`` over ``axes``; the scale of a constant column is 1.

    The only standardisation of :mod:`zoo.data`: every loader and transform calls it.
    """
    loc = fit_on.mean(axis=axes)
    scale = fit_on.std(axis=axes)
    scale[fit_on.max(axis=axes) == fit_on.min(axis=axes)] = 1.0
    return loc, scale


def _float32(arr: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(arr, dtype=np.float32))


def random_split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test row indices of a seeded random split of ``n`` rows.

    ``round(n * test_fraction)`` rows go to the test split, chosen by a NumPy ``default_rng(seed)``
    permutation.
    """
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


def regression_dataset(
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
    target_period: list | None = None,
) -> Dataset:
    """A regression :class:`Dataset` from raw float arrays, standardised with :func:`standardiser`.

    ``x`` is ``[N, D]`` (statistics per column, loc/scale ``[D]``) or ``[N, T, F]`` (statistics
    per feature over rows and steps, loc/scale ``[1, 1, F]``); ``y`` is ``[N, O]``. The
    statistics are those of ``fit_x`` / ``fit_y``, by default the training split; a target
    column constant over ``fit_y`` raises :class:`DataError` (there would be nothing to learn).
    ``target_period`` marks outputs that are angles on a circle (:attr:`Dataset.target_period`).
    """
    fit_x = x_train if fit_x is None else fit_x
    fit_y = y_train if fit_y is None else fit_y
    check_targets_vary(fit_y, name, target_names, "training rows" if fit_y is y_train else "rows")
    x_loc, x_scale = standardiser(fit_x, 0 if x_train.ndim == 2 else (0, 1))
    if x_train.ndim == 3:
        x_loc, x_scale = x_loc.reshape(1, 1, -1), x_scale.reshape(1, 1, -1)
    y_loc, y_scale = standardiser(fit_y, 0)
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
        target_period=target_period,
    )


def classification_dataset(
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
    per_feature: bool = True,
    shift_sets: tuple = (),
) -> Dataset:
    """A classification :class:`Dataset`: ``[N, D]`` inputs standardised with training statistics,
    labels ``[N]`` in ``0 .. num_classes - 1`` stored as int64.

    ``per_feature=False`` standardises with one mean and sd over every training value (``x_loc`` /
    ``x_scale`` are still ``[D]``, all entries equal), which keeps the features' relative scale: the
    choice for images whose pixels may move (:mod:`zoo.data.digits_shift`).  ``shift_sets`` are
    :class:`ShiftSet` s whose ``x`` are raw arrays in ``x_train``'s units (labels as arrays or ``None``);
    they are standardised here with the training statistics, like ``x_test``.
    """
    if per_feature:
        x_loc, x_scale = standardiser(x_train, 0)
    else:
        loc, scale = standardiser(np.asarray(x_train).reshape(-1, 1), 0)
        x_loc, x_scale = np.full(x_train.shape[1], loc[0]), np.full(x_train.shape[1], scale[0])
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
        shift_sets=tuple(
            dataclasses.replace(shift, x=_float32((shift.x - x_loc) / x_scale),
                                y=None if shift.y is None else torch.as_tensor(shift.y, dtype=torch.int64))
            for shift in shift_sets
        ),
    )
