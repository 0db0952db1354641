"""Synthetic toys: the 1-D regression signal of Blundell et al. 2015 with a gap, and two moons."""

from __future__ import annotations

import math

import numpy as np

from zoo.data.checks import DataError
from zoo.data.dataset import Dataset, classification_dataset, regression_dataset

__all__ = ["TOY1D_NOISE_SD", "TOY1D_TEST_RANGE", "TOY1D_TRAIN_INTERVALS", "make_moons_dataset", "make_toy1d",
           "toy1d_curve"]

TOY1D_TRAIN_INTERVALS = ((-0.1, 0.2), (0.55, 0.85))
"""The two x-intervals the 1-D toy's training points are drawn from; (0.2, 0.55) is the gap."""
TOY1D_TEST_RANGE = (-0.5, 1.2)
"""The x-range of the 1-D toy's dense test grid (covers the gap and both outer regions)."""
TOY1D_NOISE_SD = 0.02
"""Standard deviation of the toy's noise ε (Blundell et al. 2015)."""


def toy1d_curve(x: np.ndarray, noise: np.ndarray | float = 0.0) -> np.ndarray:
    """The signal of Blundell et al. 2015, ``x + 0.3 sin(2π(x+ε)) + 0.3 sin(4π(x+ε)) + ε``.

    ``x`` and ``noise`` (ε; 0 for the noiseless curve) broadcast; the result has their shape.
    """
    shifted = x + noise
    return x + 0.3 * np.sin(2 * math.pi * shifted) + 0.3 * np.sin(4 * math.pi * shifted) + noise


def make_toy1d(
    n_train: int = 40, n_test: int = 500, seed: int = 0, test_range: tuple[float, float] = TOY1D_TEST_RANGE
) -> Dataset:
    """The 1-D regression toy of Blundell et al. 2015, with a gap in the training inputs.

    ``y = x + 0.3 sin(2π(x+ε)) + 0.3 sin(4π(x+ε)) + ε`` with ``ε ~ N(0, 0.02²)`` drawn per point.
    Training x: half of the points (rounded down) uniform in ``[-0.1, 0.2]``, the rest uniform in
    ``[0.55, 0.85]`` (:data:`TOY1D_TRAIN_INTERVALS`), leaving the gap ``(0.2, 0.55)`` empty.
    Test x: ``n_test`` evenly spaced points on ``test_range`` (default ``[-0.5, 1.2]``,
    :data:`TOY1D_TEST_RANGE`, covering the gap and both outer regions), with noisy targets drawn
    the same way.  A narrower range such as ``(-0.3, 1.0)`` keeps the test points less than half a
    period of the fast sine (0.25 in x) from the data, where a posterior's coverage measures in-between
    and near extrapolation rather than how far the prior's functions happen to reach.

    Returns:
        A regression :class:`Dataset` with x ``[N, 1]`` and y ``[N, 1]``, standardised with the
        training statistics (``x_to_original`` recovers x on the scale above).
    """
    if n_train < 2 or n_test < 1:
        raise DataError(f"make_toy1d needs n_train >= 2 and n_test >= 1, got {n_train} and {n_test}.")
    try:
        low, high = (float(v) for v in test_range)
    except (TypeError, ValueError):
        raise DataError(
            f"make_toy1d test_range must be a pair (low, high) of numbers, got {test_range!r}."
        ) from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise DataError(f"make_toy1d test_range must be finite with low < high, got {test_range!r}.")
    rng = np.random.default_rng(seed)
    (low_a, high_a), (low_b, high_b) = TOY1D_TRAIN_INTERVALS
    n_first = n_train // 2
    x_train = np.concatenate(
        [rng.uniform(low_a, high_a, n_first), rng.uniform(low_b, high_b, n_train - n_first)]
    )
    x_test = np.linspace(low, high, n_test)
    y_train = toy1d_curve(x_train, rng.normal(0.0, TOY1D_NOISE_SD, n_train))
    y_test = toy1d_curve(x_test, rng.normal(0.0, TOY1D_NOISE_SD, n_test))
    info = {
        "source": "synthetic (Blundell et al. 2015 signal)",
        "seed": seed,
        "noise_sd": TOY1D_NOISE_SD,
        "train_intervals": TOY1D_TRAIN_INTERVALS,
        "test_range": (low, high),
    }
    return regression_dataset(
        "toy1d",
        x_train[:, None],
        y_train[:, None],
        x_test[:, None],
        y_test[:, None],
        feature_names=["x"],
        target_names=["y"],
        info=info,
    )


def make_moons_dataset(n: int = 500, noise: float = 0.2, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's two interleaving half-moons: ``n`` points in all, stratified split.

    ``noise`` is the standard deviation of the Gaussian noise ``make_moons`` adds to the points.

    Returns:
        A classification :class:`Dataset`: x float32 ``[N, 2]`` standardised, y int64 ``[N]`` in {0, 1}.
    """
    from sklearn.datasets import make_moons
    from sklearn.model_selection import train_test_split

    x, y = make_moons(n_samples=n, noise=noise, random_state=seed)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, stratify=y, random_state=seed
    )
    return classification_dataset(
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
