"""A generated regression set in the UCI split layout that breaks naive heteroscedastic nets (issue 29).

The set mimics the large UCI regression tables the project had never seen (e.g. protein
structure: about 45 000 rows, 9 features, a skewed target in a bounded range):

* 9 features: two log-normal "areas" (σ = 1.2, the second the first times log-normal noise), a
  log-normal "distance" (σ = 1.5): heavy right tails, test points up to ~70 training sds out;
  two Beta(2, 5) fractions, three standard normals and a Poisson(8) count;
* target ``y = clip(g(x) + s(x) · ε, 0, 21)``: a mean ``g`` that saturates in the logs of the
  heavy-tailed features, a noise scale ``s(x)`` that varies about 20-fold with the inputs
  (heteroscedastic) and Gamma(1.5)-distributed, centred ``ε`` (right-skewed); the clip bounds
  the target to [0, 21];
* ``n_splits`` seeded random 90/10 splits (``index_train_<k>.txt`` / ``index_test_<k>.txt``).

Write the full-size set (40 000 rows) with ``python benchmarks/heteroscedastic_uci.py DIR`` and fit it with
``python -m zoo fit --data uci:DIR ...``; tests call :func:`write_heteroscedastic_uci` at small size.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

__all__ = ["heteroscedastic_table", "write_heteroscedastic_uci", "FULL_ROWS", "TARGET_RANGE"]

#: rows of the full-size set (tens of thousands, like UCI protein's 45 730)
FULL_ROWS = 40000

#: the target's bounds (original units)
TARGET_RANGE = (0.0, 21.0)

_FEATURES = 9


def heteroscedastic_table(n_rows: int, seed: int = 0) -> np.ndarray:
    """``[n_rows, 10]`` float64: 9 feature columns, then the target (see the module docstring)."""
    rng = np.random.default_rng(seed)
    area = rng.lognormal(0.0, 1.2, n_rows)
    mass = area * rng.lognormal(0.0, 0.5, n_rows)
    distance = rng.lognormal(0.0, 1.5, n_rows)
    fractions = rng.beta(2.0, 5.0, size=(n_rows, 2))
    gauss = rng.normal(size=(n_rows, 3))
    counts = rng.poisson(8.0, n_rows).astype(float)
    x = np.column_stack([area, mass, fractions, gauss[:, :2], distance, counts, gauss[:, 2]])
    log_area, log_distance = np.log(area), np.log(distance)
    mean = (7.0 + 3.0 * np.tanh(0.8 * (log_area - log_distance)) + 6.0 * fractions[:, 0]
            + 1.5 * np.sin(2.0 * gauss[:, 0]) + 0.1 * counts)
    scale = 0.6 * np.exp(np.tanh(log_distance + gauss[:, 1]) + 2.0 * fractions[:, 1])
    noise = rng.gamma(1.5, 1.0, size=n_rows) - 1.5  # mean 0, sd 1.22, right-skewed
    y = np.clip(mean + scale * noise, *TARGET_RANGE)
    return np.concatenate([x, y[:, None]], axis=1)


def write_heteroscedastic_uci(folder, n_rows: int = FULL_ROWS, seed: int = 0, n_splits: int = 1,
                              test_fraction: float = 0.1) -> Path:
    """Write the set as a UCI-layout folder (``data.txt``, index files, ``columns.txt``); returns it.

    ``uci:FOLDER`` then loads it (:func:`zoo.data.uci.load_uci`).  Split ``k`` holds out a seeded
    random ``test_fraction`` of the rows.
    """
    if n_rows < 20 or n_splits < 1 or not 0 < test_fraction < 1:
        raise ValueError(f"need n_rows >= 20, n_splits >= 1 and test_fraction in (0, 1); got {n_rows}, "
                         f"{n_splits}, {test_fraction}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = heteroscedastic_table(n_rows, seed)
    np.savetxt(folder / "data.txt", table, fmt="%.6g")
    np.savetxt(folder / "index_features.txt", np.arange(_FEATURES), fmt="%d")
    np.savetxt(folder / "index_target.txt", [_FEATURES], fmt="%d")
    (folder / "columns.txt").write_text(" ".join([f"x{i}" for i in range(_FEATURES)] + ["y"]) + "\n")
    (folder / "n_splits.txt").write_text(f"{n_splits}\n")
    n_test = max(1, int(round(test_fraction * n_rows)))
    for k in range(n_splits):
        order = np.random.default_rng([seed, k]).permutation(n_rows)
        np.savetxt(folder / f"index_test_{k}.txt", np.sort(order[:n_test]), fmt="%d")
        np.savetxt(folder / f"index_train_{k}.txt", np.sort(order[n_test:]), fmt="%d")
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="folder to write (UCI split layout)")
    parser.add_argument("--rows", type=int, default=FULL_ROWS, help=f"rows (default {FULL_ROWS})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--splits", type=int, default=1)
    args = parser.parse_args(argv)
    print(write_heteroscedastic_uci(args.folder, args.rows, args.seed, args.splits))


if __name__ == "__main__":
    main()
