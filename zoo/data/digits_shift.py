"""Digits under distribution shift: rotated test images and held-out classes.

Two datasets built on scikit-learn's 8x8 digits and the stratified split of
:func:`zoo.data.sklearn_sets.digits_split` (the ``digits`` dataset's split for the same seed):

* :func:`load_rotated_digits` (``digits-rotated[:STEP]``) — trained on all ten classes; its
  :class:`~zoo.data.dataset.ShiftSet` s are the test images rotated by 0°, STEP, 2·STEP, … 180°
  (Ovadia et al. 2019's rotated-MNIST protocol: 15° steps from 0° to 180°) with bilinear
  interpolation (:func:`rotate_images`), each scored like the test set;
* :func:`load_digits_ood` (``digits-ood[:CLASSES]``) — trained on the digit classes CLASSES only
  (default 0–4); its test set is those classes' test images, and its one ``"ood"`` shift set the
  test images of the other classes, which the model has no label for (out of distribution).

Both standardise the pixels with **one** mean and sd over all training pixels (``per_feature=False``
of :func:`~zoo.data.dataset.classification_dataset`), not per pixel as ``digits`` does: a pixel that
is almost always blank in training has an sd near 0.002, so per-pixel standardisation would turn a
stroke rotated onto it into an input hundreds of sds out, a far harsher (and artificial) shift than
the paper's [0, 1]-scaled rotated images.  One scale keeps a rotated image an image.
"""

from __future__ import annotations

import math

import numpy as np

from zoo.data.checks import DataError
from zoo.data.dataset import Dataset, ShiftSet, classification_dataset
from zoo.data.sklearn_sets import DIGITS_FEATURE_NAMES, digits_split

__all__ = [
    "DEFAULT_IN_CLASSES",
    "MAX_ROTATION_DEGREES",
    "ROTATION_STEP_DEGREES",
    "load_digits_ood",
    "load_rotated_digits",
    "parse_classes",
    "parse_rotation_step",
    "rotate_images",
    "rotation_angles",
]

ROTATION_STEP_DEGREES = 15.0
"""Default step between rotation angles (Ovadia et al. 2019)."""
MAX_ROTATION_DEGREES = 180.0
"""Largest rotation angle; angles lie in [0, 180] degrees (Ovadia et al. 2019)."""
DEFAULT_IN_CLASSES = (0, 1, 2, 3, 4)
"""Digit classes a ``digits-ood`` model is trained on by default; 5-9 are held out."""

_IMAGE = (8, 8)


def rotate_images(images: np.ndarray, angle: float) -> np.ndarray:
    """Rotate images ``[N, H, W]`` by ``angle`` degrees counter-clockwise (as displayed, row 0 at the top).

    Bilinear interpolation about the image centre (``scipy.ndimage.rotate`` with ``order=1``, the
    output the input's size); a pixel whose source lies outside the image is 0 (blank).  Output
    pixel ``p`` takes the bilinear interpolate of the input at ``c + R(−θ)(p − c)``, ``c`` the centre
    ``((H−1)/2, (W−1)/2)``; a multiple of 90° maps the pixel grid onto itself, so 90° is
    ``np.rot90`` and 180° flips both axes exactly.
    """
    from scipy.ndimage import rotate

    images = np.asarray(images, dtype=np.float64)
    if images.ndim != 3:
        raise DataError(f"rotate_images needs images [N, H, W], got shape {images.shape}.")
    if not math.isfinite(float(angle)):
        raise DataError(f"rotation angle must be a finite number of degrees, got {angle!r}.")
    if float(angle) == 0.0:
        return images.copy()
    return rotate(images, float(angle), axes=(1, 2), reshape=False, order=1, mode="constant", cval=0.0)


def rotation_angles(step: float = ROTATION_STEP_DEGREES) -> tuple[float, ...]:
    """``0, step, 2·step, …`` up to :data:`MAX_ROTATION_DEGREES` (inclusive when a multiple of ``step``)."""
    step = parse_rotation_step(step)
    count = int(math.floor(MAX_ROTATION_DEGREES / step + 1e-9))
    return tuple(float(k * step) for k in range(count + 1))


def parse_rotation_step(step) -> float:
    """The step of ``digits-rotated:STEP`` as a float in (0, 180] degrees, or a :class:`DataError` naming it."""
    try:
        value = float(step)
    except (TypeError, ValueError):
        value = float("nan")
    if not (math.isfinite(value) and 0.0 < value <= MAX_ROTATION_DEGREES):
        raise DataError(f"digits-rotated:STEP takes the step between rotation angles in degrees, a number in "
                        f"(0, {MAX_ROTATION_DEGREES:g}], got {step!r}; e.g. digits-rotated:15 rotates the test images "
                        f"by 0, 15, ..., 180 degrees.")
    return value


