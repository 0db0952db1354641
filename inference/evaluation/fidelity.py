"""How close a posterior predictive is to a reference posterior's: fidelity metrics.

A *reference* is a long, converged sampler's posterior predictive on the same model and data
(:mod:`lab.references.build`); these functions score a method's predictive against it, point by point,
with the definitions of the NeurIPS 2021 approximate-inference competition (Wilson, Izmailov,
Hoffman, Gal, Li, Pan, Gelada & Vikram 2022) as used by Izmailov, Vikram, Hoffman & Wilson 2021:

* **agreement** (classification) — the share of points whose most probable class under the
  method's Bayesian model average equals the reference's,
  ``(1/N) Σ_n 1[argmax_k p̂_nk = argmax_k p_nk]``; 1 is perfect.
* **total variation** (classification) — half the L1 distance between the two predictive
  distributions, averaged over points, ``(1/N) Σ_n ½ Σ_k |p̂_nk − p_nk|``; 0 is perfect.
* **W2** (regression) — the 2-Wasserstein distance between the two 1-D predictive distributions
  of ``y`` (observation noise included) at each point, averaged over points (and targets), in
  the targets' units; 0 is perfect.  Between distributions on the line with quantile functions
  ``F⁻¹`` and ``G⁻¹``, ``W2² = ∫₀¹ (F⁻¹(u) − G⁻¹(u))² du`` (the sorted, monotone coupling is
  optimal).  Estimator (:func:`mean_w2`): each predictive mixture ``(1/S) Σ_s N(μ_s, σ_s²)`` is
  represented by ``S·k`` equally weighted points ``μ_s + σ_s ε_js``, ``j < k``, ``k = max(10, ⌈M/S⌉)``
  (:func:`quantised_mixture`), whose standard noise ``ε_js = Φ⁻¹((j + U_s)/k)`` fills the ``k`` quantile
  strata of every component once (Latin-hypercube sampling, one seeded uniform ``U_s`` per component),
  and the W2 between the two point sets is computed exactly (:func:`wasserstein2_empirical`: sort
  both, integrate the squared difference of the two step quantile functions).  Every point is an
  exact draw from its mixture, and the strata remove most of the noise's sampling error: two Gaussians
  (``S = 1``, ``M`` points each) score their closed form ``√((μa − μb)² + (σa − σb)²)`` to about 0.1 %.
  Its bias: the empirical W2 between the finitely many posterior draws, positive even for two
  independent draw sets of one posterior (of order ``σ_f/√S`` for a predictive mean of posterior sd
  ``σ_f``, damped by the noise each component adds; Bobkov & Ledoux 2019 for the rates).  The second,
  independent reference scored against the first the same way (the *noise floor*) carries it.
* **reference coverage** (both tasks) — how much of the *reference's* predictive the method's
  central ``level`` interval holds (:func:`reference_coverage`; 0.9 is perfect at level 0.9,
  below it the method is too narrow or shifted, above it too wide).

``closed-form`` helpers (:func:`gaussian_wasserstein2`, :func:`gaussian_reference_coverage`)
give the same quantities for two Gaussians, what the tests check the estimators against.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from zoo.likelihoods import PredictiveMixture

__all__ = ["agreement", "total_variation", "wasserstein2_empirical", "predictive_samples", "mean_w2",
           "reference_coverage", "probability_coverage", "gaussian_wasserstein2", "gaussian_reference_coverage",
           "classification_fidelity", "regression_fidelity", "stratified_noise", "quantised_mixture", "W2_SAMPLES"]

#: at least this many points per predictive mixture in the W2 estimator (:func:`quantised_mixture`)
W2_SAMPLES = 2000


def _probs(probs: torch.Tensor, name: str) -> torch.Tensor:
    """``[N, K]`` class probabilities as float64, or a ``ValueError`` naming ``name``."""
    probs = torch.as_tensor(probs)
    if probs.dim() != 2 or probs.shape[1] < 2:
        raise ValueError(f"{name} must be mean class probabilities [N, K] with K >= 2, got shape {tuple(probs.shape)}")
    probs = probs.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ValueError(f"{name} holds negative or non-finite probabilities")
    if not torch.allclose(probs.sum(-1), torch.ones(len(probs), dtype=torch.float64), atol=1e-3):
        raise ValueError(f"{name}'s rows do not sum to 1 (largest error {float((probs.sum(-1) - 1).abs().max()):.3g})")
    return probs


def _pair(probs, reference_probs):
    p, q = _probs(probs, "probs"), _probs(reference_probs, "reference_probs")
    if p.shape != q.shape:
        raise ValueError(f"probs {tuple(p.shape)} and reference_probs {tuple(q.shape)} must have the same shape "
                         f"(the same points and classes)")
    return p, q


def agreement(probs: torch.Tensor, reference_probs: torch.Tensor) -> float:
    """Share of points whose top class under ``probs`` ``[N, K]`` is the top class under ``reference_probs``
    ``[N, K]`` (both the predictive mean class probabilities, the Bayesian model average)."""
    p, q = _pair(probs, reference_probs)
    return float((p.argmax(-1) == q.argmax(-1)).double().mean())


def total_variation(probs: torch.Tensor, reference_probs: torch.Tensor) -> float:
    """Mean over points of ``½ Σ_k |p_nk − q_nk|`` between two ``[N, K]`` predictive class distributions (in [0, 1])."""
    p, q = _pair(probs, reference_probs)
    return float(0.5 * (p - q).abs().sum(-1).mean())


def wasserstein2_empirical(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact W2 between the empirical distributions of the columns of ``a`` ``[Sa, ...]`` and ``b`` ``[Sb, ...]``.

    Column ``j`` of each is an equal-weight sample on the line.  Both quantile functions are step
    functions (``F⁻¹(u) = a_(⌈u·Sa⌉)``, the order statistics), so ``W2² = ∫₀¹ (F⁻¹ − G⁻¹)² du`` is a
    finite sum over the merged breakpoints ``{i/Sa} ∪ {j/Sb}``; with ``Sa = Sb`` it is the mean squared
    difference of the sorted samples.  Returns ``[...]`` (float64, on the CPU).
    """
    a = torch.as_tensor(a).detach().to("cpu", torch.float64)
    b = torch.as_tensor(b).detach().to("cpu", torch.float64)
    if a.dim() < 1 or b.dim() < 1 or a.shape[1:] != b.shape[1:] or not len(a) or not len(b):
        raise ValueError(f"samples must be [S, ...] with the same trailing shape and S >= 1, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        raise ValueError("W2 needs finite samples")
    a, b = a.sort(0).values, b.sort(0).values
    sa, sb = len(a), len(b)
    if sa == sb:
        return ((a - b) ** 2).mean(0).sqrt()
    # merged breakpoints as integers over the common denominator sa·sb: i·sb and j·sa
    edges = torch.unique(torch.cat([torch.arange(sa + 1) * sb, torch.arange(sb + 1) * sa]))
    widths = (edges[1:] - edges[:-1]).double() / (sa * sb)
    mids = edges[:-1]  # the interval (edges[k], edges[k+1]) lies in order statistic ⌊edge / sb⌋ of a
    ia, ib = torch.div(mids, sb, rounding_mode="floor"), torch.div(mids, sa, rounding_mode="floor")
    shape = (-1,) + (1,) * (a.dim() - 1)
    return (widths.reshape(shape) * (a[ia] - b[ib]) ** 2).sum(0).sqrt()


def predictive_samples(mixture: PredictiveMixture, num: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``[num, N, T]`` random draws of ``y`` from the equal-weight predictive mixture (1/S) Σ_s p(y | component s).

    Components are taken in turn (draw ``m`` from component ``m mod S``), so every component gets
    its share up to one draw; the noise is Normal (or Student-t where ``mixture.df`` is set: ``z / √(χ²_ν/ν)``),
    drawn from ``generator`` on the CPU (float64).
    """
    if int(num) < 1:
        raise ValueError(f"the number of predictive samples must be at least 1, got {num}")
    loc = mixture.loc.detach().to("cpu", torch.float64)
    scale = mixture.scale.detach().to("cpu", torch.float64).expand(loc.shape)
    index = torch.arange(int(num)) % loc.shape[0]
    noise = torch.randn((int(num),) + tuple(loc.shape[1:]), generator=generator, dtype=torch.float64)
    if mixture.df is not None:
        nu = mixture.df.detach().to("cpu", torch.float64).expand(loc.shape)[index]
        noise = noise / (2 * torch._standard_gamma(nu / 2, generator=generator) / nu).sqrt()
    return loc[index] + scale[index] * noise


def stratified_noise(k: int, num_components: int, df: Optional[torch.Tensor] = None, seed: int = 0) -> torch.Tensor:
    """``[k, S, ...]`` standard noise stratified per component: ``ε_js = F⁻¹((j + U_s)/k)``, ``j = 0..k−1``, one
    uniform shift ``U_s`` per component (seeded), ``F`` the standard Normal CDF (or the Student-t's with ``df``
    ``[S, ...]`` degrees of freedom).  Each ``ε_js`` is exactly ``F``-distributed; the ``k`` of a component
    fill its ``k`` quantile strata once each (Latin-hypercube sampling)."""
    generator = torch.Generator().manual_seed(int(seed))
    shift = torch.rand(int(num_components), generator=generator, dtype=torch.float64)
    u = (torch.arange(int(k), dtype=torch.float64).reshape(-1, 1) + shift) / int(k)  # [k, S]
    if df is None:
        return torch.special.ndtri(u)
    import scipy.special  # the Student-t quantile (Cephes stdtrit), float64 on the CPU

    nu = df.detach().to("cpu", torch.float64)
    u = u.reshape(int(k), int(num_components), *([1] * (nu.dim() - 1))).expand(int(k), *nu.shape)
    return torch.from_numpy(scipy.special.stdtrit(nu.expand_as(u).numpy(), u.numpy()))


def quantised_mixture(mixture: PredictiveMixture, points: int = W2_SAMPLES, per_component: int = 10,
                      seed: int = 0) -> torch.Tensor:
    """``[S·k, N, T]`` equally weighted points representing the predictive mixture: ``μ_s + σ_s ε_js`` for every
    component ``s`` and ``j < k``, ``k = max(per_component, ⌈points / S⌉)``, ``ε`` from :func:`stratified_noise`
    (the same for every point and target; float64, CPU)."""
    loc = mixture.loc.detach().to("cpu", torch.float64)
    scale = mixture.scale.detach().to("cpu", torch.float64).expand(loc.shape)
    num = loc.shape[0]
    k = max(int(per_component), math.ceil(int(points) / num))
    if mixture.df is None:
        eps = stratified_noise(k, num, seed=seed).reshape(k, num, 1, 1)
    else:
        eps = stratified_noise(k, num, mixture.df.detach().to("cpu", torch.float64).expand(loc.shape), seed)
    return (loc.unsqueeze(0) + scale.unsqueeze(0) * eps).reshape(-1, *loc.shape[1:])


def mean_w2(mixture: PredictiveMixture, reference: PredictiveMixture, points: int = W2_SAMPLES) -> float:
    """Mean over points and targets of the per-point W2 between two predictive mixtures (``[S, N, T]``
    components at the same points), in the mixtures' units: the exact W2 between their
    :func:`quantised_mixture` point sets (the estimator and its bias: the module docstring)."""
    if mixture.loc.shape[1:] != reference.loc.shape[1:]:
        raise ValueError(f"the predictive at {tuple(mixture.loc.shape[1:])} points × targets cannot be compared with "
                         f"the reference's at {tuple(reference.loc.shape[1:])}")
    return float(wasserstein2_empirical(quantised_mixture(mixture, points), quantised_mixture(reference, points)).mean())


def reference_coverage(mixture: PredictiveMixture, reference: PredictiveMixture, level: float = 0.9) -> float:
    """Reference mass in the method's central ``level`` predictive interval, averaged over points and targets.

    ``(1/N) Σ_n [F_ref(hi_n) − F_ref(lo_n)]`` with ``[lo_n, hi_n]`` the method's central ``level``
    interval (the exact ``(1 ∓ level)/2`` quantiles of its predictive mixture, observation noise
    included) and ``F_ref`` the reference predictive mixture's CDF at point ``n``: the coverage the
    method's intervals would have if the targets were drawn from the reference's posterior
    predictive.  Equal to ``level`` for the reference itself; below it for a method too narrow or
    shifted, above it for one too wide.
    """
    lo, hi = mixture.interval(level)
    return float((reference.cdf(hi).double() - reference.cdf(lo).double()).mean())


def probability_coverage(prob_draws: torch.Tensor, reference_prob_draws: torch.Tensor, level: float = 0.9) -> float:
    """Classification's reference coverage: the share of the reference's class-probability draws
    ``[Sr, N, K]`` inside the method's central ``level`` credible interval of each class probability
    (empirical ``(1 ∓ level)/2`` quantiles of its draws ``[S, N, K]``), averaged over draws, points and classes.

    ``level`` for a method whose draws follow the reference's; near 0 for a point estimate (one draw:
    an interval of width 0), whose epistemic uncertainty is nil.
    """
    if not 0 < float(level) < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    draws = torch.as_tensor(prob_draws).detach().to("cpu", torch.float64)
    ref = torch.as_tensor(reference_prob_draws).detach().to("cpu", torch.float64)
    if draws.dim() != 3 or ref.dim() != 3 or draws.shape[1:] != ref.shape[1:]:
        raise ValueError(f"class-probability draws must be [S, N, K] at the same points and classes, got "
                         f"{tuple(draws.shape)} and {tuple(ref.shape)}")
    bounds = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(draws, bounds, dim=0)
    return float(((ref >= lo) & (ref <= hi)).double().mean())


def gaussian_wasserstein2(mean_a, sd_a, mean_b, sd_b) -> torch.Tensor:
    """W2 between ``N(mean_a, sd_a²)`` and ``N(mean_b, sd_b²)`` (broadcast): ``√((μa − μb)² + (σa − σb)²)``."""
    mean_a, sd_a, mean_b, sd_b = (torch.as_tensor(v, dtype=torch.float64) for v in (mean_a, sd_a, mean_b, sd_b))
    return ((mean_a - mean_b) ** 2 + (sd_a - sd_b) ** 2).sqrt()


def gaussian_reference_coverage(mean, sd, reference_mean, reference_sd, level: float = 0.9) -> torch.Tensor:
    """:func:`reference_coverage` for Gaussians (broadcast): ``Φ((μ + zσ − μr)/σr) − Φ((μ − zσ − μr)/σr)``,
    ``z = Φ⁻¹((1 + level)/2)``."""
    mean, sd, reference_mean, reference_sd = (torch.as_tensor(v, dtype=torch.float64)
                                              for v in (mean, sd, reference_mean, reference_sd))
    z = math.sqrt(2) * torch.erfinv(torch.tensor(float(level), dtype=torch.float64))
    return (torch.special.ndtr((mean + z * sd - reference_mean) / reference_sd)
            - torch.special.ndtr((mean - z * sd - reference_mean) / reference_sd))


def classification_fidelity(prob_draws: torch.Tensor, reference_prob_draws: torch.Tensor, level: float = 0.9) -> dict:
    """``{"agreement", "total_variation", "reference_coverage_90"}`` of class-probability draws ``[S, N, K]``
    against the reference's ``[Sr, N, K]`` (the model averages are the draws' means)."""
    draws, ref = torch.as_tensor(prob_draws), torch.as_tensor(reference_prob_draws)
    if draws.dim() != 3 or ref.dim() != 3:
        raise ValueError(f"class-probability draws must be [S, N, K], got {tuple(draws.shape)} and {tuple(ref.shape)}")
    mean, ref_mean = draws.double().mean(0), ref.double().mean(0)
    return {"agreement": agreement(mean, ref_mean), "total_variation": total_variation(mean, ref_mean),
            f"reference_coverage_{round(100 * level)}": probability_coverage(draws, ref, level)}


def regression_fidelity(mixture: PredictiveMixture, reference: PredictiveMixture, level: float = 0.9) -> dict:
    """``{"w2", "reference_coverage_90"}`` of a predictive mixture against the reference's (same points, units)."""
    return {"w2": mean_w2(mixture, reference),
            f"reference_coverage_{round(100 * level)}": reference_coverage(mixture, reference, level)}
