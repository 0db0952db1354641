"""Result tables and figures of an experiment grid: mean ± standard error per configuration.

:func:`write_tables` writes them all from the grid's finished runs (:func:`collect`);
:func:`summarise` turns ``results.csv`` rows (one per run) into the summary table,
:func:`summary_markdown` into ``summary.md`` (:func:`timing_line` its wall-time line), and
:func:`make_figures` draws the grid's figure.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Optional

import pandas as pd

from .experiment import CONFIDENCE_THRESHOLDS, Experiment
from .worker import is_finished, metrics_path
from lab.runs.store import write_bytes_file, write_text_file
from .plotting import grouped_bars
from .shift import SHIFT_FIGURES

__all__ = ["collect", "write_tables", "summarise", "summary_markdown", "timing_line", "make_figures", "FIGURES",
           "COVERAGE_90_BAND", "coverage_note"]

#: the band a 90 % central interval's coverage is expected in over a test set of UCI size; outside it a table marks
#: the cell "(wide)" or "(narrow)", so an over- or under-dispersed predictive shows beside a good test LL
COVERAGE_90_BAND = (0.85, 0.95)


def coverage_note(mean) -> str:
    """``" (wide)"`` above :data:`COVERAGE_90_BAND`, ``" (narrow)"`` below it, ``""`` inside (or for no number)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    low, high = COVERAGE_90_BAND
    return " (wide)" if mean > high else " (narrow)" if mean < low else ""


def collect(runs, root):
    """One row per finished run: key, labels and scalar metrics (a pandas DataFrame)."""
    rows = []
    for run in runs:
        if not is_finished(root, run):
            continue
        metrics = json.loads(metrics_path(root, run.key).read_text())
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or v is None}
        rows.append({"key": run.key, **scalars, **run.labels})
    return pd.DataFrame(rows)


def write_tables(experiment: Experiment, runs, root, out, failures, timing: Optional[dict] = None):
    """Write results.csv, summary.csv, summary.md, failures.txt and figures into ``out``.

    ``timing`` (``wall_seconds``, ``workers``, ``executor``, ``fitted``, ``found_done``, optionally
    ``not_started``) adds the wall-time line to ``summary.md``.
    """
    out = Path(out)
    results = collect(runs, root)
    for entry in out.iterdir():  # a link at an output name (e.g. planted in a received folder) is replaced,
        if entry.is_symlink() and entry.suffix in (".csv", ".md", ".txt", ".png"):  # never written through
            entry.unlink()
    files = []
    if failures:
        write_text_file(out / "failures.txt", "".join(f"{k}\t{v}\n" for k, v in sorted(failures.items())))
        files.append(out / "failures.txt")
    else:
        (out / "failures.txt").unlink(missing_ok=True)  # from an earlier, failed attempt
    if results.empty:
        return results, results, files
    summary = summarise(results, experiment.group)
    write_text_file(out / "results.csv", results.to_csv(index=False))  # whole or not at all, even under SIGKILL
    write_text_file(out / "summary.csv", summary.to_csv(index=False))
    flagged = results.loc[results["failed_fit"].eq(True), "key"] if "failed_fit" in results else ()
    extra = experiment.tables(summary) if experiment.tables else ""
    write_text_file(out / "summary.md", summary_markdown(experiment, summary, failures, flagged) + extra
                    + timing_line(results, timing))
    files += [out / "results.csv", out / "summary.csv", out / "summary.md"]
    files += make_figures(experiment.name, summary, out)
    return results, summary, files


def summarise(results, group) -> "pd.DataFrame":
    """Mean, standard error (sd / √n, ddof 1; NaN for n = 1) and n of every numeric column per group,
    and ``failed_fit``: the number of the group's runs flagged as failed fits (:mod:`inference.evaluation.sanity`)."""

    group = [g for g in group if g in results.columns]
    numeric = [c for c in results.columns if c not in group and c not in ("seed", "split", "failed_fit")
               and pd.api.types.is_numeric_dtype(results[c])]
    grouped = results.groupby(group, sort=False, dropna=False)[numeric]
    mean, sd, n = grouped.mean(), grouped.std(ddof=1), grouped.count()
    se = sd / n.pow(0.5)
    table = pd.concat({"mean": mean, "se": se}, axis=1)
    table.columns = [f"{metric}_{stat}" for stat, metric in table.columns]
    table.insert(0, "n", results.groupby(group, sort=False, dropna=False).size())
    flags = results["failed_fit"].eq(True) if "failed_fit" in results else pd.Series(False, index=results.index)
    table.insert(1, "failed_fit", flags.groupby([results[g] for g in group], sort=False, dropna=False).sum())
    return table.reset_index()


