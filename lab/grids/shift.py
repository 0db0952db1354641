"""The grids of issue 37's shift experiments (registered in :mod:`lab.grids.registry`), their tables and figures.

* ``shift-rotation`` — every classification backend × seeds on ``digits-rotated`` (LeNet-300-100):
  accuracy, NLL, ECE and Brier of the test images rotated 0°–180° (Ovadia et al. 2019);
* ``shift-ood`` — the same methods on ``digits-ood`` (trained on classes 0–4): AUROC of the predictive
  entropy and of the mutual information between the test images of classes 0–4 and of 5–9;
* ``uci-gap`` — every regression backend on the gap splits of bundled UCI sets (one per input feature;
  Foong et al. 2019) and, beside them, on standard splits 0–2 of the same sets: test LL per method.

Budgets are those of ``bdl-baselines`` and ``uci-benchmark`` (:mod:`lab.grids.uci`): MAP-type and
variational fits about :data:`~lab.grids.uci.UCI_STEPS` minibatch steps of 128 on UCI; on digits the MAP-type
fits 30 epochs and the variational families four times as many; every other backend runs with its defaults.  NUTS and HMC infer the last layer
(a MAP body; on every LeNet weight they are out of reach on 2 cores), on digits with short chains
(:data:`DIGITS_SHORT_MCMC`), and so do the Laplace rows marked
"last" and the last-layer SVI / MC-dropout rows of Ovadia et al. ("LL-SVI", "LL-Dropout").  Laplace's
default classification predictive is the closed-form probit, one set of probabilities per point, so its MI
is identically zero; the ``laplace (last, glm)`` row predicts by Monte Carlo over its linearised network,
which has an MI, with the prior precision of its own validation search (``prior_precision="auto"`` scores the
Monte Carlo GLM predictive on the held-out rows as it does the probit; before, it took the evidence's δ, which
left this predictive near-uniform on the training distribution: :mod:`inference.laplace.evidence`).
"""
from __future__ import annotations

import math
from pathlib import Path

from inference.backends import get_backend
from lab.runs.spec import RunSpec
from zoo.data import load_uci

from .experiment import GridRun, available_backends, run_key, unguarded
from .plotting import grouped_bars
from .uci import BDL_DIGITS_EPOCHS, UCI_BATCH, UCI_STEPS, bdl_options

__all__ = ["DIGITS_METHODS", "DIGITS_SHORT_MCMC", "GAP_DATASETS", "GAP_STANDARD_SPLITS", "REGRESSION_METHODS", "SHIFT_SEEDS",
           "rotation_grid", "ood_grid", "gap_grid", "rotation_tables", "ood_tables", "gap_tables", "SHIFT_FIGURES",
           "REPORTED_ANGLES"]

SHIFT_SEEDS = (0, 1, 2)
#: the variational families' epochs on digits are this multiple of the MAP's (bdl-baselines' svi / radial rows);
#: on UCI they are the MAP's (uci-benchmark's protocol)
_VI_FACTOR = 4


def _budget(backend: str, epochs: int, vi_factor: int = 1) -> dict:
    """RunSpec fields of a fit whose MAP part takes ``epochs`` of minibatches of 128 (the variational
    families ``vi_factor`` times as many).  A sampler runs without its ``time_budget``: the budget guards a new
    user's default fit, and a grid's chains are long by design (on the shared 2 cores the digits SG-MCMC
    chains, projected at about 2 min, were stopped at 120 s and left the samplers out of the tables)."""
    if get_backend(backend).budget == "elbo":
        return {"epochs": epochs * vi_factor, "batch_size": UCI_BATCH}
    options = bdl_options(backend, epochs)
    guard = unguarded(backend)
    if guard:
        options["backend_options"] = {**options.get("backend_options", {}), **guard}
    return options


