"""The named experiment grids of ``python -m zoo experiment NAME`` (run by :mod:`lab.grids.runner`).

A grid is a list of :class:`lab.grids.experiment.GridRun` s (a spec, its labels, optionally a dataset
builder and a prerequisite run).  Backends that are not registered in
:data:`inference.backends.BACKENDS` are left out with a note.

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
* ``sparse-vd-lenet`` — the variational-MLP dissertation's Table 4.3 on digits (pruning of variational LeNet-300-100; Molchanov et al. 2017);
* ``radial-mc`` — Nazarovs et al. 2021 (Radial BNN with M MC-KL samples, confidence-set accuracy);
* ``shift-rotation``, ``shift-ood``, ``uci-gap`` — issue 37: every backend on rotated digits (Ovadia et al. 2019),
  held-out digit classes (AUROC of entropy and mutual information) and UCI gap splits (Foong et al. 2019),
  built in :mod:`lab.grids.shift`;
* ``fidelity`` — every backend against the reference posteriors of :mod:`lab.references.build` (issue 37;
  built in :mod:`lab.grids.fidelity`);
* ``smoke`` (hidden) — a seconds-long grid for tests; ``smoke-24`` (hidden) — the same on 8 seeds
  (``benchmarks/kill_resume.py``).

The grids of the UCI protocol (``uci-benchmark``, ``uci-nuts``, ``bdl-baselines``, ``paper-protocols``,
``heteroscedastic-defaults``) are
built in :mod:`lab.grids.uci`.
"""
from __future__ import annotations

from pathlib import Path

from inference.variational.pruning import PRUNE_MODES
from lab.runs.spec import RunSpec

from .fidelity import FIDELITY_METRICS, fidelity_grid
from .experiment import Experiment, GridRun, available_backends, run_key
from .shift import gap_grid, gap_tables, ood_grid, ood_tables, rotation_grid, rotation_tables
from .uci import (bdl_grid, heteroscedastic_defaults_grid, heteroscedastic_published, paper_protocols_grid,
                        paper_published, uci_grid, uci_nuts_grid, uci_published)

__all__ = ["EXPERIMENTS"]


# --------------------------------------------------------------------------------------------
# The grids
# --------------------------------------------------------------------------------------------


#: Bagga et al. 2025 variants: label -> (backend, stochastic, on the frozen pretrained body, backend options).
#: NUTS trees are capped at 2^8 - 1 leapfrog steps: on the angles task the head's posterior (heavy-tailed
#: wrap-around residuals) drove NUTS to depth 9 at step 0.002, 721 s per run against ~60 s on the increments.
EULER_VARIANTS = {
    "deterministic": ("svi", "none", False, {}),
    "last-layer SVI": ("svi", "all", True, {"epochs": 60, "batch_size": 256}),
    "full SVI": ("svi", "all", False, {"num_samples": 30}),
    "last-layer SGLD": ("sgld", "all", True, {"num_chains": 2, "num_samples": 100, "thin": 30, "warmup_steps": 3000,
                                              "batch_size": 256, "step_decay": 0.0, "time_budget": None}),
    "last-layer NUTS": ("nuts", "all", True, {"num_chains": 2, "warmup_steps": 200, "num_samples": 200,
                                              "map_steps": 2000, "max_tree_depth": 8, "time_budget": None}),
    "last-layer Radial": ("radial", "all", True, {"epochs": 60, "batch_size": 256}),
}
#: Adam learning rate of the deterministic MultiLSTM, and of full SVI's pretraining of the same net
EULER_DETERMINISTIC_LR = 3e-3
#: issue 14: the SVI variants again with a likelihood that can follow heavy-tailed / input-dependent residuals
EULER_LIKELIHOOD_VARIANTS = {f"{variant} · {likelihood}": (variant, likelihood)
                             for likelihood in ("heteroscedastic", "studentt")
                             for variant in ("last-layer SVI", "full SVI")}


