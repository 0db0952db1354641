"""The observation-model section of a regression run: which likelihood, its latents, and whether it fits.

Read from what the run stored, never predicted again:

* the likelihood and its options — the saved posterior's (``posterior/``, which also gives the
  target scale for original units), or, for a run without one, rebuilt from the run spec
  (``config.json``: ``likelihood``, ``noise``, ``likelihood_options``) with
  :func:`zoo.likelihoods.likelihood_from_spec`, as the run resolved them;
* the posterior of its latents (``noise_precision`` shown as the noise sd / Student-t scale
  ``1/√precision`` in original units, and ``dof`` ν) from the draws in ``posterior.nc``:
  mean, central 90 % interval beside the prior's, bulk / tail ESS and, with ≥ 2 chains, R-hat
  (Vehtari et al. 2021);
* the residual check, from the per-point test summaries (``predictions``: ``mean``, ``sd``,
  ``epistemic_sd``, ``pit``) and the targets (``observed_data``): a QQ plot of the PIT values
  against the uniform with pointwise 90 % bands of uniform order statistics (Beta(i, n + 1 − i)),
  the share of points in the PIT tails against their nominal share (Gneiting & Raftery 2007), and
  for a heteroscedastic run the RMS residual |y − mean| against the RMS predictive sd in bins of
  the predicted noise sd.

The predicted noise sd per point is sqrt(E_s[σ²_s]) = sqrt(sd² − epistemic_sd²): the stored
predictive sd is sqrt(Var_s[f] + E_s[σ²]) and the epistemic sd is sqrt(Var_s[f]) (both population
variances over the same draws, :class:`inference.prediction.Prediction`), so their difference is
the mean noise variance in original units.
"""
from __future__ import annotations

import numpy as np
import scipy.stats

import arviz as az
from zoo.likelihoods import likelihood_from_spec

from . import plots
from .html import fmt, heading, image, join, note, paragraph, table
from .rundata import NotApplicable, ReportRun
from .sections import RHAT_LIMIT

__all__ = ["observation_model", "run_likelihood", "fixed_rows", "latent_rows", "pit_tail_rows", "noise_sd",
           "binned_residuals"]

#: central interval of the latents' posterior and prior
LEVEL = 0.9
#: (label, nominal share, test on the PIT values) of the tail check
TAIL_REGIONS = [
    ("PIT < 0.05 (lower 5 % tail)", 0.05, lambda u: u < 0.05),
    ("PIT > 0.95 (upper 5 % tail)", 0.05, lambda u: u > 0.95),
    ("PIT < 0.005 or > 0.995 (outer 1 %)", 0.01, lambda u: (u < 0.005) | (u > 0.995)),
    ("0.25 ≤ PIT ≤ 0.75 (central 50 %)", 0.5, lambda u: (u >= 0.25) & (u <= 0.75)),
]
NOISE_BINS = 5
#: a tail share this many binomial standard errors from its nominal value is flagged
FLAG_SE = 3.0


def run_likelihood(run: ReportRun):
    """``(likelihood, target_scale, source)``: the run's :class:`~zoo.likelihoods.Likelihood` with its resolved
    options and the ``[T]`` target scale (original = standardised × scale; ``None`` when unknown).

    The saved posterior's likelihood when the run has one (exactly what was fitted); otherwise the
    likelihood rebuilt from the run spec, whose noise is then shown in standardised units.
    """
    try:
        bnn = run.posterior.bnn
    except NotApplicable:
        if "spec" not in run.config:
            raise NotApplicable("the run has neither a saved posterior nor a run spec naming its likelihood") from None
        spec = run.spec
        likelihood = likelihood_from_spec(spec.get("likelihood"), run.task, spec.get("noise", "learned"),
                                          spec.get("likelihood_options") or {})
        return likelihood, None, "the run spec (config.json)"
    return bnn.likelihood, bnn.target_scale.detach().cpu().double().numpy(), "the saved posterior"


def fixed_rows(likelihood, target_scale=None) -> list:
    """Rows ``[quantity, standardised value, original value per target]`` of the likelihood's fixed (not
    learned) noise sd, Student-t scale and degrees of freedom."""
    options = likelihood.options()

    def original(value):
        return "—" if target_scale is None else ", ".join(fmt(value * float(v)) for v in target_scale)

    rows = []
    if likelihood.name == "gaussian" and not options["learn_noise"]:
        rows.append(["noise sd σ", options["noise_sd"], original(options["noise_sd"])])
    if likelihood.name == "studentt":
        if not options["learn_scale"]:
            rows.append(["scale s", options["scale"], original(options["scale"])])
        if not options["learn_dof"]:
            rows.append(["degrees of freedom ν", options["dof"], options["dof"]])
    return rows


