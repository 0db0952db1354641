"""The running SWAG statistics of the SGD iterates (Maddox et al. 2019, Algorithm 1).

For ``M`` members at once: after snapshot i (θ_i ``[M, P]``) the first and second moments
θ̄ = mean(θ_1..θ_i), θ̄² = mean(θ_1²..θ_i²) ``[M, P]`` and the last K deviation columns
D = [θ_j − θ̄_j] ``[M, K, P]`` (a ring buffer: snapshot i writes column (i − 1) mod K).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SWAGMoments", "init_moments", "update_moments"]


@dataclass
class SWAGMoments:
    """SWAG statistics of ``M`` members: ``mean`` θ̄ and ``sq_mean`` θ̄² ``[M, P]``, the last K
    ``deviations`` ``[M, K, P]`` and ``count``, the snapshots collected."""

    mean: torch.Tensor
    sq_mean: torch.Tensor
    deviations: torch.Tensor
    count: int = 0

    @property
    def max_rank(self) -> int:
        """K, the deviation columns kept."""
        return self.deviations.shape[1]

    @property
    def variance(self) -> torch.Tensor:
        """Σ_diag ``[M, P]`` (clamped at 1e-30 against round-off, as in Maddox et al.'s code)."""
        return (self.sq_mean - self.mean**2).clamp_min(1e-30)


def init_moments(num_members: int, dim: int, max_rank: int, dtype=torch.float32, device=None) -> SWAGMoments:
    """Empty statistics of ``num_members`` members over ``dim`` coordinates keeping ``max_rank`` deviations."""
    return SWAGMoments(torch.zeros(num_members, dim, dtype=dtype, device=device),
                       torch.zeros(num_members, dim, dtype=dtype, device=device),
                       torch.zeros(num_members, max_rank, dim, dtype=dtype, device=device))


def update_moments(moments: SWAGMoments, theta: torch.Tensor) -> None:
    """Add snapshot ``theta`` ``[M, P]`` in place: update the moments, then store θ − θ̄ (Maddox et al.
    2019, Alg. 1)."""
    moments.count += 1
    moments.mean += (theta - moments.mean) / moments.count
    moments.sq_mean += (theta * theta - moments.sq_mean) / moments.count
    moments.deviations[:, (moments.count - 1) % moments.max_rank] = theta - moments.mean
