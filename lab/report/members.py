"""Report section on the members of a multi-member posterior (ensemble, MultiSWAG, multi-chain MCMC).

A posterior of C > 1 chains ("members") predicts by the equally weighted mixture of all
its draws — one Bayesian model average.  The section shows what :mod:`inference.evaluation.member_metrics`
stored in ``metrics.json`` at fit time: each member's test metrics on its own, their mean,
the mixture's, and the members' disagreement (for regression the spread of the members'
predictive means relative to the mixture's predictive sd, in [0, 1]; for classification the
mutual information between prediction and member, in nats — the ensemble disagreement of
Lakshminarayanan et al. 2017, the BALD quantity of Houlsby et al. 2011).  Nothing is
predicted again.
"""
from __future__ import annotations

import math

import pandas as pd

from . import plots
from .html import fmt, frame_table, image, join, paragraph
from .rundata import NotApplicable, ReportRun

__all__ = ["members", "members_frame", "disagreement_reading"]


def members_frame(stored: dict) -> pd.DataFrame:
    """One row per member, then the members' mean and the mixture; one column per stored metric."""
    per_member = stored["per_member"]
    rows = {f"member {c}": m for c, m in enumerate(per_member)}
    rows["mean of members"] = stored["member_mean"]
    rows["mixture (BMA)"] = stored["mixture"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(per_member[0]))


def disagreement_reading(value: float, task: str, num_classes: int | None = None) -> str:
    """One sentence on what the stored disagreement ``value`` means for ``task``."""
    if task == "regression":
        return (f"Disagreement {fmt(value, 3)}: the members' predictive means spread (sd across members) by "
                f"{value:.0%} of the mixture's predictive sd on average over test points, in [0, 1]; near 0 the "
                "members agree, so the mixture adds little over one member; near 1 the members' spread dominates "
                "the predictive uncertainty.")
    bound = f" (at most ln K = {fmt(math.log(num_classes), 3)} for K = {num_classes} classes)" if num_classes else ""
    return (f"Disagreement {fmt(value, 3)} nats: the mutual information between the prediction and the member, "
            f"averaged over test points{bound}; near 0 the members predict the same class probabilities, so the "
            "mixture adds little over one member; larger values mean the members' disagreement is a large part of "
            "the predictive uncertainty.")


def members(run: ReportRun) -> str:
    """Per-member and mixture test metrics, the members' disagreement and a test-LL plot."""
    stored = run.metrics.get("members")
    if not stored:
        chains = run.metrics.get("num_chains") or run.idata.posterior.sizes["chain"]
        if chains < 2:
            raise NotApplicable("one member")
        raise NotApplicable(f"{chains} chains, but metrics.json holds no member metrics (written by runs that "
                            "evaluate each chain of a multi-chain posterior)")
    frame = members_frame(stored)
    task = run.task
    num_classes = None
    if task == "classification" and "f_mean" in run.idata.posterior and "class" in run.idata.posterior["f_mean"].dims:
        num_classes = int(run.idata.posterior["f_mean"].sizes["class"])
    mixture, mean = stored["mixture"]["test_ll"], stored["member_mean"]["test_ll"]
    parts = [
        paragraph(f"{stored['num_members']} members (chains); the posterior predicts by their equally weighted "
                  "mixture, the Bayesian model average over all draws. Each member's metrics use that member's "
                  "draws only, on the same test set (original units)."),
        frame_table(frame, "member"),
        paragraph(disagreement_reading(stored["disagreement"], task, num_classes)),
        paragraph(f"Mixture test LL {fmt(mixture)} vs {fmt(mean)} for the average member "
                  f"({'+' if mixture >= mean else ''}{fmt(mixture - mean, 3)} nats per test point)."),
        image(_test_ll_png([m["test_ll"] for m in stored["per_member"]], mixture), "per-member test LL"),
    ]
    return join(parts)


def _test_ll_png(per_member: list[float], mixture: float) -> str:
    """Each member's test LL as a point, the mixture's as a horizontal line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(3.5, 0.35 * len(per_member) + 2), 2.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(range(len(per_member)), per_member, "o", color="C0", label="member")
    ax.axhline(mixture, color="C3", lw=1.5, label="mixture (BMA)")
    ax.set(xlabel="member", ylabel="test log-likelihood per point", xticks=range(len(per_member)))
    ax.legend(fontsize=8)
    return plots.png(fig)
