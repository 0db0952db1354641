"""Resampling a weighted particle population, and its effective sample size.

* :func:`systematic_resample` — systematic resampling (Kitagawa 1996; Carpenter, Clifford & Fearnhead 1999): one
  uniform u ~ U(0, 1) places N evenly spaced pointers (u + i) / N, i = 0 … N − 1, on the cumulative normalised
  weights; particle j is copied once per pointer in [C_{j−1}, C_j).  Each copy count Nⱼ is ⌊N Wⱼ⌋ or ⌈N Wⱼ⌉ (so
  E Nⱼ = N Wⱼ, unbiased) and the resampling noise is lower than multinomial resampling's (Douc, Cappé & Moulines
  2005).  The indices come out sorted, so copies of one particle are adjacent.
* :func:`effective_sample_size` — ESS = 1 / Σ Wᵢ² of normalised weights (Kong, Liu & Wong 1994).
"""
from __future__ import annotations

import torch

from inference.smc.tempering import normalised_log_weights

__all__ = ["systematic_resample", "effective_sample_size"]


def systematic_resample(log_weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Ancestor indices ``[N]`` (int64, sorted, on ``log_weights``' device) of a systematic resampling of the
    particles with log weights ``log_weights`` ``[N]`` (normalised or not); the one uniform is drawn on the CPU
    from ``generator``, so a seed gives the same indices on every device."""
    num = log_weights.shape[0]
    weights = normalised_log_weights(log_weights.double()).exp()
    cumulative = torch.cumsum(weights, 0)
    u = torch.rand((), generator=generator, dtype=torch.float64, device=generator.device).to(weights.device)
    pointers = (u + torch.arange(num, dtype=torch.float64, device=weights.device)) / num
    pointers = pointers * cumulative[-1]  # the float64 sum of the weights is 1 up to rounding: stay inside it
    return torch.searchsorted(cumulative, pointers, right=True).clamp(max=num - 1)


def effective_sample_size(log_weights: torch.Tensor) -> float:
    """ESS = 1 / Σ Wᵢ² ∈ [1, N] of the particles with log weights ``[N]`` (normalised or not)."""
    log_w = normalised_log_weights(log_weights.double())
    return float(torch.exp(-torch.logsumexp(2 * log_w, 0)))
