"""scikit-learn's 8x8 handwritten digits as a classification :class:`Dataset`."""

from __future__ import annotations

from zoo.data.dataset import Dataset, classification_dataset

__all__ = ["load_digits_dataset"]


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
    return classification_dataset(
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
