"""Datasets for the zoo: bundled UCI regression, CSV files, toys, scikit-learn digits and Euler angles.

One module per source: :mod:`~zoo.data.uci` (the 20-split layout of Hernández-Lobato & Adams
2015), :mod:`~zoo.data.tabular` (CSV), :mod:`~zoo.data.toys` (the 1-D toy of Blundell et al.
2015, two moons), :mod:`~zoo.data.sklearn_sets` (digits), :mod:`~zoo.data.digits_shift` (digits under
shift: rotated test images, held-out classes) and :mod:`~zoo.data.euler` (Euler angles under strain
and their increments); :func:`~zoo.data.uci.load_uci_gap` makes Foong et al. 2019's gap splits. :mod:`~zoo.data.dataset` holds the :class:`Dataset`
every loader returns and the one standardiser; :mod:`~zoo.data.checks` the input validation;
:mod:`~zoo.data.files` the checked reading of CSV and number files; :mod:`~zoo.data.registry`
the string specs of :func:`load_dataset`.

Inputs and regression targets are stored *standardised* with statistics of the training split
only (``(v - loc) / scale``; the scale of a constant column is 1). ``Dataset.y_to_original`` /
``x_to_original`` map back to original units.

Shapes (N rows, D features, T time steps, F features per step, O regression outputs):

- tabular inputs ``x``: float32 ``[N, D]``; sequence inputs: float32 ``[N, T, F]``;
- regression targets ``y``: float32 ``[N, O]`` (2-D even when O == 1);
- classification targets ``y``: int64 ``[N]`` with labels ``0 .. num_classes - 1``.

Every bad-input path raises :class:`DataError` (a ``ValueError``) saying what was wrong and what
to do. Files are checked before they are split or standardised, and their errors name the file,
its 1-based line and the column.
"""

from zoo.data.checks import DataError, check_finite_array, check_xy
from zoo.data.dataset import (
    SHIFT_KINDS,
    TASKS,
    Dataset,
    ShiftSet,
    classification_dataset,
    random_split,
    regression_dataset,
    standardiser,
)
from zoo.data.digits_shift import (
    DEFAULT_IN_CLASSES,
    ROTATION_STEP_DEGREES,
    load_digits_ood,
    load_rotated_digits,
    rotate_images,
    rotation_angles,
)
from zoo.data.euler import (
    DEFAULT_EULER_DIR,
    EULER_ANGLES,
    EULER_DIR_ENV,
    EULER_INPUT_STEPS,
    EULER_TARGET_STEP,
    euler_increments,
    load_euler,
    wrap_degrees,
)
from zoo.data.registry import DATASET_SPECS, load_dataset
from zoo.data.sklearn_sets import load_digits_dataset
from zoo.data.tabular import load_csv
from zoo.data.toys import (
    TOY1D_NOISE_SD,
    TOY1D_TEST_RANGE,
    TOY1D_TRAIN_INTERVALS,
    make_moons_dataset,
    make_toy1d,
    toy1d_curve,
)
from zoo.data.uci import (
    BUNDLED_UCI,
    STANDARDISE_ON,
    UCI_DATA_DIR,
    gap_split,
    load_uci,
    load_uci_full_random_split,
    load_uci_gap,
)

__all__ = [
    "BUNDLED_UCI",
    "DATASET_SPECS",
    "DEFAULT_IN_CLASSES",
    "DEFAULT_EULER_DIR",
    "DataError",
    "Dataset",
    "ROTATION_STEP_DEGREES",
    "SHIFT_KINDS",
    "ShiftSet",
    "EULER_ANGLES",
    "EULER_DIR_ENV",
    "EULER_INPUT_STEPS",
    "EULER_TARGET_STEP",
    "STANDARDISE_ON",
    "TASKS",
    "TOY1D_NOISE_SD",
    "TOY1D_TEST_RANGE",
    "TOY1D_TRAIN_INTERVALS",
    "UCI_DATA_DIR",
    "check_finite_array",
    "check_xy",
    "classification_dataset",
    "euler_increments",
    "gap_split",
    "load_csv",
    "load_dataset",
    "load_digits_dataset",
    "load_digits_ood",
    "load_euler",
    "load_uci",
    "load_uci_full_random_split",
    "load_uci_gap",
    "load_rotated_digits",
    "make_moons_dataset",
    "make_toy1d",
    "random_split",
    "regression_dataset",
    "rotate_images",
    "rotation_angles",
    "standardiser",
    "toy1d_curve",
    "wrap_degrees",
]