def _cell(mean, se) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    text = f"{mean:.4g}"
    return text if se is None or math.isnan(se) else f"{text} ± {se:.2g}"


def summary_markdown(experiment: Experiment, summary, failures: dict, flagged=()) -> str:
    """The summary as a markdown table: group columns, n, ``mean ± se`` per metric, failed_fit (the
    number of runs flagged), published columns; then the failed runs and the keys of the ``flagged`` runs."""
    group = [g for g in experiment.group if g in summary.columns]
    metrics = [m for m in experiment.metrics if f"{m}_mean" in summary.columns]
    rows = []
    for _, row in summary.iterrows():
        cells = [str(row[g]) for g in group] + [str(int(row["n"]))]
        cells += [_cell(row[f"{m}_mean"], row[f"{m}_se"]) + (coverage_note(row[f"{m}_mean"]) if m == "coverage_90" else "")
                  for m in metrics] + [str(int(row.get("failed_fit", 0)))]
        published = experiment.published(row.to_dict()) if experiment.published else {}
        rows.append(cells + list(published.values()))
    extra = list(experiment.published(summary.iloc[0].to_dict())) if experiment.published and len(summary) else []
    header = group + ["n"] + metrics + ["failed_fit"] + extra
    band = (f" coverage_90 outside [{COVERAGE_90_BAND[0]}, {COVERAGE_90_BAND[1]}] is marked (wide) or (narrow)."
            if "coverage_90" in metrics else "")
    lines = [f"**{experiment.name}** — {experiment.description}. Mean ± standard error over splits/seeds.{band}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    if failures:
        lines += ["", f"{len(failures)} run(s) failed (see failures.txt): " + ", ".join(sorted(failures))]
    if len(flagged):
        lines += ["", f"{len(flagged)} run(s) flagged failed_fit (worse than the trivial predictor or an exploding "
                      f"predictive scale; failed_fit_reason in results.csv): " + ", ".join(sorted(flagged))]
    return "\n".join(lines) + "\n"





def timing_line(results, timing: Optional[dict]) -> str:
    """``summary.md``'s last line: this invocation's wall time and the runs' summed times (seconds)."""
    if timing is None:
        return ""
    summed = float(results["run_seconds"].sum()) if "run_seconds" in results else float("nan")
    cpu = results["run_cpu_seconds"].dropna() if "run_cpu_seconds" in results else results.iloc[:0]
    cpu_text = f"; CPU time of the {len(cpu)} runs that record it: {cpu.sum():.0f} s ({cpu.mean():.1f} s per run)" \
        if len(cpu) else ""
    left = timing.get("not_started", 0)
    stopped = (f" **Incomplete: stopped at the time limit with {left} run(s) of the grid not started**; "
               f"`n` is the number of splits/seeds done per row.") if left else ""
    return (f"\nWall time of this invocation: {timing['wall_seconds']:.0f} s ({timing['fitted']} runs fitted, "
            f"{timing['found_done']} found done; {timing['executor']} executor, {timing['workers']} workers); "
            f"summed run times of the {len(results)} runs in the table: {summed:.0f} s{cpu_text}.{stopped}\n")


def _figure_euler(summary, plt):
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    grouped_bars(axes[0], summary, "variant", "formulation", "rmse_circular", "test RMSE (circular), degrees")
    grouped_bars(axes[1], summary, "variant", "formulation", "rmse_plain", "test RMSE (plain, as Bagga et al. 2025), degrees")
    grouped_bars(axes[2], summary, "variant", "formulation", "coverage_90", "90% interval coverage")
    axes[2].axhspan(*COVERAGE_90_BAND, color="green", alpha=0.1)
    return fig


def _figure_uci(summary, plt):
    """Test RMSE per dataset (log scale: a diverged fit does not hide the others): one bar group per
    backend × stochastic subset, one bar per likelihood."""
    datasets = list(dict.fromkeys(summary["dataset"]))
    summary = summary.assign(config=summary["backend"] + " " + summary["stochastic"])
    series = "likelihood" if "likelihood" in summary else None
    fig, axes = plt.subplots(1, len(datasets), figsize=(3.6 * len(datasets), 3.8), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        grouped_bars(ax, summary[summary["dataset"] == name], "config", series, "rmse", "test RMSE (log scale)")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
    return fig


def _figure_bdl(summary, plt):
    """Per UCI dataset (one bar per method) the test log-likelihood (top) and the 90 % interval's coverage with
    :data:`COVERAGE_90_BAND` shaded (bottom), and digits accuracy."""
    regression = summary[summary["dataset"] != "digits"] if "test_ll_mean" in summary else summary.iloc[:0]
    datasets = list(dict.fromkeys(regression["dataset"]))
    digits = summary[summary["dataset"] == "digits"]
    panels = len(datasets) + (1 if len(digits) and "accuracy_mean" in digits else 0)
    coverage = "coverage_90_mean" in regression and len(datasets) > 0
    rows = 2 if coverage else 1
    fig, axes = plt.subplots(rows, max(panels, 1), figsize=(3.6 * max(panels, 1), 3.8 * rows), squeeze=False)
    for column, name in enumerate(datasets):
        part = regression[regression["dataset"] == name]
        grouped_bars(axes[0][column], part, "method", None, "test_ll", "test log-likelihood")
        axes[0][column].set_title(name, fontsize=9)
        if coverage:
            grouped_bars(axes[1][column], part, "method", None, "coverage_90", "90% interval coverage")
            axes[1][column].axhspan(*COVERAGE_90_BAND, color="green", alpha=0.1)
            axes[1][column].set_ylim(0, 1.02)
    if panels > len(datasets):
        grouped_bars(axes[0][-1], digits, "method", None, "accuracy", "test accuracy")
        axes[0][-1].set_title("digits (LeNet-300-100)", fontsize=9)
        if coverage:
            axes[1][-1].axis("off")
    return fig


def _figure_structured(summary, plt):
    inits = list(dict.fromkeys(summary["init_sd"]))
    fig, axes = plt.subplots(1, len(inits), figsize=(7 * len(inits), 4), squeeze=False)
    for ax, init in zip(axes[0], inits):
        part = summary[summary["init_sd"] == init]
        grouped_bars(ax, part, "variant", None, "rmse_std", "test RMSE (standardised)")
        ax.set_title(f"guide initial sd {init:g}", fontsize=9)
        vanilla = part.loc[part["variant"] == "vanilla MFVI", "rmse_std_mean"]
        if len(vanilla):
            ax.axhline(float(vanilla.iloc[0]), color="k", lw=0.8, label="vanilla MFVI")
            ax.axhline(0.7 * float(vanilla.iloc[0]), color="r", ls="--", lw=0.8, label="goal: 30% below vanilla")
            ax.legend(fontsize=7)
    return fig


def _figure_sparse(summary, plt):
    fig, ax = plt.subplots(figsize=(7, 4))
    grouped_bars(ax, summary, "family", "prune", "accuracy", "test accuracy")
    return fig


def _figure_radial(summary, plt):
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, metric in zip(axes[:2], ("accuracy", "nll")):
        ax.errorbar(summary["M"], summary[f"{metric}_mean"], summary[f"{metric}_se"].fillna(0), marker="o", capsize=2)
        ax.set_xscale("log")
        ax.set_xlabel("MC-KL samples M")
        ax.set_ylabel(f"test {metric}")
    for _, row in summary.iterrows():
        kept = [row[f"kept_{t:g}_mean"] for t in CONFIDENCE_THRESHOLDS]
        acc = [row[f"acc_{t:g}_mean"] for t in CONFIDENCE_THRESHOLDS]
        axes[2].plot(kept, acc, marker="o", label=f"M = {int(row['M'])}")
    axes[2].set_xlabel("fraction kept (max probability ≥ threshold)")
    axes[2].set_ylabel("accuracy on the kept points")
    axes[2].legend(fontsize=7)
    return fig


def _figure_fidelity(summary, plt):
    from .fidelity import figure

    return figure(summary, plt)


FIGURES = {"euler-stochasticity": _figure_euler, "uci-benchmark": _figure_uci, "uci-nuts": _figure_uci,
           "bdl-baselines": _figure_bdl, "paper-protocols": _figure_bdl, "heteroscedastic-defaults": _figure_bdl,
           "structured-stochasticity": _figure_structured, "sparse-vd-lenet": _figure_sparse,
           "radial-mc": _figure_radial, "fidelity": _figure_fidelity}
"""Figure makers ``(summary, pyplot) -> Figure`` per experiment."""
FIGURES.update(SHIFT_FIGURES)  # shift-rotation, shift-ood, uci-gap (lab.grids.shift)


def make_figures(name: str, summary, out: Path) -> list:
    """Write ``out/<name>.png`` from the summary table; returns the paths written."""
    if name not in FIGURES:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = FIGURES[name](summary, plt)
    fig.tight_layout()
    path = Path(out) / f"{name}.png"
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_bytes_file(path, buffer.getvalue())
    return [path]
