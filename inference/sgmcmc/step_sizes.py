"""Default SG-MCMC step sizes from the curvature at the start point.

The rule (docs/mcmc.md, "SG-MCMC step sizes"): on a Gaussian target with precision H, each
kernel of :mod:`.sgmcmc` is a linear map whose stationary covariance is known; along an
eigenvector of H with eigenvalue λ the stationary variance is ``f/λ`` with an inflation
``f > 1`` that grows with the step.  The default step is the largest one whose inflation along
the *stiffest* direction (λ = ρ(H), the spectral radius, found by power iteration on
Hessian-vector products) is :data:`VARIANCE_INFLATION` — flatter directions are inflated less.
The minibatch gradient noise is part of it: a minibatch of n of N rows with the likelihood
scaled by r = N/n has, near a mode where the per-datum gradient covariance equals the per-datum
Hessian (information equality; exact for the conjugate Gaussian), gradient covariance
≈ (r − 1) H along the same eigenvectors.  With a = ελ/4 and h = ηλ:

* SGLD (Welling & Teh 2011), z ← z + (ε/2) g + √ε ξ:  f = (1 + a(r − 1)) / (1 − a), so
  ε = 4(f − 1) / ((r − 1 + f) λ);  stable for ε < 4/λ (full batch: ε = 0.36/λ for f = 1.1).
* SGHMC (Chen et al. 2014, eq. 15), v ← (1−α)v + η g + √(2αη) ξ, z ← z + v: the discrete
  Lyapunov equation of the (z, v) map gives f = (2 − α)(2α + h(r − 1)) / (α(4 − 2α − h)), so
  η = 2α(2 − α)(f − 1) / (((2 − α)(r − 1) + fα) λ);  stable for η < (4 − 2α)/λ.
* pSGLD (Li et al. 2016) is SGLD in the coordinates u = G^{−1/2} z of its preconditioner
  G = 1 ⊘ (λ_damp + √V): the SGLD rule with λ = ρ(G^{1/2} H G^{1/2}), V the mean ḡ⊙ḡ of minibatch
  gradients at the start (the RMSprop average the kernel starts from, :func:`.sgmcmc.psgld`).
* Cyclical SG-MCMC (Zhang et al. 2020): the cosine schedule's peak α₀ is the largest that keeps
  (i) the sampling phase's steps — at most α₀ c(β), c(β) = (cos πβ + 1)/2, from the exploration
  fraction β on — within the SGLD (ε = 2α) or SGHMC (η = α) rule and (ii) the exploration
  phase's noise-free steps at half their stability limit (SGD: α₀ = 1/λ; momentum SGD:
  α₀ = (2 − α)/λ).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = [
    "VARIANCE_INFLATION", "CURVATURE_ROWS", "PSGLD_WARM_START", "hessian_operator", "spectral_radius",
    "rms_preconditioner", "preconditioned",
    "sgld_step_size", "sghmc_step_size", "cyclical_step_size",
]  # fmt: skip

#: f: the default step's stationary variance along the stiffest direction, as a multiple of the
#: target's (1.1: the standard deviation at most 5 % too wide)
VARIANCE_INFLATION = 1.1
#: training rows (at most) whose N/m-scaled Hessian gives the default step's curvature
CURVATURE_ROWS = 2048
#: minibatch gradients whose mean ḡ⊙ḡ starts pSGLD's RMSprop average (1 for full-batch steps)
PSGLD_WARM_START = 32

Operator = Callable[[torch.Tensor], torch.Tensor]


def hessian_operator(potential: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> Operator:
    """``v [D] -> ∇²U(z) v`` for a scalar potential ``U`` of ``z`` ``[D]`` (exact, double backward).

    One forward and one backward pass here; each product is one more backward pass through the
    kept graph."""
    z = z.detach().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(potential(z), z, create_graph=True)
    if not grad.requires_grad:  # U is linear in z: its Hessian is zero
        return torch.zeros_like

    def hvp(v: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            (product,) = torch.autograd.grad(grad, z, grad_outputs=v, retain_graph=True, allow_unused=True)
        return torch.zeros_like(v) if product is None else product.detach()

    return hvp


def spectral_radius(
    operator: Operator, start: torch.Tensor, max_iterations: int = 100, min_iterations: int = 20, tolerance: float = 1e-4
) -> float:
    """ρ = max |eigenvalue| of a symmetric linear ``operator`` by power iteration from ``start`` ``[D]``.

    ρ_k = ‖H v_k‖ with ‖v_k‖ = 1 rises towards ρ; the iteration stops when it changes by less
    than ``tolerance`` (relative) after at least ``min_iterations`` products (a start nearly
    orthogonal to the top eigenvector first rests near the second eigenvalue), or after
    ``max_iterations``.  ρ bounds the positive curvature from above also where the dominant
    eigenvalue is negative (a saddle).  A zero operator gives 0."""
    v = start / start.norm()
    rho = 0.0
    for k in range(max_iterations):
        w = operator(v)
        norm = float(w.norm())
        if not math.isfinite(norm):
            raise ValueError("the Hessian-vector product at the start point is not finite; give step_size explicitly")
        if norm == 0.0:
            return 0.0
        converged = k >= min_iterations and abs(norm - rho) <= tolerance * norm
        rho, v = norm, w / norm
        if converged:
            break
    return rho


def rms_preconditioner(square_avg: torch.Tensor, damping: float) -> torch.Tensor:
    """pSGLD's G = 1 ⊘ (λ + √V) (Li et al. 2016, Alg. 1) from the RMSprop average V."""
    return 1.0 / (damping + square_avg.sqrt())


