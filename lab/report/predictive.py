"""Per-run report sections about predictions: LOO/WAIC, calibration, 1-D predictive bands.

All of them read what the run stored; none predicts again.

* PSIS-LOO (Vehtari, Gelman & Gabry 2017) and WAIC (Watanabe 2010) from the pointwise
  log-likelihood of the *training* points in ``train.nc`` (the data the posterior was
  conditioned on), with the Pareto-k̂ diagnostic: k̂ above ArviZ's sample-size-dependent
  threshold (≤ 0.7) marks points whose importance weights have too heavy a tail for a
  reliable estimate.  Next to it, the test lppd Σ_n log (1/S) Σ_s p(y_n | w_s) over the
  held-out points of ``posterior.nc``.
* Regression calibration: the PIT value u_n = F(y_n | data) of each test target under the
  predictive mixture (Gneiting & Raftery 2007), stored by the run; target n is inside the
  central level-p interval iff (1−p)/2 ≤ u_n ≤ (1+p)/2, which gives the coverage-vs-nominal
  curve.  Uniform PIT values ⇔ calibrated.
* Classification calibration: reliability diagram and ECE with 15 equal-width confidence
  bins (Guo et al. 2017) of the stored mean class probabilities.
"""
from __future__ import annotations

import arviz as az
import numpy as np
import torch

from inference.evaluation.metrics import calibration_bins, coverage_from_pit, ece_from_probs
from . import plots
from .html import fmt, heading, image, join, note, paragraph, table
from .rundata import NotApplicable, ReportRun

__all__ = ["loo_waic", "loo_data", "test_lppd", "calibration", "bands", "pit_values", "coverage_curve",
           "reliability_curve", "LEVELS"]

LEVELS = np.round(np.append(np.arange(0.05, 1.0, 0.05), 0.99), 2)
ECE_BINS = 15


def loo(idata):
    """``az.loo(pointwise=True)`` and ``az.waic`` with their warnings captured (not printed)."""
    with plots.quiet_arviz():
        return az.loo(idata, pointwise=True), az.waic(idata)


def loo_data(run: ReportRun) -> tuple[object, str]:
    """The training-set InferenceData (``train.nc``) to run PSIS-LOO on, and a sentence saying what it holds.

    Raises :class:`NotApplicable` when the points are known not to be the fit's own (tensors passed to a
    report whose fingerprint differs from the fit's): LOO estimates out-of-sample fit from those only."""
    train = run.evaluation["train"]
    if train == "other":
        raise NotApplicable("the points passed to the report as training data are not the ones the posterior was "
                            "fitted to (their fingerprint differs from the fit's); PSIS-LOO and WAIC estimate "
                            "out-of-sample fit from the fitted points: pass the tensors given to fit, data=(x, y)")
    idata = run.train_idata
    n = idata.log_likelihood.sizes["obs_id"]
    total = run.n_train
    which = f"all {n}" if total in (None, n) else f"a seeded random {n} of {total}"
    if train == "unknown":
        return idata, (f"PSIS-LOO and WAIC on {which} points passed to the report as training data (the posterior "
                       "records no fingerprint of its training data, e.g. fitted from a DataLoader, so they could "
                       "not be checked to be the points it was fitted to).")
    return idata, f"PSIS-LOO and WAIC on {which} training points (the data the posterior was fitted to)."


def test_lppd(idata) -> tuple[float, int]:
    """Σ_n log (1/S) Σ_s p(y_n | w_s) over the test points of ``posterior.nc``, and their number."""
    ll = idata.log_likelihood["obs"].values
    ll = ll.reshape(-1, ll.shape[-1])
    lppd = torch.logsumexp(torch.as_tensor(ll, dtype=torch.float64), 0) - np.log(ll.shape[0])
    return float(lppd.sum()), ll.shape[-1]


