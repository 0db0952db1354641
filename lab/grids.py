"""The named experiment grids of ``python -m zoo experiment NAME`` (run by :mod:`lab.experiments`).

A grid is a list of :class:`lab.grid_runs.Run` s (a spec, its labels, optionally a dataset
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
* ``structured-stochasticity`` — Rochussen 2024 (structured fixed-weight patterns vs vanilla MFVI);
* ``sparse-vd-lenet`` — the variational-MLP dissertation's Table 4.3 on digits (pruning of variational LeNet-300-100; Molchanov et al. 2017);
* ``radial-mc`` — Nazarovs et al. 2021 (Radial BNN with M MC-KL samples, confidence-set accuracy);
* ``smoke`` (hidden) — a seconds-long grid for tests.
"""
from __future__ import annotations

from pathlib import Path

from inference.variational.pruning import PRUNE_MODES
from lab.runs import RunSpec
from zoo.data import BUNDLED_UCI, load_uci

from .grid_runs import Experiment, Run, available_backends

__all__ = ["EXPERIMENTS", "PUBLISHED_UCI"]


# --------------------------------------------------------------------------------------------
# The grids
# --------------------------------------------------------------------------------------------


def _slug(*parts) -> str:
    return "-".join(str(p).replace(" ", "_").replace("/", "_").replace(":", "_") for p in parts if p != "")


#: Bagga et al. 2025 variants: label -> (backend, stochastic, on the frozen pretrained body, backend options).
#: NUTS trees are capped at 2^8 - 1 leapfrog steps: on the angles task the head's posterior (heavy-tailed
#: wrap-around residuals) drove NUTS to depth 9 at step 0.002, 721 s per run against ~60 s on the increments.
EULER_VARIANTS = {
    "deterministic": ("svi", "none", False, {}),
    "last-layer SVI": ("svi", "all", True, {"epochs": 60, "batch_size": 256}),
    "full SVI": ("svi", "all", False, {"num_samples": 30}),
    "last-layer SGLD": ("sgld", "all", True, {"num_chains": 2, "num_samples": 100, "thin": 30, "warmup_steps": 3000,
                                              "batch_size": 256, "step_decay": 0.0}),
    "last-layer NUTS": ("nuts", "all", True, {"num_chains": 2, "warmup_steps": 200, "num_samples": 200,
                                              "map_steps": 2000, "max_tree_depth": 8}),
    "last-layer Radial": ("radial", "all", True, {"epochs": 60, "batch_size": 256}),
}
#: Adam learning rate of the deterministic MultiLSTM, and of full SVI's pretraining of the same net
EULER_DETERMINISTIC_LR = 3e-3
#: issue 14: the SVI variants again with a likelihood that can follow heavy-tailed / input-dependent residuals
EULER_LIKELIHOOD_VARIANTS = {f"{variant} · {likelihood}": (variant, likelihood)
                             for likelihood in ("heteroscedastic", "studentt")
                             for variant in ("last-layer SVI", "full SVI")}
#: SGLD step size per task: about 0.5 / (N τ), below the stability limit 2 / (N τ) of the whitened head
#: (N = 8003 pixels; τ the noise precision in standardised units: ≈ 50 for the angles, ≈ 700 for the increments)
EULER_SGLD_STEP = {"angles": 1e-6, "euler-increments": 1e-7}


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
            det_key = _slug(dataset or "angles", "deterministic", seed)
            lstm = dict(data=data, model="multilstm", seed=seed, batch_size=256, data_options=options)
            variants = [(v, v, None) for v in EULER_VARIANTS] + [(label, v, likelihood) for label, (v, likelihood)
                                                                       in EULER_LIKELIHOOD_VARIANTS.items()]
            for label, variant, likelihood in variants:
                backend, stochastic, frozen, backend_options = EULER_VARIANTS[variant]
                if backend not in backends:
                    continue
                key = _slug(dataset or "angles", variant, likelihood or "", seed)
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
                    # features: whitened, except under a log-variance head (lab.grid_runs.frozen_features)
                    if backend == "sgld":
                        specific["step_size"] = EULER_SGLD_STEP[dataset or "angles"]
                    spec = RunSpec(data=data, model="mlp", hidden=[], stochastic="all", backend=backend, seed=seed,
                                   likelihood=likelihood, backend_options=specific, **generic)
                features = "frozen-states" if likelihood == "heteroscedastic" else "frozen-features"
                runs.append(Run(key, spec, {**labels, "variant": label}, extras=("euler",),
                                dataset=features if frozen else dataset, after=det_key if frozen else None))
    return runs