def _gamma(prior):
    """``scipy.stats.gamma`` of a (possibly ``Independent``) Gamma prior's first target, else ``None``."""
    base = getattr(prior, "base_dist", prior)
    if type(base).__name__ != "Gamma":
        return None
    shape, rate = (float(v.reshape(-1)[0]) for v in (base.concentration, base.rate))
    return scipy.stats.gamma(shape, scale=1.0 / rate)


def latent_rows(run: ReportRun, likelihood, target_scale=None) -> tuple[list, list]:
    """``(rows, header)`` of the latents' posterior table: one row per latent quantity and target.

    ``noise_precision`` is shown as ``1/√precision`` (× ``target_scale`` ``[T]``: original units),
    ``dof`` as ν.  Columns: mean, central 90 % interval, the prior's 90 % interval, bulk and tail
    ESS, and R-hat when the draws come in ≥ 2 chains.  Raises :class:`NotApplicable` when the
    likelihood has no latents or ``posterior.nc`` does not hold their draws.
    """
    priors = likelihood.latent_priors(1)
    if not priors:
        raise NotApplicable("this likelihood has no latent parameters: its noise is fixed (see the options) or "
                            "predicted by the network's variance head")
    post = run.idata.posterior
    missing = [name for name in priors if name not in post]
    if missing:
        raise NotApplicable(f"{run.stored('idata')} holds no draws of {', '.join(missing)} (exported without "
                            "parameters)")
    chains = post.sizes["chain"]
    lo, hi = (1 - LEVEL) / 2, (1 + LEVEL) / 2
    header = ["quantity", "target", "mean", f"{lo:.0%}", f"{hi:.0%}", f"prior {lo:.0%}", f"prior {hi:.0%}",
              "ess_bulk", "ess_tail"] + (["r_hat"] if chains > 1 else [])
    rows = []
    for name, prior in priors.items():
        values = post[name].values.astype(np.float64)  # [chain, draw, T]
        values = values.reshape(*values.shape[:2], -1)
        gamma = _gamma(prior)
        for t in range(values.shape[-1]):
            if name == "noise_precision":
                unit = 1.0 if target_scale is None else float(target_scale[t])
                draws = unit / np.sqrt(values[..., t])
                prior_q = [unit / np.sqrt(gamma.ppf(1 - q)) for q in (lo, hi)] if gamma else ["—", "—"]
                label = "scale s" if likelihood.name == "studentt" else "noise sd σ"
            else:
                draws = values[..., t]
                prior_q = [gamma.ppf(q) for q in (lo, hi)] if gamma else ["—", "—"]
                label = "degrees of freedom ν" if name == "dof" else name
            row = [label, t, draws.mean(), *np.quantile(draws, [lo, hi]), *prior_q]
            if draws.size > 3:
                with plots.quiet_arviz():
                    row += [az.ess(draws, method="bulk"), az.ess(draws, method="tail")]
                    row += [az.rhat(draws)] if chains > 1 else []
            else:  # a point estimate (e.g. MAP): nothing to diagnose
                row += ["—"] * (len(header) - len(row))
            rows.append(row)
    return rows, header


def _summaries(run: ReportRun) -> dict:
    """``{name: [N, T]}`` of the stored predictive summaries this section reads, and ``y``."""
    predictions = run.predictions()
    needed = ("mean", "sd", "epistemic_sd", "pit")
    missing = [k for k in needed if k not in predictions]
    if missing:
        raise NotApplicable(f"the stored predictions lack {', '.join(missing)}")
    out = {k: predictions[k].values.astype(np.float64) for k in needed}
    out["y"] = run.idata.observed_data["obs"].values.astype(np.float64).reshape(out["mean"].shape)
    return out