def preconditioned(operator: Operator, precond: torch.Tensor) -> Operator:
    """``v -> G^{1/2} H G^{1/2} v``: the Hessian in pSGLD's coordinates u = G^{−1/2} z."""
    root = precond.sqrt()
    return lambda v: root * operator(root * v)


def _check(curvature: float, batch_ratio: float) -> None:
    if not (math.isfinite(curvature) and curvature > 0):
        raise ValueError(f"the curvature at the start point is {curvature} (a flat or non-finite log density); "
                         f"give step_size explicitly")
    if not batch_ratio >= 1:
        raise ValueError(f"batch_ratio N/n must be at least 1, got {batch_ratio}")


def sgld_step_size(curvature: float, batch_ratio: float, inflation: float = VARIANCE_INFLATION) -> float:
    """SGLD's ε = 4(f − 1) / ((r − 1 + f) λ): stationary variance f/λ along the stiffest direction λ
    with minibatch gradient noise (r − 1)λ (r = N/n; 1 for full batch)."""
    _check(curvature, batch_ratio)
    return 4 * (inflation - 1) / ((batch_ratio - 1 + inflation) * curvature)


def sghmc_step_size(curvature: float, batch_ratio: float, friction: float, inflation: float = VARIANCE_INFLATION) -> float:
    """SGHMC's η = 2α(2 − α)(f − 1) / (((2 − α)(r − 1) + fα) λ) (friction α); see the module docstring."""
    _check(curvature, batch_ratio)
    a = friction
    return 2 * a * (2 - a) * (inflation - 1) / (((2 - a) * (batch_ratio - 1) + inflation * a) * curvature)


def cyclical_step_size(
    curvature: float, batch_ratio: float, exploration: float, kernel: str, friction: float, inflation: float = VARIANCE_INFLATION
) -> float:
    """The peak α₀ of cyclical SG-MCMC's cosine schedule (module docstring): the sampling phase within
    the inner kernel's rule, the exploration phase at half its stability limit."""
    c = (math.cos(math.pi * exploration) + 1) / 2  # the schedule's largest value in the sampling phase, / α₀
    if kernel == "sgld":  # inner SGLD step ε = 2α; exploration: z + α g, stable for α < 2/λ
        sampling, explore = sgld_step_size(curvature, batch_ratio, inflation) / 2, 1.0
    else:  # inner SGHMC η = α; exploration: momentum SGD, stable for η < (4 − 2α_f)/λ
        sampling, explore = sghmc_step_size(curvature, batch_ratio, friction, inflation), 2 - friction
    return min(sampling / c, explore / curvature)
