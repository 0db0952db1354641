"""Per-run report sections about the fit itself: identity, convergence, sampler, optimisation.

Every builder takes a :class:`~lab.report.rundata.ReportRun` and returns the section's
HTML body, or raises :class:`~lab.report.rundata.NotApplicable` with a one-line
reason.  Convergence is judged with ArviZ's rank-normalised split R-hat, bulk/tail ESS
and MCSE (Vehtari et al. 2021) — primarily on predictive quantities (``f_mean``,
``log_joint``), because neuron-permutation symmetry makes per-weight R-hat large even
when every prediction has converged.
"""
from __future__ import annotations

import arviz as az
import numpy as np

from inference.evaluation.diagnostics import tree_depth_saturation
from . import plots
from .html import fmt, frame_table, heading, image, join, note, paragraph, table
from .rundata import NotApplicable, ReportRun

__all__ = ["overview", "convergence", "sampler", "optimisation", "summary_frame", "weight_subset"]

#: ArviZ summary columns shown (R-hat is dropped for single-chain runs)
SUMMARY_COLUMNS = ["mean", "sd", "mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat"]
PREDICTIVE_POINTS = 6
ENTRIES_PER_SITE = 3
MAX_SITES = 8
RHAT_LIMIT = 1.01
ESS_PER_CHAIN = 100
_NON_WEIGHT_VARS = ("log_joint", "f_mean")


def summary_frame(data, single_chain: bool, **kwargs):
    """``az.summary`` (mean, sd, MCSE, ESS bulk/tail, R-hat) without R-hat for one chain."""
    with plots.quiet_arviz():
        frame = az.summary(data, kind="all", **kwargs)
    columns = [c for c in SUMMARY_COLUMNS if c in frame and not (single_chain and c == "r_hat")]
    return frame[columns]


def weight_subset(posterior, entries: int = ENTRIES_PER_SITE, max_sites: int = MAX_SITES) -> dict:
    """A readable subset of parameters: ``entries`` evenly spaced scalars of each of ``max_sites`` sites.

    Returns ``{"site[i, j]": array [chain, draw]}``.
    """
    out = {}
    names = [n for n in posterior.data_vars if n not in _NON_WEIGHT_VARS][:max_sites]
    for name in names:
        values = posterior[name].values
        flat = values.reshape(values.shape[0], values.shape[1], -1)
        shape = values.shape[2:]
        for k in np.unique(np.linspace(0, flat.shape[-1] - 1, min(entries, flat.shape[-1])).round().astype(int)):
            index = ", ".join(map(str, np.unravel_index(k, shape))) if shape else ""
            out[f"{name}[{index}]"] = flat[:, :, k]
    return out


def overview(run: ReportRun) -> str:
    """Identity, headline metrics, configuration, data summary and timings."""
    m = run.metrics
    headline = [(k, m[k]) for k in ("rmse", "test_ll", "coverage_50", "coverage_90", "coverage_95", "accuracy",
                                     "nll", "brier", "ece", "sparsity") if k in m]
    timing = [(k, m[k]) for k in ("fit_seconds", "predict_seconds") if k in m]
    timing += [(k, v) for k, v in sorted(run.info.items()) if k.endswith("_seconds") and k not in m]
    parts = [
        heading(_metrics_heading(run)),
        table(headline, ["metric", "value"]) if headline else note(f"no metrics in {run.stored('metrics')}"),
        heading("Timings (seconds)"),
        table(timing, ["phase", "seconds"]) if timing else note("no timings recorded"),
    ]
    spec = {k: v for k, v in run.spec.items() if v not in (None, {}, [])}
    model = run.config.get("model") or {}
    if not run.is_posterior_report:  # a run: its config.json says how it was made
        parts += [heading("Run specification"), table(sorted(spec.items()), ["field", "value"]) if spec else
                  note("config.json holds no run specification")]
    if model:  # a posterior reported from memory: the model it was fitted with
        parts += [heading("Model"), table(list(model.items()), ["field", "value"])]
    options = run.config.get("backend_options") or {}
    resolved = run.info.get("config") or {}
    merged = {**resolved, **options}
    if merged:
        parts += [heading("Backend options (resolved)"), table(sorted(merged.items()), ["option", "value"])]
    data = run.config.get("data") or {}
    if data:
        parts += [heading("Data"), table(sorted(data.items()), ["field", "value"])]
    parts.append(paragraph(f"{m.get('num_random', '?')} random parameters; {m.get('num_chains', '?')} chain(s) × "
                           f"{m.get('num_draws', '?')} draws exported to {run.stored('idata')}."))
    return join(parts)


