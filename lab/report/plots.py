"""Figures for reports, returned as base64-encoded PNG strings.

Own figures are ``matplotlib.figure.Figure`` objects rendered with the Agg canvas (no
pyplot state, so they work the same in a terminal and in a notebook); ArviZ plots go
through pyplot and their figures are closed after encoding.
"""
from __future__ import annotations

import base64
import io
import textwrap
import warnings
from typing import Callable, Mapping, Sequence

import numpy as np

from inference.evaluation.arviz_export import quiet_arviz

__all__ = [
    "quiet_arviz",
    "legend_below",
    "png",
    "arviz_png",
    "history_png",
    "coverage_png",
    "pit_png",
    "reliability_png",
    "bands_png",
    "histograms_png",
    "stat_traces_png",
    "pit_qq_png",
    "binned_residuals_png",
]

DPI = 80
#: legend labels under a plot wrap at this many characters; the figure grows by the legend's height and this pad
LEGEND_CHARS, LEGEND_PAD_INCHES = 48, 0.1


def _figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes.ravel()


def png(fig) -> str:
    """Encode ``fig`` as base64 PNG (and close it if pyplot owns it)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    import matplotlib.pyplot as plt

    if plt.fignum_exists(getattr(fig, "number", -1)):
        plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def arviz_png(plot: Callable, *args, **kwargs) -> str:
    """Run an ArviZ plotting function and encode the figure it drew on."""
    with quiet_arviz():
        axes = plot(*args, **kwargs)
    first = np.ravel(axes)[0] if isinstance(axes, np.ndarray) else axes
    fig = first.get_figure()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.tight_layout()
    return png(fig)


def history_png(history: Mapping[str, Sequence[float]]) -> str:
    """Training curves per epoch: loss, ELBO = E_q[log p(y|w)] − KL, KL, sparsity where recorded, and the
    KL weight β / learning rate."""
    epoch = np.asarray(history.get("epoch") or np.arange(len(history["loss"])))
    panels = [("loss", "loss (−ELBO with β·KL, per epoch)")]
    if "expected_log_likelihood" in history and "kl" in history:
        panels.append(("elbo", "ELBO = E_q[log p(y|w)] − KL"))
    if "kl" in history:
        panels.append(("kl", "KL(q ‖ p)"))
    if history.get("layer_sparsity") or history.get("sparsity"):
        panels.append(("sparsity", "sparsity by the family's rule"))
    schedules = [k for k in ("kl_weight", "lr", "step_size") if k in history]
    fig, axes = _figure(ncols=len(panels) + bool(schedules), width=3.6, height=2.8)
    for ax, (key, label) in zip(axes, panels):
        if key == "sparsity":
            _sparsity_panel(ax, epoch, history)
            ax.set(title=label, xlabel="epoch")
            continue
        if key == "elbo":
            values = np.asarray(history["expected_log_likelihood"]) - np.asarray(history["kl"])
        else:
            values = np.asarray(history[key])
        ax.plot(epoch, values, lw=1)
        ax.set(title=label, xlabel="epoch")
        if key in ("loss", "kl") and np.all(values > 0) and values.max() / max(values.min(), 1e-300) > 100:
            ax.set_yscale("log")
    if schedules:
        ax = axes[len(panels)]
        for key in schedules:
            values = np.asarray(history[key], dtype=float)
            scale = values.max() if values.max() > 0 else 1.0
            ax.plot(epoch, values / scale, lw=1.2, label=f"{key} / {scale:.3g}")
        ax.set(title="schedules (scaled to max 1)", xlabel="epoch", ylim=(-0.05, 1.05))
        ax.legend(fontsize=8)
    return png(fig)


def _sparsity_panel(ax, epoch, history) -> None:
    """Per-layer (weight sites) and overall sparsity per epoch, where recorded."""
    layers = history.get("layer_sparsity") or []
    names = [n for n in (layers[-1] if layers else {}) if n.endswith("weight")] or list(layers[-1] if layers else {})
    for name in names:
        ax.plot(epoch[: len(layers)], [row.get(name, np.nan) for row in layers], lw=1, label=name)
    if history.get("sparsity"):
        ax.plot(epoch[: len(history["sparsity"])], history["sparsity"], "k", lw=1.5, label="overall")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)


def legend_below(ax, fontsize: float = 8, width_chars: int = LEGEND_CHARS) -> None:
    """The axes' legend under the plot, labels wrapped at ``width_chars`` characters (long names broken),
    the figure made taller by the legend's lines: however long or many the labels, the plot keeps its
    size (a legend inside or beside the axes, sized by the labels, squeezes them under constrained layout)."""
    handles, labels = ax.get_legend_handles_labels()
    wrapped = [textwrap.fill(str(label), width_chars) or " " for label in labels]
    fig = ax.get_figure()
    width, height = fig.get_size_inches()
    legend = fig.legend(handles, wrapped, loc="outside lower center", fontsize=fontsize, frameon=False)
    legend_height = legend.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi  # inches, as drawn
    fig.set_size_inches(width, height + legend_height + LEGEND_PAD_INCHES)


def coverage_png(curves: Mapping[str, tuple]) -> str:
    """Empirical coverage of central predictive intervals against their nominal level (legend below the plot)."""
    fig, (ax,) = _figure(width=4.2, height=3.6)
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="ideal")
    for label, (nominal, empirical) in curves.items():
        ax.plot(nominal, empirical, marker="o", ms=3, lw=1.2, label=label)
    ax.set(xlabel="nominal level of the central interval", ylabel="empirical coverage", xlim=(0, 1), ylim=(0, 1))
    legend_below(ax)
    return png(fig)


def pit_png(pit: np.ndarray, bins: int = 20) -> str:
    """Histogram of probability-integral-transform values; uniform when calibrated."""
    fig, (ax,) = _figure(width=4.2, height=3.2)
    ax.hist(np.ravel(pit), bins=bins, range=(0, 1), density=True, color="C0", alpha=0.75, edgecolor="white")
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    ax.set(xlabel="PIT value F(y | data)", ylabel="density", xlim=(0, 1), title="PIT histogram")
    return png(fig)


def reliability_png(curves: Mapping[str, tuple]) -> str:
    """Reliability diagram: accuracy per confidence bin against the bin's mean confidence.

    ``curves`` maps a label to ``(confidence [B], accuracy [B], counts [B])`` over non-empty bins
    (counts set the marker sizes; any quantity proportional to them, e.g. shares, will do).
    """
    fig, (ax,) = _figure(width=4.2, height=3.6)
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="ideal")
    for label, (confidence, acc, counts) in curves.items():
        sizes = 10 + 120 * np.asarray(counts) / max(1, np.max(counts))
        ax.plot(confidence, acc, lw=1.2, label=label)
        ax.scatter(confidence, acc, s=sizes, alpha=0.6)
    ax.set(xlabel="confidence (max mean class probability)", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1.02))
    legend_below(ax)
    return png(fig)


def bands_png(train, test, x, mean, bands: Mapping[str, tuple], epistemic=None, xlabel: str = "x",
              test_label: str = "test") -> str:
    """1-D predictive mean and central bands at sorted inputs ``x`` with the evaluated (``test_label``) and
    (optional) training points."""
    fig, (ax,) = _figure(width=6.5, height=3.6)
    for alpha, (label, (lo, hi)) in zip((0.18, 0.3, 0.42), bands.items()):
        ax.fill_between(x, lo, hi, color="C0", alpha=alpha, lw=0, label=label)
    if epistemic is not None:
        ax.plot(x, epistemic[0], color="C1", lw=0.8, ls=":", label="± 2 sd of f (epistemic)")
        ax.plot(x, epistemic[1], color="C1", lw=0.8, ls=":")
    ax.plot(x, mean, color="C0", lw=1.5, label="predictive mean")
    ax.scatter(*test, s=4, color="grey", alpha=0.5, label=test_label)
    if train is not None:
        ax.scatter(*train, s=14, color="k", label="train")
    ax.set(xlabel=xlabel, ylabel="y")
    ax.legend(fontsize=7, loc="best")
    return png(fig)


def histograms_png(values: Mapping[str, np.ndarray], xlabel: str, threshold: float | None = None) -> str:
    """One histogram per layer (site), with an optional pruning threshold line."""
    names = list(values)
    ncols = min(3, len(names))
    nrows = -(-len(names) // ncols)
    fig, axes = _figure(ncols=ncols, nrows=nrows, width=3.4, height=2.5)
    for ax, name in zip(axes, names):
        v = np.ravel(values[name])
        v = v[np.isfinite(v)]
        ax.hist(v, bins=40, color="C2", alpha=0.8)
        if threshold is not None:
            ax.axvline(threshold, color="C3", ls="--", lw=1)
        ax.set(title=f"{name} ({v.size})", xlabel=xlabel)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    return png(fig)


def stat_traces_png(stats: Mapping[str, np.ndarray]) -> str:
    """Per-draw sampler statistics ``{name: [chains, draws]}`` against the draw index, one line per chain."""
    names = list(stats)
    fig, axes = _figure(ncols=len(names), width=3.4, height=2.6)
    for ax, name in zip(axes, names):
        values = np.asarray(stats[name], dtype=float)
        for chain, row in enumerate(values.reshape(values.shape[0], -1)):
            ax.plot(row, lw=0.8, label=f"chain {chain}")
        ax.set(title=name, xlabel="draw")
    if names and np.asarray(stats[names[0]]).shape[0] <= 8:
        axes[0].legend(fontsize=7)
    return png(fig)


def pit_qq_png(pit: np.ndarray, level: float = 0.9) -> str:
    """Sorted PIT values against uniform quantiles (i − ½)/n, with the pointwise central ``level`` band of
    the i-th of n uniform order statistics, Beta(i, n + 1 − i)."""
    from scipy.stats import beta

    u = np.sort(np.ravel(pit))
    n = u.size
    i = np.arange(1, n + 1)
    expected = (i - 0.5) / n
    fig, (ax,) = _figure(width=4.2, height=3.8)
    lo, hi = beta.ppf((1 - level) / 2, i, n + 1 - i), beta.ppf((1 + level) / 2, i, n + 1 - i)
    ax.fill_between(expected, lo, hi, color="grey", alpha=0.25, lw=0, label=f"{level:.0%} band (uniform)")
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1)
    ax.plot(expected, u, color="C0", lw=1.3, label=f"PIT ({n} values)")
    ax.set(xlabel="uniform quantile", ylabel="sorted PIT value", xlim=(0, 1), ylim=(0, 1), title="PIT QQ plot")
    ax.legend(fontsize=8)
    return png(fig)


def binned_residuals_png(per_target: Mapping[int, Sequence[Sequence[float]]]) -> str:
    """RMS |y − mean| against RMS predictive sd per bin of predicted noise sd, one line per target
    (rows ``[points, RMS noise sd, RMS predictive sd, RMS residual, ratio]``)."""
    fig, (ax,) = _figure(width=4.2, height=3.8)
    top = 0.0
    for target, rows in per_target.items():
        rows = np.asarray(rows, dtype=float)
        ax.plot(rows[:, 2], rows[:, 3], marker="o", ms=4, lw=1.2, label=f"target {target}")
        ax.plot(rows[:, 1], rows[:, 3], marker="x", ms=4, lw=0, color=ax.lines[-1].get_color())
        top = max(top, np.nanmax(rows[:, 1:4]))
    ax.plot([0, top * 1.05], [0, top * 1.05], color="grey", ls="--", lw=1, label="ideal")
    ax.set(xlabel="RMS predictive sd (o) / noise sd (x) in the bin", ylabel="RMS |y − mean|",
           title="residuals by predicted noise sd")
    ax.legend(fontsize=8)
    return png(fig)