def _euler(fast: bool, data_root) -> list:
    """Bagga et al. 2025, Table 1, on the Euler data: the raw angle task and the wrap-free increments task.

    The deterministic MultiLSTM is trained first; the last-layer variants infer a linear head on
    its frozen body's features; full SVI pretrains the same net deterministically (the same epochs
    and learning rate) and runs mean-field VI on all weights with Bagga et al. 2025's prior
    Normal(pretrained, 0.5).
    """
    seeds, pixels, epochs, vi_epochs = ((0,), 2500, 8, 3) if fast else ((0, 1), None, 15, 5)
    data = f"euler:{data_root}" if data_root else "euler"
    options = {"max_pixels": pixels} if pixels else {}
    backends = set(available_backends(sorted({v[0] for v in EULER_VARIANTS.values()})))
    runs = []
    for formulation, dataset in (("angles (as published)", None), ("increments (unwrapped)", "euler-increments")):
        for seed in seeds:
            labels = {"formulation": formulation, "seed": seed}
            det_key = run_key(dataset or "angles", "deterministic", seed)
            lstm = dict(data=data, model="multilstm", seed=seed, batch_size=256, data_options=options)
            variants = [(v, v, None) for v in EULER_VARIANTS] + [(label, v, likelihood) for label, (v, likelihood)
                                                                       in EULER_LIKELIHOOD_VARIANTS.items()]
            for label, variant, likelihood in variants:
                backend, stochastic, frozen, backend_options = EULER_VARIANTS[variant]
                if backend not in backends:
                    continue
                key = run_key(dataset or "angles", variant, likelihood or "", seed)
                generic = {k: v for k, v in backend_options.items() if k in ("epochs", "batch_size", "num_samples")}
                specific = {k: v for k, v in backend_options.items() if k not in generic}
                if variant == "deterministic":
                    spec = RunSpec(stochastic="none", epochs=epochs, lr=EULER_DETERMINISTIC_LR, **lstm)
                elif not frozen:  # full SVI: the deterministic training as pretraining, then VI around it (Bagga
                    # et al. 2025's prior) at lr 1e-3
                    spec = RunSpec(stochastic="all", epochs=vi_epochs, pretrain_epochs=epochs, prior="pretrained",
                                   lr=1e-3, likelihood=likelihood, **generic, **lstm,
                                   backend_options={"pretrain_lr": EULER_DETERMINISTIC_LR})
                else:  # a linear head (2 outputs per target for the heteroscedastic one) on the frozen body's
                    # features: whitened, except under a log-variance head (lab.grids.experiment.frozen_features)
                    spec = RunSpec(data=data, model="mlp", hidden=[], stochastic="all", backend=backend, seed=seed,
                                   likelihood=likelihood, backend_options=specific, **generic)
                features = "frozen-states" if likelihood == "heteroscedastic" else "frozen-features"
                runs.append(GridRun(key, spec, {**labels, "variant": label}, extras=("euler",),
                                    dataset=features if frozen else dataset, after=det_key if frozen else None))
    return runs


STRUCTURED_VARIANTS = ["all"] + [f"structured:{p}" for p in
                                 ("light-zero", "light-const", "light-map", "heavy-zero", "heavy-const", "heavy-map",
                                  "random-zero", "random-const", "random-map")]


