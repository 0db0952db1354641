"""The prior cross-entropy E_q[−log p(w)] of a Radial factor (Farquhar, Osborne & Gal 2020) and
its estimators (Nazarovs, Mehta, Lokhande & Singh 2021).

For one tensor with D entries, w = μ + σ ⊙ ξ with ξ = r ε/‖ε‖ (ε ~ N(0, I_D), r ~ N(0, 1)).

* ``"exact"``: for a Normal prior N(m, s²) the integrand is a polynomial of degree 2 in ξ,

      −log p(w_i) = log s_i + ½ log 2π + [(μ_i−m_i)² + 2(μ_i−m_i)σ_i ξ_i + σ_i² ξ_i²] / (2 s_i²),

  and the radial noise has E ξ_i = 0 and E ξ_i² = E r² · E[ε_i²/‖ε‖²] = 1/D, so

      E_q[−log p(w)] = Σ_i log s_i + ½ log 2π + [(μ_i−m_i)² + σ_i²/D] / (2 s_i²)

  exactly — the M → ∞ limit of both Monte Carlo estimators, with no noise and no draws;
* ``"reparameterized"``: the same polynomial with E ξ and E ξ² replaced by the averages
  ξ̄_i = (1/M) Σ_m ξ_mi and (ξ²)‾_i over M draws, accumulated in chunks under ``no_grad`` — the
  graph holds the three terms μ², 2μσξ̄, σ²(ξ²)‾, so its size and the memory are independent of M,
  and with the same random stream the value and gradients equal the naive estimator's exactly;
* ``"naive"``: (1/M) Σ_m −log p(μ + σ ⊙ ξ_m) with autograd through all M weight draws — the graph
  (and memory) grows linearly in M; works for any prior.

:func:`resolve_mc_kl` picks the estimator: ``"exact"`` unless M is given (then
``"reparameterized"``), so setting ``mc_kl_samples`` asks for the Monte Carlo estimator of the
paper and leaving it out gives the exact one.
"""
from __future__ import annotations

import math
from typing import Iterator, Optional

import torch

from inference.variational.latents import normal_prior_params

__all__ = [
    "MC_KL_ESTIMATORS",
    "DEFAULT_CHUNK_ELEMENTS",
    "DEFAULT_MC_KL_SAMPLES",
    "radial_noise_chunks",
    "radial_cross_entropy",
    "radial_entropy_constant",
    "radial_exact_kl_rows",
    "resolve_mc_kl",
]

MC_KL_ESTIMATORS = ("exact", "reparameterized", "naive")
#: M of the Monte Carlo estimators when an estimator is named but M is not
DEFAULT_MC_KL_SAMPLES = 10
#: elements of noise held at once while accumulating ξ̄ and (ξ²)‾: bounds the memory independently
#: of M (4 MiB in float32); larger chunks mean fewer, bigger kernels (faster on a GPU)
DEFAULT_CHUNK_ELEMENTS = 2**20


def resolve_mc_kl(mc_kl_samples: Optional[int], mc_kl_estimator: Optional[str]) -> tuple[int, str]:
    """``(M, estimator)`` from the user's options, checked.

    ``estimator=None`` means ``"exact"`` when M is not given and ``"reparameterized"`` when it is;
    ``M=None`` means :data:`DEFAULT_MC_KL_SAMPLES` for a Monte Carlo estimator.  ``"exact"`` with an
    explicit M is an error (it draws nothing), as are M < 1 and unknown estimators.
    """
    if mc_kl_samples is not None and (isinstance(mc_kl_samples, bool) or not isinstance(mc_kl_samples, int)
                                      or mc_kl_samples < 1):
        raise ValueError(f"mc_kl_samples (M) must be an integer >= 1, got {mc_kl_samples!r}")
    if mc_kl_estimator is None:
        mc_kl_estimator = "exact" if mc_kl_samples is None else "reparameterized"
    if mc_kl_estimator not in MC_KL_ESTIMATORS:
        raise ValueError(f"unknown mc_kl_estimator {mc_kl_estimator!r}; valid: {', '.join(MC_KL_ESTIMATORS)}")
    if mc_kl_estimator == "exact":
        if mc_kl_samples is not None:
            raise ValueError(f"mc_kl_samples={mc_kl_samples} has no effect with mc_kl_estimator='exact' (the "
                             "closed-form cross-entropy draws nothing); leave M out, or choose 'reparameterized' "
                             "or 'naive' to estimate it from M draws")
        return 1, "exact"
    return (DEFAULT_MC_KL_SAMPLES if mc_kl_samples is None else int(mc_kl_samples)), mc_kl_estimator


