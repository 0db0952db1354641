"""The warm-up's first metric from the curvature at the start, instead of the identity.

Stan and NumPyro start the warm-up with M⁻¹ = I and estimate the metric from the chains' draws at the
end of each slow window (75 + 25 iterations at the defaults).  A network's posterior is badly scaled
in those coordinates: the last layer of a 1-32-32-1 tanh MLP on a noisy sine has correlated features
whose curvatures span five orders of magnitude, so under M⁻¹ = I every NUTS trajectory runs to the
tree-depth cap (1 023 leapfrog steps) with a step of 0.005, and those first 100 iterations cost 20×
all the others (docs/mcmc.md, "Metric").  The chains start at the MAP (or the given weights), where
the Hessian H of −log π is the Laplace approximation's precision, so

    M⁻¹₀ = |H|⁻¹ (dense),   or   diag(|H|⁻¹) (diagonal: its marginal variances, as Welford's estimate),

with |H| = V max(|Λ|, λ₀) Vᵀ (the eigenvalues' absolute values, as the SoftAbs metric of Betancourt
2013 treats the indefinite curvature of a network, floored at λ₀ = :data:`CURVATURE_FLOOR`: no
direction wider than 1/√λ₀).  The windows then replace it with the draws' (co)variance as before.

* :func:`hessian` — H at one point ``[D, D]``, from batched Hessian-vector products (double
  backward through the potential, :data:`PROBES` columns per pass);
* :func:`curvature_metric` — the metric above for ``C`` chains.
"""
from __future__ import annotations

from typing import Callable

import torch

from inference.mcmc.mass_matrix import Metric, euclidean_metric

__all__ = ["CURVATURE_FLOOR", "CURVATURE_MAX_DIM", "PROBES", "hessian", "curvature_metric"]

#: smallest curvature |λ| of the initial metric: no direction wider than 10 (unconstrained units)
CURVATURE_FLOOR = 1e-2
#: dimensions up to which the Hessian is computed (D Hessian-vector products); above, the identity
CURVATURE_MAX_DIM = 2000
#: Hessian columns computed in one batched pass
PROBES = 64


def hessian(log_density: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, probes: int = PROBES) -> torch.Tensor:
    """The Hessian of −log π at ``z`` ``[D]``, ``[D, D]`` (symmetrised).

    ``log_density(z [K, D]) -> [K]`` evaluates K points at once (a potential's ``log_density``); column j of
    H is the Hessian-vector product with the unit vector e_j, computed for ``probes`` columns per pass:
    the gradient at ``K`` copies of ``z`` with ``create_graph``, then the gradient of Σ_k g_k·e_{j_k}.
    """
    dim = z.shape[-1]
    eye = torch.eye(dim, dtype=z.dtype, device=z.device)
    columns = []
    with torch.enable_grad():
        for block in eye.split(probes):
            point = z.detach().expand(block.shape[0], dim).clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(-log_density(point).sum(), point, create_graph=True)
            (hvp,) = torch.autograd.grad((grad * block).sum(), point)
            columns.append(hvp.detach())
    h = torch.cat(columns)
    return 0.5 * (h + h.T)


def curvature_metric(h: torch.Tensor, num_chains: int, dense: bool, floor: float = CURVATURE_FLOOR) -> Metric:
    """The metric M⁻¹ = |H|⁻¹ (dense) or diag(|H|⁻¹) (diagonal) for ``num_chains`` chains, |H| = V max(|Λ|, ``floor``) Vᵀ
    of the symmetric ``h`` ``[D, D]`` (see the module docstring)."""
    eigenvalues, vectors = torch.linalg.eigh(h.double())
    inverse = (vectors / eigenvalues.abs().clamp(min=floor)) @ vectors.T
    inverse = (0.5 * (inverse + inverse.T)).to(h.dtype)
    inv_mass = inverse if dense else inverse.diagonal()
    return euclidean_metric(inv_mass.expand(num_chains, *inv_mass.shape).clone())
