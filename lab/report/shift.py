"""Report section on a run's shift results: the metrics against a rotation angle and the OOD detection scores.

Reads what :func:`inference.evaluation.shift.evaluate_shift` stored in ``metrics.json["shift"]`` at fit
time (runs on ``digits-rotated`` / ``digits-ood``); nothing is predicted again.  A run folder is not
trusted: every value is checked to be a number (or the documented ``None``) before it is plotted or
tabled, and a record that is not the stored shape makes the section say so in one line.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import plots
from .html import fmt, frame_table, heading, image, join, paragraph
from .rundata import NotApplicable, ReportRun

__all__ = ["shift", "rotation_frame", "ood_frame"]

_ROTATION_COLUMNS = ("accuracy", "nll", "ece", "brier", "entropy", "mi")
_OOD_COLUMNS = ("auroc_entropy", "auroc_mi", "entropy_in", "entropy_out", "mi_in", "mi_out")


def _number(value, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise NotApplicable(f"metrics.json holds a shift record with a value that is not a finite number ({value!r:.40})")
    return float(value)


def _rows(record, kind: str) -> list:
    rows = record.get(kind, [])
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise NotApplicable(f"metrics.json's shift record has no list of {kind} rows")
    return rows


def rotation_frame(record: dict) -> pd.DataFrame:
    """One row per rotation angle (degrees, the index) with the stored metrics as columns."""
    rows = {_number(row.get("angle")): {k: _number(row.get(k)) for k in _ROTATION_COLUMNS}
            for row in _rows(record, "rotation")}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(_ROTATION_COLUMNS)).sort_index()


def ood_frame(record: dict) -> pd.DataFrame:
    """One row per out-of-distribution set (its name, the index) with the AUROCs and mean scores."""
    rows = {str(row.get("name", "?")): {k: _number(row.get(k), allow_none=k == "auroc_mi") for k in _OOD_COLUMNS}
            for row in _rows(record, "ood")}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(_OOD_COLUMNS))


def shift(run: ReportRun) -> str:
    """The rotation curves and table, and the OOD scores with the entropy / MI histograms, of a run that has them."""
    record = run.metrics.get("shift")
    if not record:
        raise NotApplicable("the run's data have no shift sets (use --data digits-rotated or digits-ood)")
    if not isinstance(record, dict):
        raise NotApplicable("metrics.json's shift record is not a mapping")
    parts = []
    if record.get("rotation"):
        frame = rotation_frame(record)
        parts += [heading("Rotated test images (Ovadia et al. 2019)"),
                  paragraph("The test images rotated by each angle (bilinear interpolation), scored by the Monte Carlo "
                            "average of the class probabilities over the posterior draws: accuracy, NLL, ECE (15 bins) "
                            "and Brier score; entropy and MI are the mean predictive entropy and mutual information "
                            "(nats)."),
                  image(_rotation_png(frame), "metrics against the rotation angle"),
                  frame_table(frame.map(lambda v: fmt(v, 3)), "angle (degrees)")]
    if record.get("ood"):
        frame = ood_frame(record)
        parts += [heading("Out-of-distribution inputs"),
                  paragraph("AUROC of telling the out-of-distribution points (positives) from the in-distribution test "
                            "points by their predictive entropy and by their mutual information (the epistemic part); "
                            "0.5 is chance.")]
        for row in _rows(record, "ood"):
            if row.get("mi_identically_zero") is True:
                parts.append(paragraph(f"{row.get('name', '?')}: the mutual information is identically zero (every "
                                       "draw predicts the same probabilities: a MAP or a closed-form predictive), so "
                                       "its AUROC is undefined (—)."))
        parts.append(frame_table(frame.map(lambda v: fmt(v, 3)), "set"))
        figure = _ood_png(_rows(record, "ood")[0])
        if figure is not None:
            parts.append(image(figure, "entropy and MI histograms, in- and out-of-distribution"))
    if not parts:
        raise NotApplicable("the run's shift record holds no rotation or OOD rows")
    return join(parts)


def _rotation_png(frame: pd.DataFrame) -> str:
    fig, axes = plots._figure(ncols=4, width=3.0, height=2.6)
    for ax, (column, label) in zip(axes, (("accuracy", "accuracy"), ("nll", "NLL"), ("ece", "ECE"), ("brier", "Brier"))):
        ax.plot(frame.index, frame[column], marker="o", color="C0")
        ax.set(xlabel="rotation (degrees)", title=label, xticks=range(0, 181, 45))
    return plots.png(fig)


def _ood_png(row: dict):
    """Entropy and MI histograms (stored counts over [0, ln K]) of the in- and out-of-distribution points."""
    try:
        upper = _number(row.get("histogram_upper"))
        counts = {key: np.asarray([_number(c) for c in row[key]], dtype=float)
                  for key in ("entropy_in_histogram", "entropy_out_histogram", "mi_in_histogram", "mi_out_histogram")}
    except (KeyError, TypeError, NotApplicable):
        return None
    fig, axes = plots._figure(ncols=2, width=4.0, height=2.6)
    for ax, score, title in zip(axes, ("entropy", "mi"), ("predictive entropy (nats)", "mutual information (nats)")):
        for side, color in (("in", "C0"), ("out", "C3")):
            values = counts[f"{score}_{side}_histogram"]
            edges = np.linspace(0.0, upper, len(values) + 1)
            total = max(values.sum(), 1.0)
            ax.stairs(values / total, edges, color=color, label=f"{side}-distribution")
        ax.set(xlabel=title, ylabel="share of points")
        ax.legend(fontsize=7)
    return plots.png(fig)