_EULER_GAMMA = 0.5772156649015329


def radial_entropy_constant(dim: int) -> float:
    """H(ξ) of the D-dimensional radial noise ξ = r ε/‖ε‖ (so H(q) = Σ log σ + this)."""
    log_sphere = math.log(2.0) + 0.5 * dim * math.log(math.pi) - math.lgamma(0.5 * dim)
    return 0.5 * math.log(math.pi * math.e / 2) + log_sphere - 0.5 * (dim - 1) * (_EULER_GAMMA + math.log(2.0))


def _exact_quad(centred: torch.Tensor, scale: torch.Tensor, dim: int) -> torch.Tensor:
    """(μ_i − m_i)² + σ_i² E ξ_i², with E ξ_i² = 1/D: the exact quadratic term of the cross-entropy."""
    return centred * centred + scale * scale / dim


def _cross_entropy_terms(quad: torch.Tensor, prior_scale: torch.Tensor) -> torch.Tensor:
    """Elementwise log s_i + ½ log 2π + quad_i / (2 s_i²) (a tensor prior sd)."""
    return torch.log(prior_scale) + 0.5 * math.log(2 * math.pi) + quad / (2 * prior_scale**2)


def radial_exact_kl_rows(loc: torch.Tensor, log_scale: torch.Tensor, prior_loc, prior_scale) -> torch.Tensor:
    """``[K]`` KL of K Radial factors (row k of ``loc``, ``log_scale`` ``[K, *shape]``, D entries per row) from
    their Normal priors N(m, p²) (floats or ``[K, *shape]``), with the exact cross-entropy:
    KL = Σ_i [log p_i + ½ log 2π + ((μ_i − m_i)² + σ_i²/D) / (2 p_i²)] − Σ_i log σ_i − H(ξ_D), σ = e^{log σ}
    (the stacked fits, :mod:`inference.variational.stacked_radial`; the terms of :func:`radial_cross_entropy`)."""
    count, dim = loc.shape[0], max(1, loc[0].numel())
    p = torch.as_tensor(prior_scale, dtype=loc.dtype, device=loc.device).expand_as(loc)
    cross = _cross_entropy_terms(_exact_quad(loc - prior_loc, torch.exp(log_scale), dim), p)
    return (cross - log_scale).reshape(count, -1).sum(1) - radial_entropy_constant(dim)