def _structured(fast: bool, data_root) -> list:
    """Rochussen 2024: UCI energy, one 80/20 split (seed 0), x and y standardised on all rows, [D, 50, 50, O] MLP,
    fixed likelihood sd 0.1 (standardised units), mean-field VI from a random init (no pretraining), with the
    guide's initial sd at the zoo default (1e-3) and at Pyro's AutoNormal default (0.1)."""
    data = f"uci:{Path(data_root) / 'energy'}" if data_root else "uci:energy"
    seeds, epochs = ((0, 1), 200) if fast else ((0, 1, 2), 400)
    options = {"test_fraction": 0.2, "split_seed": 0, "standardise_on": "all"}
    runs = []
    for init_scale in (1e-3, 0.1):
        for stochastic in STRUCTURED_VARIANTS:
            variant = "vanilla MFVI" if stochastic == "all" else stochastic.split(":")[1]
            for seed in seeds:
                spec = RunSpec(data=data, model="mlp", hidden=[50, 50], stochastic=stochastic, seed=seed, noise=0.1,
                               epochs=epochs, pretrain_epochs=0, data_options=options,
                               backend_options={"init_scale": init_scale})
                labels = {"init_sd": init_scale, "variant": variant, "seed": seed}
                runs.append(GridRun(run_key(f"init{init_scale:g}", variant, seed), spec, labels,
                                    dataset="uci-random", extras=("rmse_std",)))
    return runs


#: variational families with prunable weight sites (Graves 2011-style dense, mean field with the local
#: reparameterisation trick, sparse / Kingma variational dropout, Radial) and the post-hoc pruning modes
VARIATIONAL_FAMILIES = ("graves", "svi-lrt", "sparse-vd", "kingma-vd", "radial")


def _sparse_vd(fast: bool, data_root) -> list:
    families = available_backends(VARIATIONAL_FAMILIES)
    seeds, epochs = ((0,), 20) if fast else ((0, 1, 2), 200)
    runs = []
    for family in families:
        for prune in PRUNE_MODES:
            for seed in seeds:
                spec = RunSpec(data="digits", model="lenet300100", stochastic="all", backend=family, seed=seed,
                               epochs=epochs, batch_size=128, prune=prune)
                labels = {"family": family, "prune": prune, "seed": seed}
                runs.append(GridRun(run_key(family, prune, seed), spec, labels))
    return runs


def _radial(fast: bool, data_root) -> list:
    if not available_backends(["radial"]):
        return []
    seeds, epochs = ((0,), 20) if fast else ((0, 1, 2), 200)
    return [GridRun(run_key("M", m, seed), RunSpec(data="digits", model="lenet300100", stochastic="all",
                                                   backend="radial", seed=seed, epochs=epochs, batch_size=128,
                                                   backend_options={"mc_kl_samples": m}),
                    {"M": m, "seed": seed}, extras=("confidence",))
            for m in (1, 10, 100) for seed in seeds]


