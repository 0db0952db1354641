"""Figure parts shared by the experiments' tables (:mod:`lab.grids.tables`, :mod:`lab.grids.shift`)."""
from __future__ import annotations

__all__ = ["grouped_bars"]


def grouped_bars(ax, summary, x, series, metric, label=None):
    """Grouped bars of ``metric`` (mean ± se): one group per value of ``x``, one bar per ``series``."""
    xs = list(dict.fromkeys(summary[x]))
    names = list(dict.fromkeys(summary[series])) if series else [None]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        part = summary if name is None else summary[summary[series] == name]
        part = part.set_index(x).reindex(xs)
        positions = [j + (i - (len(names) - 1) / 2) * width for j in range(len(xs))]
        ax.bar(positions, part[f"{metric}_mean"], width, yerr=part[f"{metric}_se"].fillna(0), capsize=2,
               label=None if name is None else str(name))
    ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(label or metric)
    if series:
        ax.legend(fontsize=7)