def _uci_names(data_root) -> list:
    if data_root is None:
        return [f"uci:{name}" for name in BUNDLED_UCI]
    folders = sorted(p for p in Path(data_root).iterdir() if (p / "data.txt").is_file())
    if not folders:
        raise ValueError(f"--data-root {data_root} holds no UCI-layout dataset folder (a folder with data.txt, "
                         "index_features.txt, index_target.txt, index_train_<k>.txt, ...)")
    return [f"uci:{p}" for p in folders]


#: uci-benchmark backends, their options (sgld's step size: :data:`UCI_SGLD_STEP`), and the stochastic selections
UCI_BACKENDS = {
    "svi": ({}, ("all", "last")),
    "radial": ({}, ("all", "last")),
    "sgld": ({"num_chains": 2, "num_samples": 100, "thin": 10, "warmup_steps": 1000}, ("all", "last")),
}
#: SGLD step size ε₀ per likelihood: about half the stability limit 4/λ of the drift z + (ε/2)∇log π, λ the
#: largest eigenvalue of −∇² log π at the MAP start (power iteration with exact Hessian-vector products), the
#: largest over the bundled sets' split 0 and {all, last}: Gaussian 7.0e5 (energy), Student-t 4.8e6 (energy),
#: heteroscedastic 1.7e8 (yacht) — a log-variance head lets a well-fitted point's precision e^(−s) grow.
UCI_SGLD_STEP = {"gaussian": 3e-6, "studentt": 4e-7, "heteroscedastic": 1.2e-8}
#: the optional last-layer NUTS grid ``uci-nuts`` (the whole network takes minutes per split on 2 cores)
UCI_NUTS = {"num_chains": 2, "warmup_steps": 200, "num_samples": 200, "map_steps": 5000}
#: uci-benchmark's likelihood axis (:data:`zoo.likelihoods.LIKELIHOODS` names)
UCI_LIKELIHOODS = ("gaussian", "heteroscedastic", "studentt")
UCI_STEPS, UCI_BATCH = 2000, 128  # optimisation steps and minibatch of the variational backends and MAP fits


