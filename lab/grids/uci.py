"""The grids of the UCI regression protocol (the standard splits of Hernández-Lobato & Adams 2015):
``uci-benchmark``, ``uci-nuts``, ``bdl-baselines`` and ``paper-protocols`` (registered in :mod:`lab.grids.registry`).

Identical specs get identical run keys in every one of these grids (:func:`uci_run`), so grids that
share runs fit them once (``--runs DIR``).  Published numbers: :data:`PUBLISHED_UCI` (Gal &
Ghahramani 2016; Lakshminarayanan et al. 2017) and :data:`PAPER_PUBLISHED` (with their ±).
"""
from __future__ import annotations

from pathlib import Path

from inference.backends import get_backend
from lab.runs.spec import RunSpec
from zoo.data import BUNDLED_UCI, load_uci

from .experiment import GridRun, available_backends, run_key

__all__ = ["uci_grid", "uci_nuts_grid", "bdl_grid", "paper_protocols_grid", "uci_published", "paper_published",
           "heteroscedastic_defaults_grid", "heteroscedastic_published", "HETEROSCEDASTIC_DEFAULTS",
           "uci_cells", "uci_run", "uci_names", "bdl_options", "UCI_BACKENDS", "UCI_NUTS",
           "UCI_LIKELIHOODS", "UCI_STEPS", "UCI_BATCH", "PUBLISHED_UCI", "BDL_METHODS", "BDL_SWAG_EPOCHS",
           "BDL_DIGITS_EPOCHS", "PAPER_PUBLISHED", "PAPER_DIGITS", "DEEP_ENSEMBLE_PAPER"]


def uci_names(data_root) -> list:
    if data_root is None:
        return [f"uci:{name}" for name in BUNDLED_UCI]
    folders = sorted(p for p in Path(data_root).iterdir() if (p / "data.txt").is_file())
    if not folders:
        raise ValueError(f"--data-root {data_root} holds no UCI-layout dataset folder (a folder with data.txt, "
                         "index_features.txt, index_target.txt, index_train_<k>.txt, ...)")
    return [f"uci:{p}" for p in folders]


#: uci-benchmark backends, their options, and the stochastic selections.  SGLD takes its default step size, set
#: per fit from the curvature at the start (inference.sgmcmc.step_sizes: stationary variance at most 1.1× the
#: target's along the stiffest direction) — the rule a user gets, for every likelihood
UCI_BACKENDS = {
    "svi": ({}, ("all", "last")),
    "radial": ({}, ("all", "last")),
    "sgld": ({"num_chains": 2, "num_samples": 100, "thin": 10, "warmup_steps": 1000, "time_budget": None},
             ("all", "last")),
}
#: the optional last-layer NUTS grid ``uci-nuts`` (the whole network takes minutes per split on 2 cores)
UCI_NUTS = {"num_chains": 2, "warmup_steps": 200, "num_samples": 200, "map_steps": 5000, "time_budget": None}
#: uci-benchmark's likelihood axis (:data:`zoo.likelihoods.LIKELIHOODS` names)
UCI_LIKELIHOODS = ("gaussian", "heteroscedastic", "studentt")
UCI_STEPS, UCI_BATCH = 2000, 128  # optimisation steps and minibatch of the variational backends and MAP fits