def _smoke(fast: bool, data_root, seeds=(0, 1)) -> list:
    """Seconds-long grid for tests: a deterministic MLP, full SVI and last-layer SVI on its frozen body."""
    common = dict(data="toy1d", model="mlp", hidden=[8], epochs=3, num_samples=20)
    runs = []
    for seed in seeds:
        det = GridRun(run_key("det", seed), RunSpec(stochastic="none", seed=seed, **common),
                      {"variant": "det", "seed": seed})
        full = GridRun(run_key("full", seed), RunSpec(stochastic="all", seed=seed, **common),
                       {"variant": "full", "seed": seed})
        head = GridRun(run_key("head", seed), RunSpec(data="toy1d", model="mlp", hidden=[], stochastic="all",
                                                      seed=seed, epochs=3, num_samples=20),
                       {"variant": "frozen head", "seed": seed}, dataset="frozen-features", after=det.key)
        runs += [det, full, head]
    return runs


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment("euler-stochasticity", "Bagga et al. 2025, Table 1: MultiLSTM on Euler angles, levels of stochasticity",
                   _euler, ("formulation", "variant"),
                   ("rmse_plain", "rmse_circular", "test_ll", "test_ll_circular", "coverage_90", "rhat_max",
                    "fit_seconds", "pretrain_seconds")),
        Experiment("uci-benchmark", "UCI regression, standard splits, backends × {all, last} × likelihoods", uci_grid,
                   ("dataset", "backend", "stochastic", "likelihood"),
                   ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=uci_published),
        Experiment("uci-nuts", "UCI regression, standard splits, last-layer NUTS on a MAP body (optional, slow)",
                   uci_nuts_grid, ("dataset", "backend", "stochastic", "likelihood"),
                   ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=uci_published),
        Experiment("bdl-baselines", "MAP, ensembles, MC dropout, (Multi)SWAG, Laplace, SVI, Radial, SGLD on the "
                   "UCI protocol and digits", bdl_grid, ("dataset", "method"),
                   ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "fit_seconds"),
                   published=uci_published),
        Experiment("paper-protocols", "each method under its own paper's protocol (deep ensembles: Lakshminarayanan "
                   "et al. 2017; MC dropout: Gal & Ghahramani 2016's validation grid search) on the UCI splits, and "
                   "digits", paper_protocols_grid, ("dataset", "method"),
                   ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "fit_seconds"),
                   published=paper_published),
        Experiment("heteroscedastic-defaults", "ensemble, map and deep-ensemble with the heteroscedastic likelihood "
                   "and their defaults on the UCI splits, beside the deep-ensemble paper (issue 39)",
                   heteroscedastic_defaults_grid, ("dataset", "method"),
                   ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=heteroscedastic_published),
        Experiment("structured-stochasticity", "Rochussen 2024: structured fixed-weight patterns vs vanilla MFVI",
                   _structured, ("init_sd", "variant"), ("rmse_std", "test_ll", "coverage_90", "num_random", "fit_seconds")),
        Experiment("sparse-vd-lenet", "Molchanov et al. 2017 sparse VD (dissertation Table 4.3) on digits: pruning variational LeNet-300-100", _sparse_vd,
                   ("family", "prune"), ("accuracy", "nll", "sparsity", "fit_seconds")),
        Experiment("radial-mc", "Nazarovs et al. 2021: Radial BNN accuracy / NLL vs M MC-KL samples on digits", _radial,
                   ("M",), ("accuracy", "nll", "ece", "acc_0.9", "kept_0.9", "fit_seconds")),
        Experiment("shift-rotation", "Ovadia et al. 2019: every backend on digits rotated 0-180 degrees (accuracy, "
                   "NLL, ECE, Brier against the angle)", rotation_grid, ("method",),
                   ("accuracy", "nll", "ece", "rot45_accuracy", "rot90_accuracy", "rot90_nll", "rot90_ece",
                    "rot180_accuracy", "fit_seconds"), tables=rotation_tables),
        Experiment("shift-ood", "every backend trained on digits 0-4: AUROC of predictive entropy and mutual information "
                   "for the held-out classes 5-9", ood_grid, ("method",),
                   ("accuracy", "nll", "ood_auroc_entropy", "ood_auroc_mi", "fit_seconds"), tables=ood_tables),
        Experiment("uci-gap", "Foong et al. 2019: every backend on the UCI gap splits (middle third of one input held "
                   "out) beside standard splits", gap_grid, ("dataset", "splits", "method"),
                   ("rmse", "test_ll", "coverage_90", "fit_seconds"), tables=gap_tables),
        Experiment("fidelity", "every backend against the reference posteriors (python -m zoo reference build NAME "
                   "first): distance, noise floor, CPU seconds", fidelity_grid,
                   ("problem", "stochastic", "backend", "setting"), FIDELITY_METRICS),
        Experiment("smoke", "seconds-long grid for tests", _smoke, ("variant",), ("rmse", "test_ll", "coverage_90"),
                   hidden=True),
        Experiment("smoke-24", "the smoke grid on 8 seeds (24 runs): the kill-and-resume campaign",
                   lambda fast, data_root: _smoke(fast, data_root, seeds=range(8)), ("variant",),
                   ("rmse", "test_ll", "coverage_90"), hidden=True),
    )
}
"""Named grids of ``python -m zoo experiment NAME``."""