#: short NUTS / HMC on the digits last layer (1 010 weights on a MAP body; the defaults' 4 chains of 400 NUTS
#: iterations to depth 10 took over 27 min on the shared 2 cores without finishing)
DIGITS_SHORT_MCMC = {"num_chains": 2, "warmup_steps": 100, "num_samples": 100, "max_tree_depth": 6}
#: digits methods: label -> (backend, stochastic, backend options)
DIGITS_METHODS = {
    "map": ("map", "all", {}), "ensemble": ("ensemble", "all", {}), "deep-ensemble": ("deep-ensemble", "all", {}),
    "mc-dropout": ("mc-dropout", "all", {}), "mc-dropout (last)": ("mc-dropout", "last", {}),
    "swag": ("swag", "all", {}), "multiswag": ("multiswag", "all", {}),
    "laplace (last)": ("laplace", "last", {}), "laplace (last, glm)": ("laplace", "last", {"predictive": "glm"}),
    "laplace (all, kfac)": ("laplace", "all", {"hessian": "kfac"}),
    "svi": ("svi", "all", {}), "svi (last)": ("svi", "last", {}), "svi-lrt": ("svi-lrt", "all", {}),
    "graves": ("graves", "all", {}), "sparse-vd": ("sparse-vd", "all", {}), "kingma-vd": ("kingma-vd", "all", {}),
    "radial": ("radial", "all", {}),
    "sgld": ("sgld", "all", {}), "psgld": ("psgld", "all", {}), "sghmc": ("sghmc", "all", {}),
    "csgmcmc": ("csgmcmc", "all", {}),
    "nuts (last)": ("nuts", "last", DIGITS_SHORT_MCMC),
    "hmc (last)": ("hmc", "last", {k: v for k, v in DIGITS_SHORT_MCMC.items() if k != "max_tree_depth"}),
}


def _digits_runs(data: str, fast: bool) -> list:
    registered = set(available_backends(sorted({backend for backend, _, _ in DIGITS_METHODS.values()})))
    runs = []
    for seed in SHIFT_SEEDS[:1] if fast else SHIFT_SEEDS:
        for method, (backend, stochastic, options) in DIGITS_METHODS.items():
            if backend not in registered:
                continue
            budget = _budget(backend, BDL_DIGITS_EPOCHS, _VI_FACTOR)
            options = {**budget.pop("backend_options", {}), **options}
            spec = RunSpec(data=data, model="lenet300100", stochastic=stochastic, backend=backend, seed=seed,
                           backend_options=options, **budget)
            runs.append(GridRun(run_key(data, method, seed), spec, {"method": method, "seed": seed}))
    return runs


def rotation_grid(fast: bool, data_root) -> list:
    """:data:`DIGITS_METHODS` × :data:`SHIFT_SEEDS` on ``digits-rotated`` (15° steps; ``--fast``: seed 0)."""
    return _digits_runs("digits-rotated", fast)


def ood_grid(fast: bool, data_root) -> list:
    """:data:`DIGITS_METHODS` × :data:`SHIFT_SEEDS` on ``digits-ood`` (classes 0–4 in, 5–9 out)."""
    return _digits_runs("digits-ood", fast)


#: the UCI sets of ``uci-gap`` (bundled; with --data-root the folders of that name in it) and standard splits
GAP_DATASETS = ("yacht", "energy", "concrete")
GAP_STANDARD_SPLITS = (0, 1, 2)
#: regression methods: label -> (backend, stochastic, backend options); Gaussian likelihood unless the backend
#: names its own (deep-ensemble: mean-variance members)
REGRESSION_METHODS = {
    "map": ("map", "all", {}), "ensemble": ("ensemble", "all", {}), "deep-ensemble": ("deep-ensemble", "all", {}),
    "mc-dropout": ("mc-dropout", "all", {}), "swag": ("swag", "all", {}), "multiswag": ("multiswag", "all", {}),
    "laplace (last)": ("laplace", "last", {}), "laplace (all)": ("laplace", "all", {}),
    "svi": ("svi", "all", {}), "svi-lrt": ("svi-lrt", "all", {}), "graves": ("graves", "all", {}),
    "sparse-vd": ("sparse-vd", "all", {}), "kingma-vd": ("kingma-vd", "all", {}), "radial": ("radial", "all", {}),
    "sgld": ("sgld", "all", {}), "psgld": ("psgld", "all", {}), "sghmc": ("sghmc", "all", {}),
    "csgmcmc": ("csgmcmc", "all", {}),
    "nuts (last)": ("nuts", "last", {}), "hmc (last)": ("hmc", "last", {}),
}