def _normal_cross_entropy(loc: torch.Tensor, scale: torch.Tensor, prior_loc, prior_scale,
                          moments: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """Σ_i log s_i + ½ log 2π + [(μ_i−m_i)² + 2(μ_i−m_i)σ_i ξ̄_i + σ_i² (ξ²)‾_i] / (2 s_i²) for a Normal
    prior N(m, s²): ``moments`` = (ξ̄, (ξ²)‾) averaged over M draws, or ``None`` for the exact
    E ξ = 0, E ξ_i² = 1/D."""
    centred = loc - prior_loc if isinstance(prior_loc, torch.Tensor) or prior_loc != 0.0 else loc
    if isinstance(prior_scale, float):  # constant prior sd: Σ quad as dot products (fewer [D] passes)
        flat_c, flat_s = centred.reshape(-1), scale.reshape(-1)
        if moments is None:
            quad = torch.dot(flat_c, flat_c) + torch.dot(flat_s, flat_s) / max(1, loc.numel())
        else:
            quad = (torch.dot(flat_c, flat_c) + 2 * torch.dot(flat_c * flat_s, moments[0].reshape(-1))
                    + torch.dot(flat_s * flat_s, moments[1].reshape(-1)))
        return loc.numel() * (math.log(prior_scale) + 0.5 * math.log(2 * math.pi)) + quad / (2 * prior_scale**2)
    if moments is None:
        quad = _exact_quad(centred, scale, max(1, loc.numel()))
    else:
        quad = centred * centred + 2 * centred * scale * moments[0] + scale * scale * moments[1]
    return _cross_entropy_terms(quad, prior_scale).sum()


def _draw_chunk(num: int, dim: int, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``num`` Gaussian vectors ε ``[num, D]`` and their radial factors c = r/‖ε‖ ``[num]``."""
    eps = torch.randn(num, dim, **options)
    return eps, torch.randn(num, **options) / torch.linalg.vector_norm(eps, dim=1)


def _chunk_sizes(dim: int, num_draws: int, chunk_elements: int) -> Iterator[int]:
    per_chunk = max(1, chunk_elements // dim)
    for start in range(0, num_draws, per_chunk):
        yield min(per_chunk, num_draws - start)


def radial_noise_chunks(
    shape: torch.Size, num_draws: int, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, like: Optional[torch.Tensor] = None
) -> Iterator[torch.Tensor]:
    """``num_draws`` radial noise vectors ξ = c ε for a tensor of ``shape``, as ``[m, D]`` chunks.

    Both cross-entropy estimators consume this one random stream, so with the same seed they
    see the same draws.  Each chunk holds at most ``max(D, chunk_elements)`` numbers, with the
    dtype and device of ``like`` (default: float32 on the CPU).
    """
    dim = max(1, int(torch.Size(shape).numel()))
    options = {"dtype": like.dtype, "device": like.device} if like is not None else {}
    for num in _chunk_sizes(dim, num_draws, chunk_elements):
        eps, scale = _draw_chunk(num, dim, options)
        yield eps.mul_(scale.unsqueeze(1))


def _xi_moments(shape, num_draws: int, chunk_elements: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-weight ξ̄ and (ξ²)‾ over ``num_draws`` draws (no gradient; memory independent of M).

    Per chunk: Σ_m ξ_m = εᵀc and Σ_m ξ_m² = (ε²)ᵀc² — two matrix-vector products, the same
    random stream as :func:`radial_noise_chunks`.
    """
    dim = max(1, int(torch.Size(shape).numel()))
    options = {"dtype": like.dtype, "device": like.device}
    first, second = like.new_zeros(dim), like.new_zeros(dim)
    for num in _chunk_sizes(dim, num_draws, chunk_elements):
        eps, scale = _draw_chunk(num, dim, options)
        first.addmv_(eps.T, scale, alpha=1.0 / num_draws)
        second.addmv_(eps.square_().T, scale.square_(), alpha=1.0 / num_draws)
    return first.view(shape), second.view(shape)


def radial_cross_entropy(
    loc: torch.Tensor,
    scale: torch.Tensor,
    prior,
    num_draws: int,
    estimator: str = "reparameterized",
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    site: str = "site",
    normal_params: Optional[tuple] = None,
) -> torch.Tensor:
    """E_q[−log p(w)] for a Radial factor: in closed form or by M Monte Carlo draws (module docstring).

    Args:
        loc, scale: μ and σ, the site's shape (differentiable).
        prior: the site's prior distribution (event shape = site shape); Normal for
            ``"reparameterized"``, anything with ``log_prob`` for ``"naive"``.
        num_draws: M ≥ 1.
        estimator: ``"exact"`` (closed form, M = ∞; ``num_draws`` unused), ``"reparameterized"``
            (graph independent of M) or ``"naive"``.
        normal_params: ``normal_prior_params(prior, site)`` when the caller has it already.
    Returns:
        a scalar with gradients w.r.t. ``loc`` and ``scale``.
    """
    if estimator == "naive":
        chunks = radial_noise_chunks(loc.shape, num_draws, chunk_elements, loc)
        xi = torch.cat(list(chunks)).view(num_draws, *loc.shape)
        return -prior.log_prob(loc + scale * xi).mean()
    prior_loc, prior_scale = normal_params if normal_params is not None else normal_prior_params(prior, site)
    moments = None
    if estimator == "reparameterized":
        with torch.no_grad():
            moments = _xi_moments(loc.shape, num_draws, chunk_elements, loc)
    return _normal_cross_entropy(loc, scale, prior_loc, prior_scale, moments)
