"""Generated regression sets in the UCI split layout, of the shapes the ensembles' variance was checked on (issue 39).

Two sets, each a seeded function of its seed (nothing is downloaded; the files are written, not committed):

* ``robot-arm`` — the shape of UCI kin8nm (Corke 1996, the DELVE "kin" family): 8 192 rows, 8 inputs, low
  noise.  The inputs are the joint angles θ_1..θ_8 ~ U(−π/4, π/4) of a planar arm of 8 revolute links
  (lengths ``ARM_LINKS``); the target is the distance of the end effector
  (Σ_i l_i cos φ_i, Σ_i l_i sin φ_i), φ_i = θ_1 + … + θ_i, from the point ``ARM_TARGET``, plus Gaussian
  noise of sd ``ARM_NOISE`` (about a fifth of the target's sd: the noise is a few per cent of its variance);
* ``small-tabular`` — the shape of UCI Boston housing: 506 rows, 13 inputs (correlated Gaussian and
  log-normal columns, a binary and a count column), a smooth nonlinear mean of a few of them and Gaussian
  noise whose sd varies threefold with two inputs (heteroscedastic, as real small tables are).

``n_splits`` seeded random 90/10 splits (``index_train_<k>.txt`` / ``index_test_<k>.txt``), ``n_hidden.txt``
50 and ``n_epochs.txt`` 40, as the bundled sets: ``python -m zoo fit --data uci:DIR ...`` reads them.

    python benchmarks/uci_like_sets.py robot-arm /tmp/39/robot-arm --splits 20
    python benchmarks/uci_like_sets.py small-tabular /tmp/39/small-tabular --splits 20
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

__all__ = ["robot_arm_table", "small_tabular_table", "write_uci_layout", "SETS", "ARM_LINKS", "ARM_TARGET",
           "ARM_NOISE"]

#: link lengths of the 8-link planar arm (the target's units)
ARM_LINKS = np.array([0.18, 0.15, 0.13, 0.1, 0.08, 0.06, 0.05, 0.04])
#: the point whose distance from the end effector is the target
ARM_TARGET = np.array([0.5, 0.3])
#: sd of the Gaussian noise added to the distance
ARM_NOISE = 0.05


def robot_arm_table(n_rows: int = 8192, seed: int = 0) -> np.ndarray:
    """``[n_rows, 9]`` float64: the 8 joint angles, then the noisy distance (see the module docstring)."""
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-np.pi / 4, np.pi / 4, size=(n_rows, ARM_LINKS.size))
    phi = np.cumsum(theta, axis=1)
    end = np.stack([(ARM_LINKS * np.cos(phi)).sum(1), (ARM_LINKS * np.sin(phi)).sum(1)], axis=1)
    distance = np.linalg.norm(end - ARM_TARGET, axis=1)
    y = distance + ARM_NOISE * rng.normal(size=n_rows)
    return np.concatenate([theta, y[:, None]], axis=1)


def small_tabular_table(n_rows: int = 506, seed: int = 0) -> np.ndarray:
    """``[n_rows, 14]`` float64: 13 input columns, then the target (see the module docstring)."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(8, 8)) / np.sqrt(8)
    gauss = rng.normal(size=(n_rows, 8)) @ (0.6 * np.eye(8) + 0.4 * mixing)  # correlated columns
    skewed = rng.lognormal(0.0, 0.8, size=(n_rows, 3))
    binary = (rng.uniform(size=n_rows) < 0.1).astype(float)
    count = rng.poisson(4.0, n_rows).astype(float)
    x = np.column_stack([gauss, skewed, binary, count])
    mean = (22.0 + 4.0 * np.tanh(gauss[:, 0]) - 3.0 * np.log(skewed[:, 0]) + 2.5 * gauss[:, 1] * gauss[:, 2]
            + 3.0 * binary + 0.6 * count - 1.5 * np.sin(2.0 * gauss[:, 3]))
    scale = 1.6 * np.exp(0.35 * np.tanh(gauss[:, 4]) + 0.35 * np.tanh(np.log(skewed[:, 1])))
    y = mean + scale * rng.normal(size=n_rows)
    return np.concatenate([x, y[:, None]], axis=1)


#: set name -> (table maker, rows)
SETS = {"robot-arm": (robot_arm_table, 8192), "small-tabular": (small_tabular_table, 506)}


def write_uci_layout(folder, table: np.ndarray, n_splits: int = 3, seed: int = 0, test_fraction: float = 0.1) -> Path:
    """Write ``table`` ``[rows, D + 1]`` (the last column the target) as a UCI-layout folder; returns it.

    Split ``k`` holds out a seeded random ``test_fraction`` of the rows (NumPy ``default_rng([seed, k])``)."""
    n_rows = table.shape[0]
    if n_rows < 20 or n_splits < 1 or not 0 < test_fraction < 1:
        raise ValueError(f"need at least 20 rows, n_splits >= 1 and test_fraction in (0, 1); got {n_rows}, "
                         f"{n_splits}, {test_fraction}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    features = table.shape[1] - 1
    np.savetxt(folder / "data.txt", table, fmt="%.8g")
    np.savetxt(folder / "index_features.txt", np.arange(features), fmt="%d")
    np.savetxt(folder / "index_target.txt", [features], fmt="%d")
    for name, value in (("n_splits", n_splits), ("n_hidden", 50), ("n_epochs", 40)):
        (folder / f"{name}.txt").write_text(f"{value}\n")
    n_test = max(1, int(round(test_fraction * n_rows)))
    for k in range(n_splits):
        order = np.random.default_rng([seed, k]).permutation(n_rows)
        np.savetxt(folder / f"index_test_{k}.txt", np.sort(order[:n_test]), fmt="%d")
        np.savetxt(folder / f"index_train_{k}.txt", np.sort(order[n_test:]), fmt="%d")
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", choices=sorted(SETS))
    parser.add_argument("folder", help="folder to write (UCI split layout)")
    parser.add_argument("--rows", type=int, default=None, help="rows (default: the set's UCI size)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--splits", type=int, default=3)
    args = parser.parse_args(argv)
    make, rows = SETS[args.set]
    print(write_uci_layout(args.folder, make(args.rows or rows, args.seed), args.splits, args.seed))


if __name__ == "__main__":
    main()