def gap_grid(fast: bool, data_root) -> list:
    """:data:`REGRESSION_METHODS` on every gap split of :data:`GAP_DATASETS` and on their standard splits
    :data:`GAP_STANDARD_SPLITS` (``--fast``: yacht only), MLP with one hidden layer of 50 (Foong et al. 2019).

    Epochs give about :data:`~lab.grids.uci.UCI_STEPS` minibatch steps on each kind of split's training rows.
    Runs are ordered split-major, so a sweep stopped early has every method on the first splits.
    """
    registered = set(available_backends(sorted({backend for backend, _, _ in REGRESSION_METHODS.values()})))
    runs = []
    for name in GAP_DATASETS[:1] if fast else GAP_DATASETS:
        path = str(Path(data_root) / name) if data_root else name
        features = load_uci(path, split=0).input_dim
        kinds = [("gap", f"uci-gap:{path}", k) for k in range(features)]
        kinds += [("standard", f"uci:{path}", k) for k in GAP_STANDARD_SPLITS]
        for kind, data, split in kinds:
            n_train = (load_uci if kind == "standard" else _gap_rows)(path, split=split).n_train
            epochs = math.ceil(UCI_STEPS / math.ceil(n_train / UCI_BATCH))
            for method, (backend, stochastic, options) in REGRESSION_METHODS.items():
                if backend not in registered:
                    continue
                budget = _budget(backend, epochs)
                spec = RunSpec(data=data, model="mlp", hidden=[50], stochastic=stochastic, backend=backend,
                               split=split, backend_options={**budget.pop("backend_options", {}), **options}, **budget)
                labels = {"dataset": name, "splits": kind, "method": method, "split": split}
                runs.append(GridRun(run_key(name, kind, method, split), spec, labels))
    return sorted(runs, key=lambda run: run.labels["split"])


def _gap_rows(path, split):
    from zoo.data import load_uci_gap

    return load_uci_gap(path, split=split)


# --------------------------------------------------------------------------------------------
# Tables (appended to summary.md) and figures
# --------------------------------------------------------------------------------------------

#: angles shown in the markdown tables (summary.csv has every angle of the grid)
REPORTED_ANGLES = (0, 30, 60, 90, 120, 150, 180)
_ROTATION_METRICS = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE", "brier": "Brier"}


def _angles(summary) -> list:
    return sorted({float(c[3:].split("_")[0]) for c in summary.columns if c.startswith("rot") and c.endswith("_accuracy_mean")})