def _metrics_heading(run: ReportRun) -> str:
    """What the headline metrics are about: held-out test points, the fit's own points, or points given."""
    kind = run.evaluation["kind"]
    count = run.metrics.get("n_test")
    if kind == "test":
        return "Test metrics: held-out points (original units)"
    if kind == "in-sample":
        return f"In-sample metrics: the fit's own {count} training points, not held out (original units)"
    return f"Metrics on the {count} points passed to the report (original units)"


def convergence(run: ReportRun) -> str:
    """ArviZ summary of predictive quantities and a parameter subset; trace and rank plots."""
    idata = run.idata
    post = idata.posterior
    chains, draws = post.sizes["chain"], post.sizes["draw"]
    members = idata.attrs.get("chains") == "members"
    single = chains < 2 or members  # no R-hat between the members of a mixture either
    parts = [paragraph(f"{chains} chain(s) × {draws} draws. R-hat (rank-normalised split R-hat), ESS bulk/tail and "
                       f"MCSE from ArviZ; the predictive quantities are the network output f at a few of "
                       f"{run.evaluated()} (f_mean) and the log joint density.")]
    if chains < 2:
        parts.append(note("R-hat: not applicable — 1 chain (independent draws, e.g. from a variational posterior); "
                          "R-hat needs at least 2 chains."))
    elif members:
        parts.append(note(f"R-hat: not applicable — the {chains} chains are the members of a mixture (an ensemble or "
                          "MultiSWAG), each in its own mode by design; their spread is the member disagreement, not a "
                          "failure to mix."))
    points = post["f_mean"].coords["predictive_point"].values
    pick = points[np.unique(np.linspace(0, len(points) - 1, min(PREDICTIVE_POINTS, len(points))).round().astype(int))]
    coords = {"predictive_point": pick}
    if "class" in post["f_mean"].dims:
        coords["class"] = post["f_mean"].coords["class"].values[:3]
    predictive = summary_frame(idata, single, var_names=["log_joint", "f_mean"], coords=coords)
    parts += [heading("Predictive quantities and log joint"), frame_table(predictive)]
    parts += _flags(predictive, chains, run.metrics)
    subset = weight_subset(post)
    if subset:
        weights = summary_frame(subset, single)
        parts += [heading("A readable subset of parameters"),
                  paragraph("Per-weight R-hat is expected to be large for multi-chain neural-network posteriors "
                            "(neurons can be permuted between chains); judge convergence on the predictive rows."),
                  frame_table(weights)]
    else:
        parts.append(note(f"parameter summary: not available — the weights were not exported to "
                          f"{run.stored('idata')} (too many random parameters)."))
    trace_coords = _most_variable(post["f_mean"], pick)
    # float64: ArviZ's KDE cannot bin float32 draws whose spread is tiny relative to their size
    traced = post[["log_joint", "f_mean"]].sel(trace_coords).astype("float64")
    parts += [heading("Trace plots"),
              _plot(az.plot_trace, "trace plots", traced, compact=False, figsize=(9, 5)),
              heading("Rank plots")]
    if single:
        parts.append(note("rank plots: not applicable — they compare the rank histograms of several chains."))
    else:
        parts.append(_plot(az.plot_rank, "rank plots", traced, figsize=(9, 2.8)))
    return join(parts)


def _most_variable(f_mean, points, count: int = 2) -> dict:
    """Coords of the ``count`` predictive points (and the class) whose draws spread the most."""
    sd = f_mean.sel(predictive_point=points).std(["chain", "draw"])
    coords = {}
    if "class" in sd.dims:
        best_class = int(sd.max("predictive_point").argmax("class"))
        coords["class"] = [sd.coords["class"].values[best_class]]
        sd = sd.isel({"class": best_class})
    other = [d for d in sd.dims if d != "predictive_point"]
    spread = (sd.max(other) if other else sd).values
    coords["predictive_point"] = sorted(points[np.argsort(-spread)[:count]])
    return coords


def _plot(plot, alt: str, *args, **kwargs) -> str:
    """An ArviZ plot, or a one-line note when ArviZ cannot draw it (e.g. draws without spread)."""
    try:
        return image(plots.arviz_png(plot, *args, **kwargs), alt)
    except (ValueError, np.linalg.LinAlgError) as err:
        return note(f"{alt}: ArviZ could not draw them ({err}).", "warn")


def _flags(frame, chains: int, metrics: dict) -> list:
    out = []
    if "r_hat" in frame:
        high = int((frame["r_hat"] > RHAT_LIMIT).sum())
        if high:
            out.append(note(f"R-hat > {RHAT_LIMIT} for {high} of these quantities: the chains disagree.", "warn"))
    low = int((frame["ess_bulk"] < ESS_PER_CHAIN * chains).sum())
    if low:
        out.append(note(f"ESS bulk < {ESS_PER_CHAIN} per chain for {low} quantities: estimates are noisy.", "warn"))
    over_all = [(k, metrics.get(k)) for k in ("rhat_max", "ess_bulk_min", "ess_tail_min") if k in metrics]
    if over_all:
        out.append(paragraph("Over all exported predictive quantities: "
                             + ", ".join(f"{k} = {fmt(v)}" for k, v in over_all) + "."))
    return out