def pareto_k_counts(result) -> dict:
    """Counts of Pareto k̂ in good / bad / very bad ranges (ArviZ's sample-size-dependent threshold)."""
    k = np.asarray(result.pareto_k)
    good = float(getattr(result, "good_k", 0.7))
    return {f"good (k ≤ {good:.2f})": int((k <= good).sum()), f"bad ({good:.2f} < k ≤ 1)": int(((k > good) & (k <= 1)).sum()),
            "very bad (k > 1)": int((k > 1).sum())}


def loo_waic(run: ReportRun) -> str:
    if "log_likelihood" not in run.idata.groups():
        raise NotApplicable(f"{run.stored('idata')} holds no pointwise log-likelihood")
    idata, source = loo_data(run)
    result, waic = loo(idata)
    n = result.n_data_points
    lppd, n_test = test_lppd(run.idata)
    rows = [("elpd_loo", result.elpd_loo, result.se, result.elpd_loo / n), ("p_loo", result.p_loo, None, None),
            ("elpd_waic", waic.elpd_waic, waic.se, waic.elpd_waic / n), ("p_waic", waic.p_waic, None, None),
            (f"{run.evaluation_word} lppd ({n_test} points)", lppd, None, lppd / n_test)]
    counts = pareto_k_counts(result)
    if run.idata.log_likelihood.attrs.get("point_mass") == 1:
        draws = "a point mass (LOO is the plug-in score Σ log p(y|ŵ), p_loo = 0)"
    else:
        draws = f"{result.n_samples} draws"
    if run.evaluation["kind"] == "test":
        against = "its per-point value can be read against the test lppd per point."
    elif run.evaluation["kind"] == "in-sample":
        against = ("the in-sample lppd is the fit's own points scored by the posterior fitted to them, so it is "
                   "optimistic: it is no estimate of out-of-sample fit.")
    else:
        against = "the evaluation lppd scores the points passed to the report."
    parts = [paragraph(f"{source} {draws}; log scores in original units. elpd_loo estimates the "
                       f"log predictive density of new data; {against}"),
             table(rows, ["quantity", "estimate", "SE", "per point"]),
             heading("Pareto k̂ diagnostic"), table(counts.items(), ["range", "points"])]
    bad = sum(v for k, v in counts.items() if not k.startswith("good"))
    if bad:
        parts.append(note(f"Pareto k warning: {bad} of {n} points have k̂ above the threshold — "
                          "PSIS-LOO is unreliable for them (influential or poorly predicted points).", "warn"))
    if not np.isfinite(result.elpd_loo):
        parts.append(note("elpd_loo is not finite: some points have extreme log-likelihoods.", "warn"))
    if getattr(waic, "warning", False):
        parts.append(note("WAIC warning: the posterior variance of some pointwise log densities exceeds 0.4, "
                          "so WAIC may be unreliable; prefer LOO.", "warn"))
    if run.idata.attrs.get("posterior_kind") == "variational":
        parts.append(note("The draws come from a variational approximation q, not the exact posterior; "
                          "read LOO as a score of q's predictive distribution."))
    parts.append(image(plots.arviz_png(az.plot_khat, result, show_hlines=True, figsize=(6, 2.8)), "Pareto k"))
    return join(parts)


def pit_values(run: ReportRun) -> np.ndarray:
    """The run's PIT values ``[N·O]`` of the test targets (exact predictive mixture CDF)."""
    predictions = run.predictions()
    if "pit" not in predictions:
        raise NotApplicable("the stored prediction holds no PIT values (a classification run, or made without targets)")
    return predictions["pit"].values.ravel()


def coverage_curve(pit: np.ndarray, levels=LEVELS) -> np.ndarray:
    """Empirical coverage of central intervals at each nominal level, from PIT values."""
    return np.array([coverage_from_pit(torch.as_tensor(pit), float(p)) for p in levels])


def reliability_curve(run: ReportRun) -> tuple:
    """``(confidence, accuracy, share)`` per non-empty bin of the run's stored class probabilities."""
    probs, labels = _class_probabilities(run)
    return tuple(c.numpy() for c in calibration_bins(probs, labels, ECE_BINS))


