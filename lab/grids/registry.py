"""The one grid registry: :data:`EXPERIMENTS`, :func:`register_experiment`, :func:`get_experiment`.

An :class:`~lab.grids.experiment.Experiment` (a name, ``build(fast, data_root) -> [GridRun]`` and how its
tables summarise it) is registered once, by a :func:`register_experiment` call; ``python -m zoo experiment
NAME`` (:mod:`lab.grids.runner`) runs the registered grid of that name.  The built-in grids are
registered below, in the order ``experiment --help`` lists them; their builders live in
:mod:`lab.grids.papers`, :mod:`lab.grids.uci`, :mod:`lab.grids.shift`, :mod:`lab.grids.fidelity` and
:mod:`lab.grids.smoke`.  A new grid: ``docs/architecture.md`` ("A new grid").

Experiments (papers in ``docs/references.md``; published numbers in ``../shared/anchors.md``):

* ``euler-stochasticity`` — Bagga et al. 2025, Table 1 (MultiLSTM on Euler angles under strain);
* ``uci-benchmark`` — bundled UCI regression sets × 20 standard splits × backends × {all, last} × likelihoods;
* ``uci-nuts`` — the same splits with last-layer NUTS (optional: minutes per split on 2 cores);
* ``bdl-baselines`` — issue 13's baselines (MAP, deep ensembles, MC dropout, SWAG, MultiSWAG, Laplace)
  beside SVI, Radial and SGLD on the UCI protocol, and on digits with LeNet-300-100;
* ``paper-protocols`` — deep ensembles and MC dropout each under its own paper's protocol (issue 25) beside the
  published numbers with their ±, and the digits rows (MAP, Laplace);
* ``heteroscedastic-defaults`` — ``ensemble``, ``map`` and ``deep-ensemble`` with the heteroscedastic likelihood and
  their defaults on the UCI splits, beside the deep-ensemble paper's numbers (issue 39);
* ``structured-stochasticity`` — Rochussen 2024 (structured fixed-weight patterns vs vanilla MFVI);
* ``sparse-vd-lenet`` — the variational-MLP dissertation's Table 4.3 on digits (pruning of variational LeNet-300-100;
  Molchanov et al. 2017);
* ``radial-mc`` — Nazarovs et al. 2021 (Radial BNN with M MC-KL samples, confidence-set accuracy);
* ``shift-rotation``, ``shift-ood``, ``uci-gap`` — issue 37: every backend on rotated digits (Ovadia et al. 2019),
  held-out digit classes (AUROC of entropy and mutual information) and UCI gap splits (Foong et al. 2019);
* ``fidelity`` — every backend against the reference posteriors of :mod:`lab.references` (issue 37);
* ``smoke`` (hidden) — a seconds-long grid for tests; ``smoke-24`` (hidden) — the same on 8 seeds
  (``benchmarks/kill_resume.py``).
"""
from __future__ import annotations

from .experiment import Experiment
from .fidelity import FIDELITY_METRICS, fidelity_grid
from .papers import euler_grid, radial_grid, sparse_vd_grid, structured_grid
from .shift import gap_grid, gap_tables, ood_grid, ood_tables, rotation_grid, rotation_tables
from .smoke import smoke_24_grid, smoke_grid
from .uci import (bdl_grid, heteroscedastic_defaults_grid, heteroscedastic_published, paper_protocols_grid,
                  paper_published, uci_grid, uci_nuts_grid, uci_published)

__all__ = ["EXPERIMENTS", "register_experiment", "get_experiment"]

EXPERIMENTS: dict[str, Experiment] = {}
"""Registered grids by name (:func:`register_experiment`), in registration order."""


def register_experiment(entry: Experiment, replace: bool = False) -> Experiment:
    """Add ``entry`` (it carries its own ``name``) to :data:`EXPERIMENTS`; ``ValueError`` if the name is
    taken (unless ``replace``).  Returns ``entry``."""
    if entry.name in EXPERIMENTS and not replace:
        raise ValueError(f"experiment {entry.name!r} is already registered")
    EXPERIMENTS[entry.name] = entry
    return entry


def get_experiment(name: str) -> Experiment:
    """The registered experiment ``name``; ``ValueError`` listing the valid (not hidden) ones."""
    if name not in EXPERIMENTS:
        names = [n for n, e in EXPERIMENTS.items() if not e.hidden]
        raise ValueError(f"unknown experiment {name!r}; valid experiments: {', '.join(names)}")
    return EXPERIMENTS[name]


