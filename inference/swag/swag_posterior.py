"""The SWAG posterior: draws from the Gaussian of the SGD iterates (Maddox et al. 2019, §3) and the
posterior class that holds them (MultiSWAG: the members as chains, Wilson & Izmailov 2020).

Per member, ``S`` draws

    θ = θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)),   Σ_diag = mean(θ_i²) − θ̄²,   z₁ ~ N(0, I_P), z₂ ~ N(0, I_K)

(SWAG-Diagonal: θ = θ̄ + Σ_diag^{½} z₁).
"""
from __future__ import annotations

import math

import torch

from inference.posterior import SamplePosterior
from inference.swag.batchnorm import BATCHNORM_PREFIX, BatchNormDraws
from inference.swag.moments import SWAGMoments

__all__ = ["swag_samples", "SWAGPosterior"]


def swag_samples(moments: SWAGMoments, num_samples: int, diag: bool, generator: torch.Generator) -> torch.Tensor:
    """``[M, S, P]`` draws θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)) (``diag``: θ̄ + Σ_diag^{½} z₁)."""
    num_members, dim = moments.mean.shape
    rank = moments.max_rank
    if not diag and moments.count < rank:
        raise ValueError(f"max_rank K={rank} exceeds the number of snapshots ({moments.count}); collect more snapshots "
                         f"(epochs, collect_every) or lower max_rank")
    like = {"dtype": moments.mean.dtype, "device": moments.mean.device}
    z1 = torch.randn(num_members, num_samples, dim, generator=generator, **like)
    sd = moments.variance.sqrt().unsqueeze(1)
    if diag:
        return moments.mean.unsqueeze(1) + sd * z1
    z2 = torch.randn(num_members, num_samples, rank, generator=generator, **like)
    low_rank = z2 @ moments.deviations  # [M, S, P]
    return moments.mean.unsqueeze(1) + sd * z1 / math.sqrt(2) + low_rank / math.sqrt(2 * (rank - 1))


class SWAGPosterior(SamplePosterior):
    """SWAG / MultiSWAG draws ``[M, S, ...]``; with BatchNorm statistics among the draws
    (:mod:`inference.swag.batchnorm`) the network is a :class:`~inference.swag.batchnorm.BatchNormDraws`."""

    kind = "swag"

    def __init__(self, bnn, draws, sample_stats=None, info=None):
        if any(k.startswith(BATCHNORM_PREFIX) for k in draws) and not isinstance(bnn, BatchNormDraws):
            bnn = BatchNormDraws(bnn)
        super().__init__(bnn, draws, sample_stats, info)
