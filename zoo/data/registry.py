"""String specs for datasets: :data:`DATASET_SPECS` and :func:`load_dataset`."""

from __future__ import annotations

from zoo.data.checks import DataError
from zoo.data.dataset import Dataset
from zoo.data.digits_shift import load_digits_ood, load_rotated_digits
from zoo.data.euler import EULER_DIR_ENV, euler_increments, load_euler
from zoo.data.sklearn_sets import load_digits_dataset
from zoo.data.tabular import load_csv
from zoo.data.toys import make_moons_dataset, make_toy1d
from zoo.data.uci import BUNDLED_UCI, load_uci, load_uci_gap

__all__ = ["DATASET_SPECS", "load_dataset"]

DATASET_SPECS = {
    "uci:NAME": "bundled UCI regression set with 20 fixed splits; NAME in " + ", ".join(BUNDLED_UCI),
    "uci:PATH": "UCI-layout folder (data.txt, index_features.txt, index_target.txt, index_*_<k>.txt)",
    "uci-gap:NAME|PATH": "Foong et al. 2019's gap split of a UCI set: --split K holds out the middle third of the "
                         "rows sorted by input feature K (0-based; one split per input)",
    "toy1d": "1-D regression toy of Blundell et al. 2015: 40 training points with a gap in x",
    "csv:PATH:TARGET": "CSV regression; TARGET is a column name or comma-separated names; 80/20 split",
    "digits": "scikit-learn 8x8 digits, 10 classes, stratified 75/25 split",
    "moons": "scikit-learn two-moons binary classification, 80/20 split",
    "digits-rotated[:STEP]": "digits, also scored on the test images rotated by 0, STEP, ..., 180 degrees (default 15; "
                             "Ovadia et al. 2019); one pixel scale",
    "digits-ood[:CLASSES]": "digits of CLASSES only (default 0-4, e.g. 0,2,4,6,8); the other classes' test images "
                            "scored as out of distribution; one pixel scale",
    "euler[:PATH]": f"Euler-angle sequences under strain, not bundled; PATH or ${EULER_DIR_ENV}",
    "euler-increments[:PATH]": "the Euler task without the 0/360 degree wrap-around: per-step angle changes in, "
                               "the step-20 change out (the formulation whose Student-t last layer meets the "
                               "coverage goal)",
}
"""Spec forms accepted by :func:`load_dataset`, each with a one-line description (for ``--help``)."""


def load_dataset(spec: str, split: int = 0, seed: int = 0, **kwargs) -> Dataset:
    """Load a dataset from a string spec (forms in :data:`DATASET_SPECS`).

    ``uci:NAME`` / ``uci:PATH`` use the fixed ``split`` and ``uci-gap:NAME`` the gap split of input
    feature ``split``; every other spec draws its split (and any synthetic data) from ``seed`` and
    ignores ``split``. ``csv:PATH:TARGET`` splits on the
    last ``:``. Extra keyword arguments go to the loader, e.g. ``load_dataset("toy1d", n_train=20)``.
    """
    kind, _, rest = spec.partition(":")
    if kind == "uci" and rest:
        return load_uci(rest, split=split, **kwargs)
    if kind == "uci-gap" and rest:
        return load_uci_gap(rest, split=split, **kwargs)
    if kind == "digits-rotated":
        return load_rotated_digits(rest or 15.0, seed=seed, **kwargs)
    if kind == "digits-ood":
        return load_digits_ood(rest or (0, 1, 2, 3, 4), seed=seed, **kwargs)
    if kind == "csv" and ":" in rest:
        path, target = rest.rsplit(":", 1)
        return load_csv(path, target, seed=seed, **kwargs)
    if kind == "euler":
        return load_euler(rest or None, seed=seed, **kwargs)
    if kind == "euler-increments":
        return euler_increments(load_euler(rest or None, seed=seed, **kwargs))
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