register_experiment(Experiment("euler-stochasticity", "Bagga et al. 2025, Table 1: MultiLSTM on Euler angles, levels of stochasticity",
    euler_grid, ("formulation", "variant"),
    ("rmse_plain", "rmse_circular", "test_ll", "test_ll_circular", "coverage_90", "rhat_max",
    "fit_seconds", "pretrain_seconds")))
register_experiment(Experiment("uci-benchmark", "UCI regression, standard splits, backends × {all, last} × likelihoods", uci_grid,
    ("dataset", "backend", "stochastic", "likelihood"),
    ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=uci_published))
register_experiment(Experiment("uci-nuts", "UCI regression, standard splits, last-layer NUTS on a MAP body (optional, slow)",
    uci_nuts_grid, ("dataset", "backend", "stochastic", "likelihood"),
    ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=uci_published))
register_experiment(Experiment("bdl-baselines", "MAP, ensembles, MC dropout, (Multi)SWAG, Laplace, SVI, Radial, SGLD on the "
    "UCI protocol and digits", bdl_grid, ("dataset", "method"),
    ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "fit_seconds"),
    published=uci_published))
register_experiment(Experiment("paper-protocols", "each method under its own paper's protocol (deep ensembles: Lakshminarayanan "
    "et al. 2017; MC dropout: Gal & Ghahramani 2016's validation grid search) on the UCI splits, and "
    "digits", paper_protocols_grid, ("dataset", "method"),
    ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "fit_seconds"),
    published=paper_published))
register_experiment(Experiment("heteroscedastic-defaults", "ensemble, map and deep-ensemble with the heteroscedastic likelihood "
    "and their defaults on the UCI splits, beside the deep-ensemble paper (issue 39)",
    heteroscedastic_defaults_grid, ("dataset", "method"),
    ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=heteroscedastic_published))
register_experiment(Experiment("structured-stochasticity", "Rochussen 2024: structured fixed-weight patterns vs vanilla MFVI",
    structured_grid, ("init_sd", "variant"), ("rmse_std", "test_ll", "coverage_90", "num_random", "fit_seconds")))
register_experiment(Experiment("sparse-vd-lenet", "Molchanov et al. 2017 sparse VD (dissertation Table 4.3) on digits: pruning variational LeNet-300-100", sparse_vd_grid,
    ("family", "prune"), ("accuracy", "nll", "sparsity", "fit_seconds")))
register_experiment(Experiment("radial-mc", "Nazarovs et al. 2021: Radial BNN accuracy / NLL vs M MC-KL samples on digits", radial_grid,
    ("M",), ("accuracy", "nll", "ece", "acc_0.9", "kept_0.9", "fit_seconds")))
register_experiment(Experiment("shift-rotation", "Ovadia et al. 2019: every backend on digits rotated 0-180 degrees (accuracy, "
    "NLL, ECE, Brier against the angle)", rotation_grid, ("method",),
    ("accuracy", "nll", "ece", "rot45_accuracy", "rot90_accuracy", "rot90_nll", "rot90_ece",
    "rot180_accuracy", "fit_seconds"), tables=rotation_tables))
register_experiment(Experiment("shift-ood", "every backend trained on digits 0-4: AUROC of predictive entropy and mutual information "
    "for the held-out classes 5-9", ood_grid, ("method",),
    ("accuracy", "nll", "ood_auroc_entropy", "ood_auroc_mi", "fit_seconds"), tables=ood_tables))
register_experiment(Experiment("uci-gap", "Foong et al. 2019: every backend on the UCI gap splits (middle third of one input held "
    "out) beside standard splits", gap_grid, ("dataset", "splits", "method"),
    ("rmse", "test_ll", "coverage_90", "fit_seconds"), tables=gap_tables))
register_experiment(Experiment("fidelity", "every backend against the reference posteriors (python -m zoo reference build NAME "
    "first): distance, noise floor, CPU seconds", fidelity_grid,
    ("problem", "stochastic", "backend", "setting"), FIDELITY_METRICS))
register_experiment(Experiment("smoke", "seconds-long grid for tests", smoke_grid, ("variant",), ("rmse", "test_ll", "coverage_90"),
    hidden=True))
register_experiment(Experiment("smoke-24", "the smoke grid on 8 seeds (24 runs): the kill-and-resume campaign",
    smoke_24_grid, ("variant",),
    ("rmse", "test_ll", "coverage_90"), hidden=True))