def sampler(run: ReportRun) -> str:
    """HMC/NUTS diagnostics: divergences, energy (BFMI), step size, tree depth, acceptance rate."""
    stats = getattr(run.idata, "sample_stats", None)
    if stats is None or not stats.data_vars:
        raise NotApplicable(f"backend {run.backend!r} records no per-draw sampler statistics "
                            "(energy, divergences, step size and tree depth come from HMC/NUTS).")
    chains = stats.sizes["chain"]
    header, columns = ["chain"], []
    for name, label, reduce in (("diverging", "divergences", np.sum), ("acceptance_rate", "mean acceptance", np.mean),
                                ("step_size", "median step size", np.median), ("tree_depth", "mean tree depth", np.mean),
                                ("tree_depth", "max tree depth", np.max)):
        if name in stats:
            header.append(label)
            columns.append(reduce(stats[name].values.reshape(chains, -1).astype(float), axis=1))
    if "energy" in stats:
        header.append("BFMI")
        with plots.quiet_arviz():
            columns.append(az.bfmi(run.idata))
    parts = []
    if columns:
        rows = [[c, *(col[c] for col in columns)] for c in range(chains)]
        parts.append(table(rows, header))
    max_depth = (run.info.get("config") or {}).get("max_tree_depth")
    if "tree_depth" in stats and max_depth:
        share = tree_depth_saturation(stats["tree_depth"].values, max_depth)
        if share > 0.05:
            parts.append(note(f"{share:.0%} of draws hit the maximum tree depth {max_depth}: trajectories were cut "
                              "short (a smaller step size forced by curvature); sampling is slow and may be "
                              "inefficient.", "warn"))
    if "warmup_divergences" in run.info:
        parts.append(paragraph(f"Divergences during warm-up (not in the draws): {run.info['warmup_divergences']}."))
    if "diverging" in stats:
        total = int(stats["diverging"].values.sum())
        parts.append(note(f"{total} divergent transitions: the sampler could not follow the posterior's curvature "
                          "there; results near them are biased.", "warn") if total else
                     paragraph("No divergent transitions."))
    if "energy" in stats:
        parts += [heading("Energy"), paragraph("Marginal energy vs energy transitions; BFMI < 0.3 means momentum "
                                               "resampling explores the energy levels poorly."),
                  image(plots.arviz_png(az.plot_energy, run.idata, figsize=(5, 3.2)), "energy plot")]
    else:
        parts.append(note("energy plot: not applicable — no energy statistic (not an HMC/NUTS run)."))
    traced = {k: stats[k].values for k in ("step_size", "tree_depth", "acceptance_rate", "lp") if k in stats}
    if traced:
        parts += [heading("Per-draw statistics"),
                  paragraph("Step size, tree depth, acceptance rate and log posterior density (lp), where recorded."),
                  image(plots.stat_traces_png(traced), "sampler stats")]
    others = [k for k in stats.data_vars if k not in ("diverging", "energy", *traced)]
    if others:
        parts.append(paragraph("Other recorded statistics: " + ", ".join(
            f"{k} (mean {fmt(float(np.mean(stats[k].values)))})" for k in others)))
    return join(parts)


def optimisation(run: ReportRun) -> str:
    """VI: the loss / ELBO / KL curves and the KL-annealing and learning-rate schedules."""
    history = run.info.get("history") or {}
    if not history.get("loss"):
        raise NotApplicable(f"backend {run.backend!r} records no optimisation history (ELBO curves come from "
                            "variational backends).")
    last = {k: history[k][-1] for k in ("loss", "expected_log_likelihood", "kl", "kl_weight", "lr") if history.get(k)}
    if "expected_log_likelihood" in last and "kl" in last:
        last["elbo"] = last["expected_log_likelihood"] - last["kl"]
    config = run.info.get("config") or {}
    schedule = {k: config[k] for k in ("epochs", "kl_warmup_epochs", "kl_anneal_epochs", "pretrain_epochs", "lr",
                                       "lr_schedule", "num_particles", "mc_kl_samples") if k in config}
    parts = [paragraph("Per-epoch averages over minibatches; the loss is −(N/n)·Σ E_q[log p(y|x,w)] + β·KL(q‖p) "
                       "with the KL weight β of the annealing schedule; the ELBO uses β = 1."),
             table(sorted(last.items()), ["final epoch", "value"])]
    if schedule:
        parts.append(table(sorted(schedule.items()), ["schedule option", "value"]))
    parts.append(image(plots.history_png(history), "optimisation history"))
    return join(parts)
