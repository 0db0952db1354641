"""scikit-learn's 8x8 handwritten digits as a classification :class:`Dataset`."""

from __future__ import annotations

import numpy as np

from zoo.data.dataset import Dataset, classification_dataset

__all__ = ["load_digits_dataset", "digits_split", "DIGITS_FEATURE_NAMES"]

DIGITS_FEATURE_NAMES = [f"pixel_{r}_{c}" for r in range(8) for c in range(8)]
"""Names of the 64 inputs, row-major over the 8x8 image."""


def digits_split(test_fraction: float = 0.25, seed: int = 0) -> tuple[np.ndarray, ...]:
    """The stratified train/test split of scikit-learn's digits that :func:`load_digits_dataset` uses.

    Returns ``(x_train, x_test, y_train, y_test)``: pixel intensities scaled to [0, 1], float64
    ``[N, 64]`` (row-major 8x8 images), and labels int ``[N]`` in 0..9.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    return tuple(train_test_split(digits.data / 16.0, digits.target, test_size=test_fraction,
                                  stratify=digits.target, random_state=seed))


def load_digits_dataset(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), stratified split.

    Pixel intensities (0..16) are scaled to [0, 1], then standardised with the training
    statistics (``x_loc`` / ``x_scale`` are in [0, 1] units; constant pixels keep scale 1).

    Returns:
        A classification :class:`Dataset`: x float32 ``[N, 64]``, y int64 ``[N]`` in 0..9.
    """
    x_train, x_test, y_train, y_test = digits_split(test_fraction, seed)
    return classification_dataset(
        "digits",
        x_train,
        y_train,
        x_test,
        y_test,
        num_classes=10,
        feature_names=list(DIGITS_FEATURE_NAMES),
        target_names=[str(k) for k in range(10)],
        info={"source": "sklearn.datasets.load_digits (UCI optical digits)", "seed": seed},
    )