def uci_cells(fast: bool, data_root) -> list:
    """``(split, data, name, epochs)`` of every UCI dataset and split, split-major (an interrupted
    sweep leaves every configuration with about the same number of splits); ``epochs`` give
    about :data:`UCI_STEPS` minibatch steps of size :data:`UCI_BATCH`."""
    cells = []
    for data in uci_names(data_root):
        first = load_uci(data[4:], split=0)
        epochs = -(-UCI_STEPS // -(-first.n_train // UCI_BATCH))  # ceil(steps / steps per epoch)
        cells += [(split, data, Path(data[4:]).name, epochs)
                  for split in range(min(first.info["n_splits"], 3 if fast else 20))]
    return sorted(cells, key=lambda cell: cell[0])


def uci_run(split, data, name, epochs, backend, stochastic, options, likelihood="gaussian") -> GridRun:
    """One UCI run of the shared protocol; identical specs get identical keys in every UCI grid."""
    variational = get_backend(backend).budget == "elbo"  # the variational loop: epochs of minibatches
    spec = RunSpec(data=data, model="mlp", hidden=[50], stochastic=stochastic, backend=backend, split=split,
                   likelihood=likelihood, backend_options=dict(options), epochs=epochs if variational else None,
                   batch_size=UCI_BATCH if variational else None)
    labels = {"dataset": name, "backend": backend, "stochastic": stochastic, "likelihood": likelihood,
              "split": split}
    return GridRun(run_key(name, backend, stochastic, likelihood, split), spec, labels)


def uci_grid(fast: bool, data_root) -> list:
    """UCI regression × standard splits × {svi, radial, sgld} × {all, last} × :data:`UCI_LIKELIHOODS`."""
    backends = available_backends(list(UCI_BACKENDS))
    return [uci_run(*cell, backend, stochastic, UCI_BACKENDS[backend][0], likelihood)
            for cell in uci_cells(fast, data_root)
            for likelihood in UCI_LIKELIHOODS for backend in backends for stochastic in UCI_BACKENDS[backend][1]]


def uci_nuts_grid(fast: bool, data_root) -> list:
    """Last-layer NUTS on a MAP body, Gaussian likelihood, on the uci-benchmark splits."""
    if not available_backends(["nuts"]):
        return []
    return [uci_run(*cell, "nuts", "last", UCI_NUTS) for cell in uci_cells(fast, data_root)]


PUBLISHED_UCI = {  # RMSE / test LL: MC dropout (Gal & Ghahramani 2016 Table 1), deep ensembles (Lakshminarayanan 2017)
    "bostonHousing": ("2.97 / −2.46", "3.28 / −2.41"),
    "concrete": ("5.23 / −3.04", "6.03 / −3.06"),
    "energy": ("1.66 / −1.99", "2.09 / −1.38"),
    "wine-quality-red": ("0.62 / −0.93", "0.64 / −0.94"),
    "yacht": ("1.11 / −1.55", "1.58 / −1.18"),
}


def uci_published(row: dict) -> dict:
    dropout, ensembles = PUBLISHED_UCI.get(row["dataset"], ("–", "–"))
    return {"MC dropout (published)": dropout, "deep ensembles (published)": ensembles}


#: bdl-baselines methods: label -> (backend, stochastic); svi, radial and sgld are uci-benchmark's Gaussian runs
BDL_METHODS = {
    "map": ("map", "all"), "ensemble": ("ensemble", "all"), "mc-dropout": ("mc-dropout", "all"),
    "swag": ("swag", "all"), "multiswag": ("multiswag", "all"), "laplace (last)": ("laplace", "last"),
    "laplace (all)": ("laplace", "all"), "svi": ("svi", "all"), "radial": ("radial", "all"), "sgld": ("sgld", "all"),
}
#: SWAG phase (one snapshot per epoch, ≥ the 20 deviation columns) after an Adam burn-in of half the MAP steps
BDL_SWAG_EPOCHS = 40


def bdl_options(backend: str, epochs: int) -> dict:
    """RunSpec fields of a baseline fit whose MAP part takes ``epochs`` (≈ :data:`UCI_STEPS` steps):
    ensemble members and SWAG burn-ins take half of it each (5 members: Lakshminarayanan et al. 2017,
    Wilson & Izmailov 2020), Laplace fits its MAP with its own full-batch ``map_steps``."""
    budget = get_backend(backend).budget  # what the backend declares (inference.backends.base.BUDGETS)
    if budget == "map":
        return {"epochs": epochs, "batch_size": UCI_BATCH}
    if budget == "members":
        return {"epochs": max(epochs // 2, 1), "batch_size": UCI_BATCH}
    if budget == "swag":
        return {"epochs": BDL_SWAG_EPOCHS, "batch_size": UCI_BATCH,
                "backend_options": {"burnin_epochs": max(epochs // 2, 1)}}
    return {}


#: digits (LeNet-300-100): epochs of the MAP-type fits and of the variational backends; seeds
BDL_DIGITS_EPOCHS = 30


def bdl_grid(fast: bool, data_root) -> list:
    """Issue 13's baselines on the UCI protocol of uci-benchmark (Gaussian likelihood, every weight
    random except ``laplace (last)``) and on digits with LeNet-300-100 (seeds in place of splits)."""
    registered = set(available_backends(sorted({backend for backend, _ in BDL_METHODS.values()})))
    methods = {m: v for m, v in BDL_METHODS.items() if v[0] in registered}
    runs = []
    for split, data, name, epochs in uci_cells(fast, data_root):
        labels = {"dataset": name, "split": split}
        for method, (backend, stochastic) in methods.items():
            if backend in UCI_BACKENDS:  # the very runs of uci-benchmark (same key and spec: shared with --runs)
                shared = uci_run(split, data, name, epochs, backend, stochastic, UCI_BACKENDS[backend][0])
                key, spec = shared.key, shared.spec
            else:
                key = run_key(name, method, split)
                spec = RunSpec(data=data, model="mlp", hidden=[50], stochastic=stochastic, backend=backend,
                               split=split, **bdl_options(backend, epochs))
            runs.append(GridRun(key, spec, {**labels, "method": method}))
    for seed in (0,) if fast else (0, 1, 2):
        for method, (backend, stochastic) in methods.items():
            options = bdl_options(backend, BDL_DIGITS_EPOCHS)
            if get_backend(backend).budget == "elbo":
                options = {"epochs": BDL_DIGITS_EPOCHS * 4, "batch_size": UCI_BATCH}
            spec = RunSpec(data="digits", model="lenet300100", stochastic=stochastic, backend=backend, seed=seed,
                           **options)
            runs.append(GridRun(run_key("digits", method, seed), spec,
                                {"dataset": "digits", "method": method, "seed": seed}))
    # digits seed k right after UCI split k: a sweep stopped early has both
    return sorted(runs, key=lambda run: run.labels.get("split", run.labels.get("seed")))


#: paper-protocols: published 20-split test LL and RMSE with their printed ± (../shared/anchors.md): MC dropout from
#: Gal & Ghahramani 2016 Table 1 (± the sd across splits), deep ensembles from Lakshminarayanan et al. 2017 Table 1
PAPER_PUBLISHED = {
    "mc-dropout (gal2016)": {"bostonHousing": ((-2.46, 0.25), (2.97, 0.85)), "concrete": ((-3.04, 0.09), (5.23, 0.53)),
                             "energy": ((-1.99, 0.09), (1.66, 0.19)), "wine-quality-red": ((-0.93, 0.06), (0.62, 0.04)),
                             "yacht": ((-1.55, 0.12), (1.11, 0.38))},
    "deep ensembles": {"bostonHousing": ((-2.41, 0.25), (3.28, 1.00)), "concrete": ((-3.06, 0.18), (6.03, 0.58)),
                       "energy": ((-1.38, 0.22), (2.09, 0.29)), "wine-quality-red": ((-0.94, 0.12), (0.64, 0.04)),
                       "yacht": ((-1.18, 0.21), (1.58, 0.48))},
}
#: paper-protocols' digits rows (LeNet-300-100, seeds 0-2): MAP and Laplace with the bdl-baselines budget beside
#: the two papers' methods; mc-dropout searches the rate on held-out rows with the noise-free categorical likelihood
PAPER_DIGITS = {
    "map": ("map", "all", {"epochs": BDL_DIGITS_EPOCHS, "batch_size": UCI_BATCH}),
    "deep ensembles": ("deep-ensemble", "all", {"backend_options": {"protocol": "lakshminarayanan2017"}}),
    "mc-dropout (gal2016)": ("mc-dropout", "all", {"epochs": BDL_DIGITS_EPOCHS, "backend_options": {"protocol": "gal2016"}}),
    "laplace (last)": ("laplace", "last", {}),
    "laplace (all, kfac)": ("laplace", "all", {"backend_options": {"hessian": "kfac"}}),
}


#: paper-protocols' deep-ensemble options: the paper's budget (40 epochs) at every data size; its other defaults
#: (mean-variance members, adversarial training for classification only, as the paper's experiments) are the
#: backend's own
DEEP_ENSEMBLE_PAPER = {"protocol": "lakshminarayanan2017"}


def paper_protocols_grid(fast: bool, data_root) -> list:
    """Each method under its own paper's protocol: deep ensembles (Lakshminarayanan et al. 2017:
    ``protocol=lakshminarayanan2017``, mean-variance members) and MC dropout (Gal & Ghahramani 2016: ``protocol=gal2016`` over the grids
    shipped with each UCI set, 10 000 MC draws) on the UCI splits, and :data:`PAPER_DIGITS` on digits."""
    runs = []
    ensembles = bool(available_backends(["deep-ensemble"]))
    for split, data, name, _ in uci_cells(fast, data_root):
        info = load_uci(data[4:], split=0).info
        hidden = [int(info.get("n_hidden", 50))]
        labels = {"dataset": name, "split": split}
        if ensembles:
            spec = RunSpec(data=data, model="mlp", hidden=hidden, stochastic="all", backend="deep-ensemble",
                           split=split, likelihood="heteroscedastic", backend_options=dict(DEEP_ENSEMBLE_PAPER))
            runs.append(GridRun(run_key(name, "deep-ensemble", split), spec, {**labels, "method": "deep ensembles"}))
        grids = {"protocol": "gal2016", "dropout_grid": info.get("dropout_rates"), "tau_grid": info.get("tau_values")}
        spec = RunSpec(data=data, model="mlp", hidden=hidden, stochastic="all", backend="mc-dropout", split=split,
                       num_samples=10000, backend_options={k: v for k, v in grids.items() if v is not None})
        runs.append(GridRun(run_key(name, "mc-dropout-gal2016", split), spec,
                            {**labels, "method": "mc-dropout (gal2016)"}))
    registered = set(available_backends(sorted({backend for backend, _, _ in PAPER_DIGITS.values()})))
    for seed in (0,) if fast else (0, 1, 2):
        for method, (backend, stochastic, options) in PAPER_DIGITS.items():
            if backend in registered:
                spec = RunSpec(data="digits", model="lenet300100", stochastic=stochastic, backend=backend, seed=seed,
                               **options)
                runs.append(GridRun(run_key("digits", method, seed), spec,
                                    {"dataset": "digits", "method": method, "seed": seed}))
    return sorted(runs, key=lambda run: run.labels.get("split", run.labels.get("seed")))


def paper_published(row: dict) -> dict:
    """The paper's 20-split test LL and RMSE (± as printed) and whether our mean LL reproduces it:
    at or above the published mean minus its ± (better counts)."""
    published = PAPER_PUBLISHED.get(row.get("method"), {}).get(row.get("dataset"))
    if published is None:
        return {"published LL": "–", "published RMSE": "–", "reproduces (LL ≥ published − ±)": "–"}
    (ll, ll_pm), (rmse, rmse_pm) = published
    ours = row.get("test_ll_mean", float("nan"))
    verdict = "–" if ours != ours else ("yes" if ours >= ll - ll_pm else f"no ({ours - (ll - ll_pm):+.2f} below)")
    return {"published LL": f"{ll:.2f} ± {ll_pm:.2f}", "published RMSE": f"{rmse:.2f} ± {rmse_pm:.2f}",
            "reproduces (LL ≥ published − ±)": verdict}


#: heteroscedastic-defaults (issue 39): backends fitted with the heteroscedastic likelihood and nothing else set
HETEROSCEDASTIC_DEFAULTS = ("ensemble", "map", "deep-ensemble")


def heteroscedastic_defaults_grid(fast: bool, data_root) -> list:
    """``ensemble``, ``map`` and ``deep-ensemble`` with the heteroscedastic likelihood and every other option at its
    default (what
    ``python -m zoo fit --data uci:NAME --stochastic all --backend B --likelihood heteroscedastic --split K`` fits)
    on the UCI splits: the check that their defaults neither collapse the variance on small sets nor widen it."""
    backends = available_backends(list(HETEROSCEDASTIC_DEFAULTS))
    runs = []
    for split, data, name, _ in uci_cells(fast, data_root):
        for backend in backends:
            spec = RunSpec(data=data, model="mlp", stochastic="all", backend=backend, split=split,
                           likelihood="heteroscedastic")
            runs.append(GridRun(run_key(name, backend, "heteroscedastic-defaults", split), spec,
                                {"dataset": name, "method": backend, "split": split}))
    return runs


def heteroscedastic_published(row: dict) -> dict:
    """The deep-ensemble paper's 20-split test LL (± as printed) beside every method, and whether the mean LL is at
    or above it minus its ± (Lakshminarayanan et al. 2017, Table 1)."""
    return paper_published({**row, "method": "deep ensembles"})
