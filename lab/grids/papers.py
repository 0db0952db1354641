"""The grids after papers (registered in :mod:`lab.grids.registry`): Bagga et al. 2025's Euler-angle
levels of stochasticity (:func:`euler_grid`), Rochussen 2024's structured patterns (:func:`structured_grid`),
sparse variational dropout on LeNet-300-100 (Molchanov et al. 2017; :func:`sparse_vd_grid`) and Radial BNNs
against their MC-KL samples (Nazarovs et al. 2021; :func:`radial_grid`).

Each builder is ``build(fast, data_root) -> [GridRun]`` (:class:`lab.grids.experiment.GridRun`: a spec, its
labels, optionally a dataset builder and a prerequisite run).  Backends that are not registered in
:data:`inference.backends.BACKENDS` are left out with a note.
"""
from __future__ import annotations

from pathlib import Path

from inference.variational.pruning import PRUNE_MODES
from lab.runs.spec import RunSpec

from .experiment import GridRun, available_backends, run_key

__all__ = ["euler_grid", "structured_grid", "sparse_vd_grid", "radial_grid", "EULER_VARIANTS", "STRUCTURED_VARIANTS",
           "VARIATIONAL_FAMILIES"]


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


def euler_grid(fast: bool, data_root) -> list:
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


def structured_grid(fast: bool, data_root) -> list:
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
#: seed 002's Graves layers draw one set of weights per forward pass (the backend's default is now LRT)
SEED_002_ESTIMATOR = {"graves": {"estimator": "weights"}}


def sparse_vd_grid(fast: bool, data_root) -> list:
    families = available_backends(VARIATIONAL_FAMILIES)
    seeds, epochs = ((0,), 20) if fast else ((0, 1, 2), 200)
    runs = []
    for family in families:
        for prune in PRUNE_MODES:
            for seed in seeds:
                spec = RunSpec(data="digits", model="lenet300100", stochastic="all", backend=family, seed=seed,
                               epochs=epochs, batch_size=128, prune=prune,
                               backend_options=SEED_002_ESTIMATOR.get(family, {}))
                labels = {"family": family, "prune": prune, "seed": seed}
                runs.append(GridRun(run_key(family, prune, seed), spec, labels))
    return runs


def radial_grid(fast: bool, data_root) -> list:
    if not available_backends(["radial"]):
        return []
    seeds, epochs = ((0,), 20) if fast else ((0, 1, 2), 200)
    return [GridRun(run_key("M", m, seed), RunSpec(data="digits", model="lenet300100", stochastic="all",
                                                   backend="radial", seed=seed, epochs=epochs, batch_size=128,
                                                   backend_options={"mc_kl_samples": m}),
                    {"M": m, "seed": seed}, extras=("confidence",))
            for m in (1, 10, 100) for seed in seeds]
