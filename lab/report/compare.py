"""Sections of the comparison report over several runs.

``az.compare`` ranks runs by PSIS-LOO elpd (stacking weights, Yao et al. 2018); it is only
meaningful when every run was fitted to the same observations, which is checked.
"""
from __future__ import annotations

import arviz as az
import numpy as np

from . import plots
from .html import frame_table, image, join, link, note, paragraph, table
from .predictive import LEVELS, coverage_curve, loo_data, pit_values, reliability_curve
from .rundata import NotApplicable, ReportRun

__all__ = ["runs_table", "loo_compare", "calibration_overlay"]

METRIC_KEYS = ("rmse", "test_ll", "coverage_90", "accuracy", "nll", "ece", "member_disagreement", "sparsity",
               "rhat_max", "ess_bulk_min", "divergences", "tree_depth_saturated", "fidelity_w2", "fidelity_agreement",
               "fidelity_total_variation", "reference_coverage_90", "fit_seconds")


def runs_table(runs: list[ReportRun], links: dict) -> str:
    """One row per run: identity, headline metrics, convergence, timing; names link to the run reports."""
    keys = [k for k in METRIC_KEYS if any(k in r.metrics for r in runs)]
    rows = []
    for run in runs:
        href = links.get(run.name)
        cells = [link(href, run.name) if href else run.name]
        cells += [run.metrics.get(k, "") for k in ("data", "model", "stochastic")] + [run.backend]
        cells += [run.metrics.get(k) for k in keys]
        rows.append(cells)
    return table(rows, ["run", "data", "model", "stochastic", "backend", *keys])


def _same_observations(runs: list[ReportRun], datasets: list) -> str | None:
    """None when all runs' LOO data hold the same observations, else why not."""
    first = datasets[0].observed_data["obs"].values
    for run, idata in zip(runs[1:], datasets[1:]):
        other = idata.observed_data["obs"].values
        if other.shape != first.shape or not np.allclose(other, first):
            return f"runs {runs[0].name!r} and {run.name!r} were fitted to different data"
    return None


def loo_compare(runs: list[ReportRun]) -> str:
    pairs = [loo_data(r) for r in runs]
    datasets = [idata for idata, _ in pairs]
    reason = _same_observations(runs, datasets)
    if reason:
        raise NotApplicable(f"az.compare needs one shared data set: {reason}")
    with plots.quiet_arviz():
        table = az.compare(dict(zip([r.name for r in runs], datasets)), ic="loo")
    picture = plots.arviz_png(az.plot_compare, table, figsize=(6, 1 + 0.5 * len(runs)))
    sources = sorted({source for _, source in pairs})
    return join([
        *(paragraph(s) for s in sources),
        paragraph("Runs ranked by PSIS-LOO elpd; elpd_diff and dse are relative to the best run, weight is the "
                  "stacking weight. warning = True flags high Pareto k̂ for that run."),
        frame_table(table.drop(columns=["scale"], errors="ignore"), "run"),
        image(picture, "az.compare"),
    ])


def calibration_overlay(runs: list[ReportRun]) -> str:
    tasks = {r.task for r in runs}
    if len(tasks) > 1:
        raise NotApplicable(f"runs mix tasks ({', '.join(sorted(tasks))}); calibration curves are not comparable")
    curve = reliability_curve if tasks == {"classification"} else _coverage
    curves, skipped = {}, []
    for run in runs:
        try:
            curves[run.name] = curve(run)
        except NotApplicable as err:
            skipped.append(f"{run.name}: {err}")
    if not curves:
        raise NotApplicable("no run stored the prediction its calibration needs: " + "; ".join(skipped))
    picture = plots.reliability_png(curves) if tasks == {"classification"} else plots.coverage_png(curves)
    return join([paragraph("One curve per run; the dashed diagonal is perfect calibration."),
                      *(note(s) for s in skipped), image(picture, "calibration across runs")])


def _coverage(run: ReportRun) -> tuple:
    return LEVELS, coverage_curve(pit_values(run))
