"""The ``fidelity`` experiment: every backend on every reference problem, scored against its reference posterior.

``python -m zoo experiment fidelity`` fits every registered backend × every reference problem whose
reference is built (:func:`lab.references.build.load_reference`; the others are left out with a note) ×
seeds 0, 1, 2 × two settings — ``defaults`` (the backend's own defaults, as ``fit`` gives them, without a
sampler's wall-clock guard ``time_budget``: :func:`lab.grids.experiment.unguarded`) and
``tuned`` (the settings of the project's UCI and baseline grids, :func:`tuned_options`: the tuned
minibatch budgets of ``bdl-baselines``, ``uci-benchmark``'s SGLD chains, a long NUTS run; a backend
without tuned settings in those grids runs its defaults only).  Every run fits the problem's own model
on the problem's data (the ``reference`` dataset builder: the data set drawn from the problem's data
seed, or the frozen body's features of a last-layer problem, whatever the run's seed), so
:func:`lab.runs.execution.execute` finds the reference and scores the run (``fidelity_*`` columns,
:mod:`lab.references.fidelity`).  The problems span both selections: ``all`` (toy1d, moons, energy-small,
yacht-small) and ``last`` (energy-last, digits-last).

Tables: distance to the reference (W2 or total variation, and agreement), its noise floor, the
reference coverage and the CPU seconds of each run, per problem × backend × setting; the figure
(:func:`figure`) puts distance against cost, one panel per problem, the noise floor as a line: the
frontier a user picks from.  ``--fast``: seed 0, defaults only.
"""
from __future__ import annotations

import dataclasses
import math

from inference.backends import get_backend
from lab.references.problems import PROBLEMS, head_spec

from .experiment import GridRun, available_backends, run_key, unguarded
from .uci import BDL_METHODS, UCI_BACKENDS, UCI_BATCH, UCI_STEPS, bdl_options

__all__ = ["fidelity_grid", "tuned_options", "figure", "FIDELITY_METRICS", "SEEDS"]

SEEDS = (0, 1, 2)
#: the summary columns of the experiment
FIDELITY_METRICS = ("fidelity_w2", "fidelity_w2_noise_floor", "fidelity_total_variation",
                    "fidelity_total_variation_noise_floor", "fidelity_agreement", "reference_coverage_90",
                    "run_cpu_seconds")
#: a long NUTS run (the tuned setting), shorter than a reference's
TUNED_NUTS = {"num_chains": 4, "warmup_steps": 300, "num_samples": 200, "max_tree_depth": 10, "target_accept": 0.9,
              "time_budget": None}
#: the samplers' tuned settings: uci-benchmark's SGLD and the long NUTS run
TUNED_SAMPLERS = {"sgld": UCI_BACKENDS["sgld"][0], "nuts": TUNED_NUTS}


def tuned_options(backend: str, n_train: int):
    """RunSpec fields of ``backend``'s tuned setting on ``n_train`` points, or ``None`` (no tuned setting: the
    defaults only).  Minibatch budgets follow ``bdl-baselines`` (about :data:`lab.grids.uci.UCI_STEPS` steps
    of :data:`lab.grids.uci.UCI_BATCH`)."""
    if backend in TUNED_SAMPLERS:
        return {"backend_options": dict(TUNED_SAMPLERS[backend])}
    if backend not in {method_backend for method_backend, _ in BDL_METHODS.values()}:
        return None  # in none of the project's grids: no tuned setting
    epochs = math.ceil(UCI_STEPS / math.ceil(n_train / UCI_BATCH))
    if get_backend(backend).budget == "elbo":
        return {"epochs": epochs, "batch_size": UCI_BATCH}
    return bdl_options(backend, epochs)


def _built_references(note=print) -> dict:
    """``{name: manifest}`` of the reference problems built now; a note names the others."""
    from lab.references.build import load_reference

    built, missing = {}, []
    for name in PROBLEMS:
        try:
            built[name] = load_reference(name).manifest
        except ValueError:
            missing.append(name)
    if missing:
        note(f"note: references not built, left out of the grid: {', '.join(missing)} "
             f"(python -m zoo reference build NAME)")
    return built


def fidelity_grid(fast: bool, data_root) -> list:
    """The runs of the ``fidelity`` experiment (module docstring)."""
    from inference.backends import BACKENDS

    backends = available_backends(list(BACKENDS))
    runs = []
    for name, manifest in _built_references().items():
        problem = PROBLEMS[name]
        base = head_spec(problem)
        if manifest["task"] == "regression":
            base = dataclasses.replace(base, likelihood="gaussian")  # every backend on the problem's likelihood
        for backend in backends:
            guard = unguarded(backend)  # the defaults, without a sampler's wall-clock guard
            settings = {"defaults": {"backend_options": guard} if guard else {}}
            tuned = None if fast else tuned_options(backend, manifest["data"]["n_train"])
            if tuned is not None:
                settings["tuned"] = tuned
            for setting, fields in settings.items():
                for seed in (0,) if fast else SEEDS:
                    spec = dataclasses.replace(base, backend=backend, seed=seed, **fields)
                    labels = {"problem": name, "stochastic": problem.spec.stochastic, "backend": backend,
                              "setting": setting, "seed": seed}
                    runs.append(GridRun(run_key(name, backend, setting, seed), spec, labels, dataset="reference"))
    return runs


def figure(summary, plt):
    """Distance to the reference against CPU seconds per run, one panel per problem, one point per backend ×
    setting (mean ± se over seeds), the noise floor dashed."""
    from matplotlib.ticker import NullFormatter

    problems = list(dict.fromkeys(summary["problem"]))
    fig, axes = plt.subplots(1, max(len(problems), 1), figsize=(4.6 * max(len(problems), 1), 4.2), squeeze=False)
    for ax, name in zip(axes[0], problems):
        part = summary[summary["problem"] == name]
        metric = "fidelity_w2" if part.get("fidelity_w2_mean") is not None and part["fidelity_w2_mean"].notna().any() \
            else "fidelity_total_variation"
        if f"{metric}_mean" not in part or "run_cpu_seconds_mean" not in part:
            ax.set_title(f"{name}: no fidelity scores", fontsize=9)
            continue
        for (backend, setting), row in part.set_index(["backend", "setting"]).iterrows():
            x, y = row["run_cpu_seconds_mean"], row[f"{metric}_mean"]
            if not (math.isfinite(x) and math.isfinite(y)):
                continue
            ax.errorbar(x, y, yerr=0 if math.isnan(row[f"{metric}_se"]) else row[f"{metric}_se"],
                        marker="o" if setting == "defaults" else "s", ms=4, capsize=2,
                        color="C0" if setting == "defaults" else "C1")
            ax.annotate(backend, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
        floor = part[f"{metric}_noise_floor_mean"].dropna()
        if len(floor):
            ax.axhline(float(floor.iloc[0]), color="k", ls="--", lw=0.8, label="noise floor")
            ax.legend(fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # the minor labels of a short log axis overlap
        ax.set_xlabel("CPU seconds per run")
        ax.set_ylabel("W2 to the reference" if metric == "fidelity_w2" else "total variation to the reference")
        ax.set_title(f"{name} ({part['stochastic'].iloc[0]}): circles defaults, squares tuned", fontsize=8)
    return fig