def noise_sd(sd: np.ndarray, epistemic_sd: np.ndarray) -> np.ndarray:
    """Predicted noise sd sqrt(E_s[σ²]) = sqrt(sd² − epistemic_sd²) (clipped at 0; ``inf`` stays ``inf``)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(sd), np.inf, np.sqrt(np.clip(sd**2 - epistemic_sd**2, 0.0, None)))


def pit_tail_rows(pit: np.ndarray) -> list:
    """Rows ``[region, observed share, nominal share, binomial SE, verdict]`` of the PIT tail check."""
    u = np.ravel(pit)
    rows = []
    for label, nominal, inside in TAIL_REGIONS:
        share = float(np.mean(inside(u)))
        se = float(np.sqrt(nominal * (1 - nominal) / u.size))
        if abs(share - nominal) <= FLAG_SE * se:
            verdict = "as expected"
        else:
            verdict = "too many" if share > nominal else "too few"
        rows.append([label, share, nominal, se, verdict])
    return rows


def binned_residuals(noise: np.ndarray, sd: np.ndarray, residual: np.ndarray, bins: int = NOISE_BINS) -> list:
    """Equal-count bins of the predicted noise sd ``[N]``: rows ``[points, RMS noise sd, RMS predictive sd,
    RMS |y − mean|, ratio]``; a calibrated model has RMS residual ≈ RMS predictive sd in every bin."""
    order = np.argsort(noise, kind="stable")
    rows = []
    for index in np.array_split(order, min(bins, noise.size)):
        rms = [float(np.sqrt(np.mean(v[index] ** 2))) for v in (noise, sd, residual)]
        rows.append([index.size, *rms, rms[2] / rms[1] if rms[1] > 0 else float("nan")])
    return rows


def observation_model(run: ReportRun) -> str:
    """The likelihood and its options, its latents' posterior, and the residual check (regression)."""
    if run.task != "regression":
        raise NotApplicable("classification runs use the categorical likelihood of the logits, with no latents; "
                            "its fit is the reliability diagram and ECE of the calibration section.")
    likelihood, target_scale, source = run_likelihood(run)
    parts = [paragraph(f"Likelihood {likelihood.name!r} (from {source}): {likelihood!r}."),
             table(sorted(likelihood.options().items()), ["option", "value"])]
    if likelihood.name == "heteroscedastic":
        parts.append(paragraph(f"β-NLL weight β = {fmt(likelihood.beta)} (Seitzer et al. 2022; β = 0 is the plain "
                               "NLL): it re-weights the training objective only; every reported density is the "
                               "Gaussian's."))
    fixed = fixed_rows(likelihood, target_scale)
    if fixed:
        parts += [heading("Fixed noise parameters"),
                  table(fixed, ["quantity", "standardised units", "original units (per target)"])]
    parts.append(heading("Posterior of the likelihood's latents"))
    try:
        rows, header = latent_rows(run, likelihood, target_scale)
    except NotApplicable as reason:
        parts.append(note(f"Not applicable: {reason}"))
    else:
        units = ("original target units" if target_scale is not None else
                 "standardised target units (no saved posterior to read the target scale from)")
        parts += [paragraph(f"Noise sd / scale = 1/√precision in {units}; central {LEVEL:.0%} intervals of the "
                            "posterior draws beside the prior's. A posterior interval close to the prior's means "
                            "the data say little about that quantity."), table(rows, header)]
        if "r_hat" in header:
            high = [f"{r[0]} (target {r[1]})" for r in rows if isinstance(r[-1], float) and r[-1] > RHAT_LIMIT]
            if high:
                parts.append(note(f"R-hat > {RHAT_LIMIT} for {', '.join(high)}: the chains disagree about the "
                                  "likelihood's latents.", "warn"))
    parts += [heading(f"Residual check: does the likelihood fit the {run.evaluation_word} residuals?"),
              _residuals(run, likelihood)]
    return join(parts)


def _residuals(run: ReportRun, likelihood) -> str:
    try:
        s = _summaries(run)
    except NotApplicable as reason:
        return note(f"Not applicable: {reason}")
    pit = s["pit"]
    parts = [paragraph(
        f"PIT values u = F(y) of {run.evaluated(pit.shape[0])} under the predictive mixture are uniform when the "
        "likelihood (and the posterior) fit. A QQ curve below the diagonal at the left and above it at the right "
        "— too many PIT values in the tails — means the residuals' tails are heavier than the predictive "
        "distribution's (a Student-t may fit, or the noise is underestimated); the opposite, above at the left "
        "and below at the right, means it is too wide (e.g. a Gaussian whose noise sd was inflated by a few "
        "large residuals)."),
        table(pit_tail_rows(pit), ["region", "observed share", "nominal share", "binomial SE",
                                   f"verdict (±{FLAG_SE:g} SE)"]),
        image(plots.pit_qq_png(pit, LEVEL), "PIT QQ plot")]
    noise = noise_sd(s["sd"], s["epistemic_sd"])
    if likelihood.name != "heteroscedastic":
        parts.append(paragraph(f"Predicted noise sd sqrt(E[Var(y | f, θ)]) (mean over {run.evaluated()}, original units; "
                               f"s·sqrt(ν/(ν − 2)) for a Student-t, infinite when draws have ν ≤ 2): "
                               f"{', '.join(fmt(v) for v in noise.mean(0))} per target; it does not vary with x "
                               "for this likelihood, so the binned check of heteroscedastic runs does not apply."))
        return join(parts)
    residual = np.abs(s["y"] - s["mean"])
    per_target = {t: binned_residuals(noise[:, t], s["sd"][:, t], residual[:, t]) for t in range(noise.shape[1])}
    rows = [[t, *row] for t, binned in per_target.items() for row in binned]
    parts += [paragraph(
        f"The evaluated points in {NOISE_BINS} equal-count bins of the predicted noise sd sqrt(E[σ²(x)]) per target: the RMS "
        "residual |y − mean| should equal the RMS predictive sd (noise and epistemic) in every bin — a ratio above "
        "1 where the predicted noise is small means the variance head is over-confident there."),
        table(rows, ["target", "points", "RMS noise sd", "RMS predictive sd", "RMS |y − mean|", "ratio"]),
        image(plots.binned_residuals_png(per_target), "binned residuals vs predicted sd")]
    return join(parts)
