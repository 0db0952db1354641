"""Per-run report sections about predictions: LOO/WAIC, calibration, 1-D predictive bands.

* PSIS-LOO and WAIC (Vehtari, Gelman & Gabry 2017) from the pointwise log-likelihood of
  the *training* points (the data the posterior was conditioned on), with the Pareto-k̂
  diagnostic: k̂ above ArviZ's sample-size-dependent threshold (≤ 0.7) marks points whose
  importance weights have too heavy a tail for a reliable estimate.  Next to it, the test
  lppd Σ_n log (1/S) Σ_s p(y_n | w_s) over the held-out points of ``posterior.nc``.
* Regression calibration: the PIT value u_n = F(y_n | data) of each test target under the
  predictive mixture; target n is inside the central level-p interval iff
  (1−p)/2 ≤ u_n ≤ (1+p)/2, which gives the coverage-vs-nominal curve.  Uniform PIT values
  ⇔ calibrated.
* Classification calibration: reliability diagram and ECE with 15 equal-width confidence
  bins (Guo et al. 2017), from :func:`inference.metrics.expected_calibration_error`.
"""
from __future__ import annotations

import arviz as az
import numpy as np
import torch

from inference.metrics import expected_calibration_error
from . import plots
from .html import fmt, image, note, paragraph, table
from .rundata import NotApplicable, Run

__all__ = ["loo_waic", "loo_data", "test_lppd", "calibration", "bands", "pit_values", "coverage_curve", "reliability_bins", "LEVELS"]

LEVELS = np.round(np.append(np.arange(0.05, 1.0, 0.05), 0.99), 2)
ECE_BINS = 15
GRID_POINTS = 300


def loo(idata):
    """``az.loo(pointwise=True)`` and ``az.waic`` with their warnings captured (not printed)."""
    with plots.quiet_arviz():
        return az.loo(idata, pointwise=True), az.waic(idata)


def loo_data(run: Run) -> tuple[object, str]:
    """The InferenceData to run PSIS-LOO on, and a sentence saying which data it holds.

    LOO needs the log-likelihood of the points the posterior was fitted to: the training
    data (re-created from the run spec).  When the posterior or the data cannot be loaded,
    the test-set log-likelihood of ``posterior.nc`` is used, with a warning.
    """
    try:
        idata = run.train_idata
        n = idata.log_likelihood.sizes["obs_id"]
        total = run.dataset.n_train
        which = f"all {n}" if n == total else f"a seeded random {n} of {total}"
        return idata, f"PSIS-LOO and WAIC on {which} training points (the data the posterior was fitted to)."
    except NotApplicable as reason:
        return run.idata, (f"PSIS-LOO and WAIC on the test-set log-likelihood of posterior.nc, because {reason}. "
                           "The posterior was not fitted to these points, so this LOO is pessimistic; "
                           "the test lppd is the direct held-out score.")


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


def loo_waic(run: Run) -> str:
    if "log_likelihood" not in run.idata.groups():
        raise NotApplicable("posterior.nc holds no pointwise log-likelihood")
    idata, source = loo_data(run)
    result, waic = loo(idata)
    n = result.n_data_points
    lppd, n_test = test_lppd(run.idata)
    rows = [("elpd_loo", result.elpd_loo, result.se, result.elpd_loo / n), ("p_loo", result.p_loo, None, None),
            ("elpd_waic", waic.elpd_waic, waic.se, waic.elpd_waic / n), ("p_waic", waic.p_waic, None, None),
            (f"test lppd ({n_test} held-out points)", lppd, None, lppd / n_test)]
    counts = pareto_k_counts(result)
    parts = [paragraph(f"{source} {result.n_samples} draws; log scores in original units. elpd_loo estimates the "
                       "log predictive density of new data; its per-point value can be read against the test "
                       "lppd per point."),
             table(rows, ["quantity", "estimate", "SE", "per point"]),
             "<h3>Pareto k̂ diagnostic</h3>", table(counts.items(), ["range", "points"])]
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
    return "\n".join(parts)


def pit_values(run: Run) -> tuple[np.ndarray, str]:
    """PIT values ``[N·O]`` of the test targets and where they come from.

    Exact from the saved posterior's predictive mixture CDF when the posterior and the data
    can be loaded; otherwise the share of posterior-predictive draws in ``posterior.nc`` at or
    below each observation (Monte Carlo, S draws).
    """
    try:
        pit = run.prediction.pit
        if pit is not None:
            return pit.numpy().ravel(), "exact predictive mixture CDF"
    except NotApplicable:
        pass
    idata = run.idata
    draws = idata.posterior_predictive["obs"].values
    observed = idata.observed_data["obs"].values
    draws = draws.reshape(-1, *observed.shape)
    return (draws <= observed[None]).mean(0).ravel(), f"{draws.shape[0]} posterior-predictive draws"