def _uci_cells(fast: bool, data_root) -> list:
    """``(split, data, name, epochs)`` of every UCI dataset and split, split-major (an interrupted
    sweep leaves every configuration with about the same number of splits); ``epochs`` give
    about :data:`UCI_STEPS` minibatch steps of size :data:`UCI_BATCH`."""
    cells = []
    for data in _uci_names(data_root):
        first = load_uci(data[4:], split=0)
        epochs = -(-UCI_STEPS // -(-first.n_train // UCI_BATCH))  # ceil(steps / steps per epoch)
        cells += [(split, data, Path(data[4:]).name, epochs)
                  for split in range(min(first.info["n_splits"], 3 if fast else 20))]
    return sorted(cells, key=lambda cell: cell[0])


def _uci_run(split, data, name, epochs, backend, stochastic, options, likelihood="gaussian") -> Run:
    """One UCI run of the shared protocol; identical specs get identical keys in every UCI grid."""
    variational = backend in ("svi", "radial")
    if backend == "sgld":
        options = {**options, "step_size": UCI_SGLD_STEP[likelihood]}
    spec = RunSpec(data=data, model="mlp", hidden=[50], stochastic=stochastic, backend=backend, split=split,
                   likelihood=likelihood, backend_options=dict(options), epochs=epochs if variational else None,
                   batch_size=UCI_BATCH if variational else None)
    labels = {"dataset": name, "backend": backend, "stochastic": stochastic, "likelihood": likelihood,
              "split": split}
    return Run(_slug(name, backend, stochastic, likelihood, split), spec, labels)


def _uci(fast: bool, data_root) -> list:
    """UCI regression × standard splits × {svi, radial, sgld} × {all, last} × :data:`UCI_LIKELIHOODS`."""
    backends = available_backends(list(UCI_BACKENDS))
    return [_uci_run(*cell, backend, stochastic, UCI_BACKENDS[backend][0], likelihood)
            for cell in _uci_cells(fast, data_root)
            for likelihood in UCI_LIKELIHOODS for backend in backends for stochastic in UCI_BACKENDS[backend][1]]


def _uci_nuts(fast: bool, data_root) -> list:
    """Last-layer NUTS on a MAP body, Gaussian likelihood, on the uci-benchmark splits."""
    if not available_backends(["nuts"]):
        return []
    return [_uci_run(*cell, "nuts", "last", UCI_NUTS) for cell in _uci_cells(fast, data_root)]


PUBLISHED_UCI = {  # RMSE / test LL: MC dropout (Gal & Ghahramani 2016 Table 1), deep ensembles (Lakshminarayanan 2017)
    "bostonHousing": ("2.97 / −2.46", "3.28 / −2.41"),
    "concrete": ("5.23 / −3.04", "6.03 / −3.06"),
    "energy": ("1.66 / −1.99", "2.09 / −1.38"),
    "wine-quality-red": ("0.62 / −0.93", "0.64 / −0.94"),
    "yacht": ("1.11 / −1.55", "1.58 / −1.18"),
}


def _uci_published(row: dict) -> dict:
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


def _bdl_options(backend: str, epochs: int) -> dict:
    """RunSpec fields of a baseline fit whose MAP part takes ``epochs`` (≈ :data:`UCI_STEPS` steps):
    ensemble members and SWAG burn-ins take half of it each (5 members: Lakshminarayanan et al. 2017,
    Wilson & Izmailov 2020), Laplace fits its MAP with its own full-batch ``map_steps``."""
    if backend in ("map", "mc-dropout"):
        return {"epochs": epochs, "batch_size": UCI_BATCH}
    if backend == "ensemble":
        return {"epochs": max(epochs // 2, 1), "batch_size": UCI_BATCH}
    if backend in ("swag", "multiswag"):
        return {"epochs": BDL_SWAG_EPOCHS, "batch_size": UCI_BATCH,
                "backend_options": {"burnin_epochs": max(epochs // 2, 1)}}
    return {}


#: digits (LeNet-300-100): epochs of the MAP-type fits and of the variational backends; seeds
BDL_DIGITS_EPOCHS = 30


def _bdl(fast: bool, data_root) -> list:
    """Issue 13's baselines on the UCI protocol of uci-benchmark (Gaussian likelihood, every weight
    random except ``laplace (last)``) and on digits with LeNet-300-100 (seeds in place of splits)."""
    registered = set(available_backends(sorted({backend for backend, _ in BDL_METHODS.values()})))
    methods = {m: v for m, v in BDL_METHODS.items() if v[0] in registered}
    runs = []
    for split, data, name, epochs in _uci_cells(fast, data_root):
        labels = {"dataset": name, "split": split}
        for method, (backend, stochastic) in methods.items():
            if backend in UCI_BACKENDS:  # the very runs of uci-benchmark (same key and spec: shared with --runs)
                shared = _uci_run(split, data, name, epochs, backend, stochastic, UCI_BACKENDS[backend][0])
                key, spec = shared.key, shared.spec
            else:
                key = _slug(name, method, split)
                spec = RunSpec(data=data, model="mlp", hidden=[50], stochastic=stochastic, backend=backend,
                               split=split, **_bdl_options(backend, epochs))
            runs.append(Run(key, spec, {**labels, "method": method}))
    for seed in (0,) if fast else (0, 1, 2):
        for method, (backend, stochastic) in methods.items():
            options = _bdl_options(backend, BDL_DIGITS_EPOCHS)
            if backend in ("svi", "radial"):
                options = {"epochs": BDL_DIGITS_EPOCHS * 4, "batch_size": UCI_BATCH}
            spec = RunSpec(data="digits", model="lenet300100", stochastic=stochastic, backend=backend, seed=seed,
                           **options)
            runs.append(Run(_slug("digits", method, seed), spec, {"dataset": "digits", "method": method, "seed": seed}))
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
    "deep ensembles": ("deep-ensemble", "all", {}),
    "mc-dropout (gal2016)": ("mc-dropout", "all", {"epochs": BDL_DIGITS_EPOCHS, "backend_options": {"protocol": "gal2016"}}),
    "laplace (last)": ("laplace", "last", {}),
    "laplace (all, kfac)": ("laplace", "all", {"backend_options": {"hessian": "kfac"}}),
}


def _paper_protocols(fast: bool, data_root) -> list:
    """Each method under its own paper's protocol: deep ensembles (Lakshminarayanan et al. 2017: the backend's
    defaults, mean-variance members) and MC dropout (Gal & Ghahramani 2016: ``protocol=gal2016`` over the grids
    shipped with each UCI set, 10 000 MC draws) on the UCI splits, and :data:`PAPER_DIGITS` on digits."""
    runs = []
    ensembles = bool(available_backends(["deep-ensemble"]))
    for split, data, name, _ in _uci_cells(fast, data_root):
        info = load_uci(data[4:], split=0).info
        hidden = [int(info.get("n_hidden", 50))]
        labels = {"dataset": name, "split": split}
        if ensembles:
            spec = RunSpec(data=data, model="mlp", hidden=hidden, stochastic="all", backend="deep-ensemble",
                           split=split, likelihood="heteroscedastic")
            runs.append(Run(_slug(name, "deep-ensemble", split), spec, {**labels, "method": "deep ensembles"}))
        grids = {"protocol": "gal2016", "dropout_grid": info.get("dropout_rates"), "tau_grid": info.get("tau_values")}
        spec = RunSpec(data=data, model="mlp", hidden=hidden, stochastic="all", backend="mc-dropout", split=split,
                       num_samples=10000, backend_options={k: v for k, v in grids.items() if v is not None})
        runs.append(Run(_slug(name, "mc-dropout-gal2016", split), spec, {**labels, "method": "mc-dropout (gal2016)"}))
    registered = set(available_backends(sorted({backend for backend, _, _ in PAPER_DIGITS.values()})))
    for seed in (0,) if fast else (0, 1, 2):
        for method, (backend, stochastic, options) in PAPER_DIGITS.items():
            if backend in registered:
                spec = RunSpec(data="digits", model="lenet300100", stochastic=stochastic, backend=backend, seed=seed,
                               **options)
                runs.append(Run(_slug("digits", method, seed), spec, {"dataset": "digits", "method": method,
                                                                       "seed": seed}))
    return sorted(runs, key=lambda run: run.labels.get("split", run.labels.get("seed")))


def _paper_published(row: dict) -> dict:
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
                runs.append(Run(_slug(f"init{init_scale:g}", variant, seed), spec, labels, dataset="uci-random",
                                extras=("rmse_std",)))
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
                runs.append(Run(_slug(family, prune, seed), spec, labels))
    return runs


def _radial(fast: bool, data_root) -> list:
    if not available_backends(["radial"]):
        return []
    seeds, epochs = ((0,), 20) if fast else ((0, 1, 2), 200)
    return [Run(_slug("M", m, seed), RunSpec(data="digits", model="lenet300100", stochastic="all", backend="radial",
                                             seed=seed, epochs=epochs, batch_size=128,
                                             backend_options={"mc_kl_samples": m}),
                {"M": m, "seed": seed}, extras=("confidence",))
            for m in (1, 10, 100) for seed in seeds]


def _smoke(fast: bool, data_root) -> list:
    """Seconds-long grid for tests: a deterministic MLP, full SVI and last-layer SVI on its frozen body."""
    common = dict(data="toy1d", model="mlp", hidden=[8], epochs=3, num_samples=20)
    runs = []
    for seed in (0, 1):
        det = Run(_slug("det", seed), RunSpec(stochastic="none", seed=seed, **common), {"variant": "det", "seed": seed})
        full = Run(_slug("full", seed), RunSpec(stochastic="all", seed=seed, **common), {"variant": "full", "seed": seed})
        head = Run(_slug("head", seed), RunSpec(data="toy1d", model="mlp", hidden=[], stochastic="all", seed=seed,
                                                epochs=3, num_samples=20),
                   {"variant": "frozen head", "seed": seed}, dataset="frozen-features", after=det.key)
        runs += [det, full, head]
    return runs


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment("euler-stochasticity", "Bagga et al. 2025, Table 1: MultiLSTM on Euler angles, levels of stochasticity",
                   _euler, ("formulation", "variant"),
                   ("rmse_plain", "rmse_circular", "test_ll", "coverage_90", "rhat_max", "fit_seconds",
                    "pretrain_seconds")),
        Experiment("uci-benchmark", "UCI regression, standard splits, backends × {all, last} × likelihoods", _uci,
                   ("dataset", "backend", "stochastic", "likelihood"),
                   ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=_uci_published),
        Experiment("uci-nuts", "UCI regression, standard splits, last-layer NUTS on a MAP body (optional, slow)",
                   _uci_nuts, ("dataset", "backend", "stochastic", "likelihood"),
                   ("rmse", "test_ll", "coverage_90", "fit_seconds"), published=_uci_published),
        Experiment("bdl-baselines", "MAP, ensembles, MC dropout, (Multi)SWAG, Laplace, SVI, Radial, SGLD on the "
                   "UCI protocol and digits", _bdl, ("dataset", "method"),
                   ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "fit_seconds"),
                   published=_uci_published),
        Experiment("paper-protocols", "each method under its own paper's protocol (deep ensembles: Lakshminarayanan "
                   "et al. 2017; MC dropout: Gal & Ghahramani 2016's validation grid search) on the UCI splits, and "
                   "digits", _paper_protocols, ("dataset", "method"),
                   ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "fit_seconds"),
                   published=_paper_published),
        Experiment("structured-stochasticity", "Rochussen 2024: structured fixed-weight patterns vs vanilla MFVI",
                   _structured, ("init_sd", "variant"), ("rmse_std", "test_ll", "coverage_90", "num_random", "fit_seconds")),
        Experiment("sparse-vd-lenet", "Molchanov et al. 2017 sparse VD (dissertation Table 4.3) on digits: pruning variational LeNet-300-100", _sparse_vd,
                   ("family", "prune"), ("accuracy", "nll", "sparsity", "fit_seconds")),
        Experiment("radial-mc", "Nazarovs et al. 2021: Radial BNN accuracy / NLL vs M MC-KL samples on digits", _radial,
                   ("M",), ("accuracy", "nll", "ece", "acc_0.9", "kept_0.9", "fit_seconds")),
        Experiment("smoke", "seconds-long grid for tests", _smoke, ("variant",), ("rmse", "test_ll", "coverage_90"),
                   hidden=True),
    )
}
"""Named grids of ``python -m zoo experiment NAME``."""