def load_rotated_digits(step: float = ROTATION_STEP_DEGREES, seed: int = 0, test_fraction: float = 0.25,
                        angles=None) -> Dataset:
    """Digits trained as usual, tested also on rotated copies of the test images (Ovadia et al. 2019).

    Args:
        step: degrees between angles (default 15): the angles are :func:`rotation_angles` ``(step)``.
        seed: seed of the stratified split (the ``digits`` dataset's split for the same seed).
        test_fraction: share of the images in the test split.
        angles: explicit angles in degrees, each in [0, 180] (overrides ``step``).

    Returns:
        A classification :class:`Dataset` (x float32 ``[N, 64]``, one global standardisation, see the
        module) whose test set is the unrotated test images and whose ``shift_sets`` are one
        ``"rotation"`` :class:`~zoo.data.dataset.ShiftSet` per angle (``value`` = the angle), labels kept.
    """
    if angles is None:
        angles = rotation_angles(step)
    angles = tuple(float(a) for a in angles)
    bad = [a for a in angles if not (math.isfinite(a) and 0.0 <= a <= MAX_ROTATION_DEGREES)]
    if bad or not angles:
        raise DataError(f"rotation angles must be degrees in [0, {MAX_ROTATION_DEGREES:g}] (Ovadia et al. 2019's "
                        f"range), got {list(angles) if not bad else bad}; set digits-rotated:STEP or pass angles in range.")
    x_train, x_test, y_train, y_test = digits_split(test_fraction, seed)
    images = x_test.reshape(-1, *_IMAGE)
    shifts = [ShiftSet(f"rotation {a:g}°", "rotation", a, rotate_images(images, a).reshape(len(x_test), -1), y_test)
              for a in angles]
    info = {"source": "sklearn.datasets.load_digits (UCI optical digits)", "seed": seed,
            "protocol": "Ovadia et al. 2019: test images rotated by each angle, bilinear interpolation, blank fill",
            "angles_degrees": list(angles), "standardised": "global: one mean and sd over all training pixels"}
    return classification_dataset("digits-rotated", x_train, y_train, x_test, y_test, num_classes=10,
                                  feature_names=list(DIGITS_FEATURE_NAMES), target_names=[str(k) for k in range(10)],
                                  info=info, per_feature=False, shift_sets=shifts)


def parse_classes(text) -> tuple[int, ...]:
    """Digit classes from ``"0-4"``, ``"0,2,4,6,8"`` or a mix (``"0-2,7"``), or a sequence of ints; sorted.

    Raises :class:`DataError` naming ``digits-ood:CLASSES`` for a class outside 0-9, a repeat, fewer
    than two classes or all ten (then nothing is held out).
    """
    classes = []
    parts = str(text).split(",") if isinstance(text, str) else [str(c) for c in text]
    try:
        for part in (p.strip() for p in parts):
            low, dash, high = part.partition("-")
            classes += list(range(int(low), int(high) + 1)) if dash else [int(part)]
    except ValueError:
        raise DataError(f"digits-ood:CLASSES takes the trained digit classes as a range or a comma-separated list "
                        f"(e.g. digits-ood:0-4 or digits-ood:0,2,4,6,8), got {text!r}.") from None
    outside = [c for c in classes if not 0 <= c <= 9]
    if outside or len(set(classes)) != len(classes) or not 2 <= len(classes) <= 9:
        raise DataError(f"digits-ood:CLASSES must name between 2 and 9 distinct digit classes in 0-9 (the others are "
                        f"held out as out-of-distribution), got {text!r}"
                        + (f" (classes {outside} are not digits)" if outside else "") + ".")
    return tuple(sorted(classes))


def load_digits_ood(in_classes=DEFAULT_IN_CLASSES, seed: int = 0, test_fraction: float = 0.25) -> Dataset:
    """Digits of ``in_classes`` only for training and testing; the other classes' test images out of distribution.

    Args:
        in_classes: the trained digit classes (:func:`parse_classes` forms; default 0-4).
        seed: seed of the stratified split (the ``digits`` dataset's split for the same seed).
        test_fraction: share of the images in the test split.

    Returns:
        A classification :class:`Dataset` with ``len(in_classes)`` classes (labels renumbered 0..K−1 in
        the order of ``in_classes``; ``target_names`` are the digits) whose one ``"ood"``
        :class:`~zoo.data.dataset.ShiftSet` holds the test images of the held-out classes (no labels).
    """
    in_classes = parse_classes(in_classes)
    held_out = tuple(c for c in range(10) if c not in in_classes)
    x_train, x_test, y_train, y_test = digits_split(test_fraction, seed)
    relabel = np.full(10, -1)
    relabel[list(in_classes)] = np.arange(len(in_classes))
    keep_train, keep_test = relabel[y_train] >= 0, relabel[y_test] >= 0
    name = f"held-out classes {','.join(map(str, held_out))}"
    shifts = [ShiftSet(name, "ood", float("nan"), x_test[~keep_test], None)]
    info = {"source": "sklearn.datasets.load_digits (UCI optical digits)", "seed": seed,
            "protocol": "train on the in-distribution classes; their test images are the test set, the other "
                        "classes' test images the out-of-distribution set",
            "in_classes": list(in_classes), "held_out_classes": list(held_out),
            "standardised": "global: one mean and sd over all training pixels"}
    return classification_dataset("digits-ood", x_train[keep_train], relabel[y_train[keep_train]], x_test[keep_test],
                                  relabel[y_test[keep_test]], num_classes=len(in_classes),
                                  feature_names=list(DIGITS_FEATURE_NAMES), target_names=[str(c) for c in in_classes],
                                  info=info, per_feature=False, shift_sets=shifts)
