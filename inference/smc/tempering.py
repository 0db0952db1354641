"""The adaptive tempering schedule: the next inverse temperature by bisection on the conditional ESS.

The tempered targets π_β(θ) ∝ p(θ) p(y | θ)^β run from the prior (β = 0) to the posterior (β = 1).  Moving
weighted particles ``(θᵢ, Wᵢ)`` (normalised weights, Σ Wᵢ = 1) from β to β' = β + δ multiplies their weights by
the incremental weights

    wᵢ(δ) = p(y | θᵢ)^δ = exp(δ ℓᵢ),   ℓᵢ = log p(y | θᵢ),

and the *conditional* effective sample size (Zhou, Johansen & Aston 2016, eq. 3.15),

    CESS(δ) = N (Σᵢ Wᵢ wᵢ)² / Σᵢ Wᵢ wᵢ²   ∈ [1, N],

measures how well the current population represents π_β' (with equal weights, as after resampling, it is the
ordinary ESS (Σ wᵢ)² / Σ wᵢ² of Kong, Liu & Wong 1994).  CESS is continuous and decreasing in δ from N at δ = 0,
so the next β' is the one whose CESS is a fixed fraction ρ N of the population (Jasra, Stephens, Doucet &
Tsagaris 2011; Zhou et al. 2016), found by bisection, or 1 when even the whole remaining step keeps CESS ≥ ρ N.
The log evidence increment of the step is log Σᵢ Wᵢ wᵢ(δ) (Del Moral, Doucet & Jasra 2006).
"""
from __future__ import annotations

import math

import torch

__all__ = ["conditional_ess", "next_temperature", "log_evidence_increment", "normalised_log_weights"]

#: bisection iterations: the temperature increment to 2⁻⁶⁰ of the remaining interval
BISECTION_STEPS = 60


def normalised_log_weights(log_weights: torch.Tensor) -> torch.Tensor:
    """log Wᵢ ``[N]`` (Σ Wᵢ = 1) of unnormalised log weights ``[N]`` (−∞ allowed, not all)."""
    return log_weights - torch.logsumexp(log_weights, 0)


def conditional_ess(log_weights: torch.Tensor, log_increment: torch.Tensor) -> torch.Tensor:
    """CESS / N (a fraction in [1/N, 1]) of the particles with log weights ``[N]`` (normalised or not) under the
    incremental log weights ``log_increment`` ``[N]`` (module docstring); computed in float64 on log scale."""
    log_w = normalised_log_weights(log_weights.double())
    inc = log_increment.double()
    numerator = 2 * torch.logsumexp(log_w + inc, 0)
    denominator = torch.logsumexp(log_w + 2 * inc, 0)
    return torch.exp(numerator - denominator)


def _increment(log_likelihood: torch.Tensor, delta: float) -> torch.Tensor:
    """δ ℓᵢ with 0 · (−∞) = 0 (a particle of zero likelihood keeps its weight only at δ = 0)."""
    return torch.where(torch.isneginf(log_likelihood), -math.inf if delta > 0 else 0.0, delta * log_likelihood)


def next_temperature(log_weights: torch.Tensor, log_likelihood: torch.Tensor, beta: float, target: float) -> float:
    """The next inverse temperature β' ∈ (β, 1] whose conditional ESS is ``target`` · N (module docstring).

    Args:
        log_weights: the particles' current log weights ``[N]`` (zeros after resampling).
        log_likelihood: ℓᵢ = log p(y | θᵢ) ``[N]`` (NaN counts as −∞: a failed evaluation gets no weight).
        beta: the current inverse temperature, in [0, 1).
        target: the conditional ESS fraction ρ ∈ (0, 1).
    Raises:
        ValueError: ``target`` outside (0, 1), ``beta`` outside [0, 1), or no particle of finite likelihood.
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"the conditional ESS fraction must lie in (0, 1), got {target}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"the current inverse temperature must lie in [0, 1), got {beta}")
    ll = torch.nan_to_num(log_likelihood.double(), nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    if not bool(torch.isfinite(ll).any()):
        raise ValueError("no particle has a finite log-likelihood: the prior draws or the data are broken")
    if bool(torch.isposinf(ll).any()):
        raise ValueError("a particle has log-likelihood +inf (a degenerate likelihood): check the data and the noise prior")
    # shifting ℓ by a constant changes no CESS (it cancels): work with ℓ − max ℓ ≤ 0 for stable exponentials
    ll = ll - ll[torch.isfinite(ll)].max()
    remaining = 1.0 - beta
    if float(conditional_ess(log_weights, _increment(ll, remaining))) >= target:
        return 1.0
    low, high = 0.0, remaining
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if float(conditional_ess(log_weights, _increment(ll, mid))) >= target:
            low = mid
        else:
            high = mid
    # the lower end keeps CESS ≥ target; it is > 0 because CESS → 1 as δ → 0 (continuity)
    return beta + (low if low > 0 else high)


def log_evidence_increment(log_weights: torch.Tensor, log_likelihood: torch.Tensor, delta: float) -> torch.Tensor:
    """log Z_β' − log Z_β = log Σᵢ Wᵢ exp(δ ℓᵢ) (a float64 scalar tensor) for the move by ``delta`` = β' − β."""
    ll = torch.nan_to_num(log_likelihood.double(), nan=-math.inf, neginf=-math.inf)
    return torch.logsumexp(normalised_log_weights(log_weights.double()) + _increment(ll, delta), 0)
