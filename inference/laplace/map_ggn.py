"""The MAP and the prior-whitened GGN there: the Gaussian of the Laplace approximation before δ.

1. MAP: :func:`inference.optim.start.initial_point` (the ``map`` backend's minibatch fit, deterministic
   parameters trained jointly when the model trains them, then held); ``init="current"`` keeps the
   network's weights as they are (a network trained elsewhere: post-hoc Laplace, Daxberger et al.
   2021) and sets the likelihood's latents (a learned noise precision, a Student-t's scale and ν) to
   their MAP for those weights (:func:`~inference.optim.latent_fit.latents_at_map`), as deterministic pretraining does for VI.
2. Curvature: the GGN G of the negative log-likelihood over the random *weights* at the MAP, built from
   the likelihood's output Fisher (:mod:`inference.laplace.curvature`): dense ``[P, P]``, Kronecker-
   factored per ``nn.Linear`` layer (KFAC, Martens & Grosse 2015; Ritter et al. 2018) or diagonal
   (:func:`hessian_structure`).  Likelihood latents are fixed at their MAP values.
3. Whitening by the prior precision P₀: the eigen-decomposition of ``P₀^{-½} G P₀^{-½}`` (per layer for
   KFAC, :meth:`~inference.laplace.laplace_posterior.KronRoot.whiten`), so that for every δ the posterior
   covariance (G + δP₀)⁻¹ has the root ``basis · (λ + δ)^{-½}`` (:func:`covariance_root`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from inference.laplace.curvature import WeightLayout, ggn, kfac, kfac_unsupported
from inference.laplace.laplace_posterior import KronRoot
from inference.optim.latent_fit import latents_at_map
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.start import initial_point

__all__ = ["MapCurvature", "hessian_structure", "map_and_curvature", "covariance_root"]


class MapCurvature(NamedTuple):
    """What :func:`map_and_curvature` returns.

    Attributes:
        w: the MAP weights ``[P]`` (flat, in ``bnn.sites`` order).
        latents: the likelihood's latents at the MAP ``{site: [T]}``.
        log_lik: log p(y | w*), summed over the rows.
        eigenvalues: λ ``[P]`` of the prior-whitened GGN (clamped at 0).
        basis: the covariance root for unit ``(λ + δ)^{-½}`` (:func:`covariance_root`): ``P₀^{-½} V``
            ``[P, P]`` (full), ``P₀^{-½}`` ``[P]`` (diagonal) or the whitened Kronecker factors (KFAC).
        record: how the MAP was found (:func:`~inference.optim.start.initial_point`'s record).
    """

    w: torch.Tensor
    latents: dict
    log_lik: float
    eigenvalues: torch.Tensor
    basis: object
    record: dict


def hessian_structure(hessian: str, max_full_dim: int, layout: WeightLayout) -> str:
    """The GGN structure of ``hessian``: itself, or for ``"auto"`` ``"full"`` when the random subset has at
    most ``max_full_dim`` weights, else ``"kfac"`` where every random site is an ``nn.Linear`` weight or
    bias, else ``"diag"``."""
    if hessian != "auto":
        return hessian
    if layout.dim <= max_full_dim:
        return "full"
    return "diag" if kfac_unsupported(layout) else "kfac"


def map_and_curvature(bnn, layout: WeightLayout, x, y, structure: str, path: str, p0: torch.Tensor, init: str,
                      map_steps: int, map_lr: float, progress: bool, seed: int = 0) -> MapCurvature:
    """The MAP on ``(x, y)`` (``init``, ``map_steps``, ``map_lr``, ``seed`` of :func:`~inference.optim.start.initial_point`)
    and the GGN of ``structure`` there (Jacobians by ``path``), whitened by the prior precisions ``p0`` ``[P]``
    (steps 1–3 of the module docstring)."""
    potential = Potential(bnn, x, y)
    z, record = initial_point(potential, init, map_steps, map_lr, progress, seed)
    with frozen_deterministic(bnn):
        values, _ = potential.unpack(z.unsqueeze(0))
        values = {k: v[0] for k, v in values.items()}
        if (init == "current" or map_steps == 0) and bnn.latent_priors():  # weights as given
            values.update(latents_at_map(bnn, values, [(x, y)]))
            record["latents"] = "map given the weights"
        w = layout.flatten(values)
        latents = {k: values[k] for k in bnn.latent_priors()}
        if structure == "kfac":
            g = kfac(layout, w, latents, x)
        else:
            g = ggn(layout, w, latents, x, structure, path)
        with torch.no_grad():
            log_lik = float(bnn.log_likelihood({k: v.unsqueeze(0) for k, v in values.items()}, x, y).sum())
    p0 = p0.to(w.device)
    root = p0.rsqrt()
    if structure == "full":
        eigenvalues, vectors = torch.linalg.eigh(root[:, None] * g * root[None, :])
        return MapCurvature(w, latents, log_lik, eigenvalues.clamp_min(0.0), root[:, None] * vectors, record)
    if structure == "kfac":
        kron_layers, eigenvalues = KronRoot.whiten(g, p0)
        return MapCurvature(w, latents, log_lik, eigenvalues, kron_layers, record)
    return MapCurvature(w, latents, log_lik, (g * p0.reciprocal()).clamp_min(0.0), root, record)


def covariance_root(structure: str, basis, inv_sd: torch.Tensor, dtype):
    """The covariance root of :class:`~inference.laplace.laplace_posterior.LaplacePosterior` (dense ``[P, P]``, sds
    ``[P]`` or a :class:`~inference.laplace.laplace_posterior.KronRoot`) from :func:`map_and_curvature`'s ``basis``
    and ``(λ + δ)^{-½}`` ``[P]``, in ``dtype``."""
    if structure == "kfac":
        return KronRoot.with_sds(basis, inv_sd).to(dtype)
    return (basis * inv_sd[None, :] if structure == "full" else basis * inv_sd).to(dtype)