def _num(value, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def rotation_tables(summary) -> str:
    """Per metric, one row per method: the mean over seeds at :data:`REPORTED_ANGLES` and the mean over every angle."""
    angles = _angles(summary)
    shown = [a for a in angles if a in REPORTED_ANGLES] or angles
    lines = []
    for key, title in _ROTATION_METRICS.items():
        header = ["method", "n"] + [f"{a:g}°" for a in shown] + ["mean 0–180°"]
        lines += ["", f"**{title} against the rotation angle** (mean over seeds; mean ± se over seeds of the "
                      f"mean over all {len(angles)} angles in the last column)", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for _, row in summary.iterrows():
            per_angle = [row.get(f"rot{a:g}_{key}_mean", float("nan")) for a in angles]
            cells = [str(row["method"]), str(int(row["n"]))]
            cells += [_num(row.get(f"rot{a:g}_{key}_mean", float("nan"))) for a in shown]
            cells.append(_num(sum(per_angle) / len(per_angle)) if angles else "–")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ood_tables(summary) -> str:
    """One row per method: in-distribution accuracy, AUROC of entropy and of MI, mean entropy and MI in / out."""
    header = ["method", "n", "accuracy (0–4)", "AUROC entropy", "AUROC MI", "entropy in / out", "MI in / out"]
    lines = ["", "**Held-out classes: classes 5–9 against the test images of 0–4** (mean ± se over seeds)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in summary.iterrows():
        zero = row.get("ood_mi_identically_zero_mean", 0.0) == 1.0
        mi = "MI ≡ 0 (one deterministic predictive)" if zero else _pm(row, "ood_auroc_mi")
        lines.append("| " + " | ".join([
            str(row["method"]), str(int(row["n"])), _pm(row, "accuracy"), _pm(row, "ood_auroc_entropy"), mi,
            f"{_num(row.get('ood_entropy_in_mean'))} / {_num(row.get('ood_entropy_out_mean'))}",
            f"{_num(row.get('ood_mi_in_mean'), 4)} / {_num(row.get('ood_mi_out_mean'), 4)}"]) + " |")
    return "\n".join(lines) + "\n"


def _pm(row, metric: str, digits: int = 3) -> str:
    mean, se = row.get(f"{metric}_mean", float("nan")), row.get(f"{metric}_se", float("nan"))
    if mean is None or math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" + ("" if se is None or math.isnan(se) else f" ± {se:.{digits}f}")


def gap_tables(summary) -> str:
    """Per dataset and method: test LL on the standard splits and on the gap splits, their difference, and the
    gap splits' 90 % coverage (mean ± se over the splits)."""
    lines = []
    for dataset in dict.fromkeys(summary["dataset"]):
        part = summary[summary["dataset"] == dataset]
        header = ["method", "standard test LL", "gap test LL", "gap − standard", "gap coverage_90", "gap splits"]
        lines += ["", f"**{dataset}: test log-likelihood on the standard and the gap splits**", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for method in dict.fromkeys(part["method"]):
            rows = {r["splits"]: r for _, r in part[part["method"] == method].iterrows()}
            standard, gap = rows.get("standard"), rows.get("gap")
            difference = "–"
            if standard is not None and gap is not None:
                difference = _num(gap["test_ll_mean"] - standard["test_ll_mean"], 2)
            lines.append("| " + " | ".join([
                str(method), _pm(standard, "test_ll", 2) if standard is not None else "–",
                _pm(gap, "test_ll", 2) if gap is not None else "–", difference,
                _pm(gap, "coverage_90", 2) if gap is not None else "–",
                str(int(gap["n"])) if gap is not None else "0"]) + " |")
    return "\n".join(lines) + "\n"


def _figure_rotation(summary, plt):
    """Accuracy, NLL, ECE and Brier (means over seeds) against the angle, one line per method."""
    angles = _angles(summary)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    styles = ["-", "--", ":", "-."]
    for i, (_, row) in enumerate(summary.iterrows()):
        for ax, key in zip(axes, _ROTATION_METRICS):
            ax.plot(angles, [row.get(f"rot{a:g}_{key}_mean") for a in angles], styles[i // 10 % 4], marker=".",
                    color=f"C{i % 10}", label=str(row["method"]))
    for ax, title in zip(axes, _ROTATION_METRICS.values()):
        ax.set(xlabel="rotation angle (degrees)", ylabel=title, xticks=range(0, 181, 30))
    axes[1].set_yscale("log")
    axes[-1].legend(fontsize=6, ncol=2, loc="lower right")
    return fig


def _figure_ood(summary, plt):
    """AUROC of the predictive entropy and of the MI per method (0.5: chance; a zero MI shows no bar)."""

    frame = summary.copy()
    long = []
    for score, label in (("ood_auroc_entropy", "entropy"), ("ood_auroc_mi", "mutual information")):
        part = frame[["method", f"{score}_mean", f"{score}_se"]].rename(
            columns={f"{score}_mean": "auroc_mean", f"{score}_se": "auroc_se"})
        long.append(part.assign(score=label))
    import pandas as pd

    fig, ax = plt.subplots(figsize=(12, 4))
    grouped_bars(ax, pd.concat(long), "method", "score", "auroc", "AUROC, classes 5–9 vs 0–4")
    ax.axhline(0.5, color="k", lw=0.8)
    ax.set_ylim(0.4, 1.0)
    return fig


def _figure_gap(summary, plt):
    """Test LL per method, standard vs gap splits, one panel per dataset (symlog: a collapse does not hide the rest)."""

    datasets = list(dict.fromkeys(summary["dataset"]))
    fig, axes = plt.subplots(len(datasets), 1, figsize=(12, 3.6 * len(datasets)), squeeze=False)
    for ax, name in zip(axes[:, 0], datasets):
        grouped_bars(ax, summary[summary["dataset"] == name], "method", "splits", "test_ll", "test log-likelihood")
        ax.set_yscale("symlog")
        ax.set_title(name, fontsize=9)
    return fig


SHIFT_FIGURES = {"shift-rotation": _figure_rotation, "shift-ood": _figure_ood, "uci-gap": _figure_gap}
"""Figure makers of the shift experiments (registered in :data:`lab.grids.tables.FIGURES`)."""