def _class_probabilities(run: ReportRun) -> tuple[torch.Tensor, torch.Tensor]:
    predictions = run.predictions()
    if "probs" not in predictions:
        raise NotApplicable("the stored prediction holds no class probabilities")
    labels = torch.as_tensor(run.idata.observed_data["obs"].values).long()
    return torch.as_tensor(predictions["probs"].values), labels


def calibration(run: ReportRun) -> str:
    if run.task == "classification":
        return _classification_calibration(run)
    pit = pit_values(run)
    empirical = coverage_curve(pit)
    rows = [(f"{p:.0%}", run.metrics.get(f"coverage_{int(round(p * 100))}"), empirical[list(LEVELS).index(p)])
            for p in (0.5, 0.9, 0.95)]
    return join([
        paragraph("Coverage of central predictive intervals (observation noise included) against their nominal "
                  f"level; PIT values of {pit.size} targets of {run.evaluated()} under the run's predictive "
                  "mixture CDF. Curves below the diagonal are over-confident."),
        table(rows, ["nominal", "coverage (recorded metrics)", "coverage (this curve)"]),
        image(plots.coverage_png({"this run": (LEVELS, empirical)}), "coverage vs nominal"),
        image(plots.pit_png(pit), "PIT histogram"),
    ])


def _classification_calibration(run: ReportRun) -> str:
    probs, labels = _class_probabilities(run)
    ece = ece_from_probs(probs, labels, ECE_BINS)
    return join([
        paragraph(f"Reliability diagram with {ECE_BINS} equal-width confidence bins (marker size ∝ points per bin); "
                  "points below the diagonal are over-confident. (Coverage curves apply to regression.)"),
        table([("ECE", ece), ("accuracy", run.metrics.get("accuracy"))], ["metric", "value"]),
        image(plots.reliability_png({"this run": reliability_curve(run)}), "reliability diagram"),
    ])


def _inputs(idata) -> np.ndarray:
    if "constant_data" not in idata.groups() or "x" not in idata.constant_data:
        raise NotApplicable("the inputs are not 1-D (no constant_data x in the InferenceData)")
    return idata.constant_data["x"].values


def bands(run: ReportRun) -> str:
    """Predictive mean, 50 % and 90 % central bands and the epistemic ±2 sd of f at the test inputs."""
    if run.task != "regression":
        raise NotApplicable("predictive bands are drawn for regression only")
    x = _inputs(run.idata)
    stored = run.predictions()
    order = np.argsort(x, kind="stable")
    first = {name: stored[name].values[order, 0] for name in
             ("mean", "epistemic_sd", "lower_50", "upper_50", "lower_90", "upper_90")}
    y_test = run.idata.observed_data["obs"].values
    try:
        train = (_inputs(run.train_idata), run.train_idata.observed_data["obs"].values[:, 0])
    except NotApplicable:
        train = None
    mean, sd_f = first["mean"], first["epistemic_sd"]
    picture = plots.bands_png(
        train, (x, y_test[:, 0]), x[order], mean,
        {"90 % predictive": (first["lower_90"], first["upper_90"]),
         "50 % predictive": (first["lower_50"], first["upper_50"])},
        epistemic=(mean - 2 * sd_f, mean + 2 * sd_f), xlabel="x (network input units)",
        test_label={"test": "test", "in-sample": "evaluated (in-sample)"}.get(run.evaluation["kind"], "evaluated"),
    )
    outputs = y_test.shape[1]
    extra = note(f"showing output 0 of {outputs}") if outputs > 1 else ""
    return join([paragraph(f"The run's prediction ({stored.attrs.get('num_samples', '?')} posterior draws) at "
                                f"{run.evaluated(x.size)}, targets in original units; bands include observation noise, "
                                "the dotted lines show the network's own (epistemic) spread. Widest epistemic sd: "
                                f"{fmt(float(sd_f.max()))}."),
                      extra, image(picture, "predictive bands")])