def coverage_curve(pit: np.ndarray, levels=LEVELS) -> np.ndarray:
    """Empirical coverage of central intervals at each nominal level, from PIT values."""
    pit = np.asarray(pit)
    return np.array([np.mean((pit >= (1 - p) / 2) & (pit <= (1 + p) / 2)) for p in levels])


def reliability_bins(probs: torch.Tensor, labels: torch.Tensor, num_bins: int = ECE_BINS):
    """Non-empty equal-width confidence bins: mean confidence, accuracy and count per bin."""
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).float()
    index = torch.bucketize(confidence, torch.linspace(0, 1, num_bins + 1)[1:-1], right=True)
    rows = [(float(confidence[index == b].mean()), float(correct[index == b].mean()), int((index == b).sum()))
            for b in range(num_bins) if (index == b).any()]
    return tuple(np.array(col) for col in zip(*rows))


def calibration(run: Run) -> str:
    if run.task == "classification":
        return _classification_calibration(run)
    pit, source = pit_values(run)
    empirical = coverage_curve(pit)
    rows = [(f"{p:.0%}", run.metrics.get(f"coverage_{int(round(p * 100))}"), empirical[list(LEVELS).index(p)])
            for p in (0.5, 0.9, 0.95)]
    return "\n".join([
        paragraph(f"Coverage of central predictive intervals (observation noise included) against their nominal "
                  f"level; PIT values from the {source}. Curves below the diagonal are over-confident."),
        table(rows, ["nominal", "coverage (metrics.json)", "coverage (this curve)"]),
        image(plots.coverage_png({run.name: (LEVELS, empirical)}), "coverage vs nominal"),
        image(plots.pit_png(pit), "PIT histogram"),
    ])


def _classification_calibration(run: Run) -> str:
    pred = run.prediction
    labels = run.test_targets()
    ece = expected_calibration_error(pred, labels, num_bins=ECE_BINS)
    curve = reliability_bins(pred.mean, labels)
    return "\n".join([
        paragraph(f"Reliability diagram with {ECE_BINS} equal-width confidence bins (marker size ∝ points per bin); "
                  "points below the diagonal are over-confident. (Coverage curves apply to regression.)"),
        table([("ECE", ece), ("accuracy", run.metrics.get("accuracy"))], ["metric", "value"]),
        image(plots.reliability_png({run.name: curve}), "reliability diagram"),
    ])


def bands(run: Run) -> str:
    """Predictive mean, 50 % and 90 % central bands and the epistemic ±2 sd of f over a 1-D grid."""
    if run.task != "regression":
        raise NotApplicable("predictive bands are drawn for regression only")
    data = run.dataset
    if data.x_train.dim() != 2 or data.input_dim != 1:
        raise NotApplicable(f"inputs have shape {tuple(data.x_train.shape[1:])}; bands are drawn for 1-D inputs only")
    x_all = torch.cat([data.x_train, data.x_test])
    low, high = float(x_all.min()), float(x_all.max())
    pad = 0.05 * (high - low)
    grid = torch.linspace(low - pad, high + pad, GRID_POINTS).unsqueeze(-1)
    pred = run.posterior.predict(grid, seed=run.seed)
    (lo50, hi50), (lo90, hi90) = pred.interval(0.5), pred.interval(0.9)
    mean, sd_f = pred.mean[:, 0], pred.epistemic_sd[:, 0]
    x_train, x_test, x_grid = (data.x_to_original(x)[:, 0].numpy() for x in (data.x_train, data.x_test, grid))
    picture = plots.bands_png(
        (x_train, data.y_train_original()[:, 0].numpy()),
        (x_test, data.y_test_original()[:, 0].numpy()),
        x_grid, mean.numpy(),
        {"90 % predictive": (lo90[:, 0].numpy(), hi90[:, 0].numpy()),
         "50 % predictive": (lo50[:, 0].numpy(), hi50[:, 0].numpy())},
        epistemic=((mean - 2 * sd_f).numpy(), (mean + 2 * sd_f).numpy()),
    )
    extra = note(f"showing output 0 of {data.output_dim}") if data.output_dim > 1 else ""
    return "\n".join([paragraph(f"{pred.num_samples} posterior draws on {GRID_POINTS} grid points, original units; "
                                "bands include observation noise, the dotted lines show the network's own "
                                f"(epistemic) spread. Widest epistemic sd: {fmt(float(sd_f.max()))}."),
                      extra, image(picture, "predictive bands")])
