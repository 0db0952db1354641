"""The ``laplace`` backend: a Gaussian around the MAP of the random subset (MacKay 1992).

1. MAP: :func:`inference.optim.potential.initial_point` (full-batch Adam on −log π, deterministic
   parameters trained jointly when the model trains them, then held); ``init="current"``
   keeps the network's weights as they are (a network trained elsewhere: post-hoc Laplace,
   Daxberger et al. 2021) and sets the likelihood's latents (a learned noise precision, a
   Student-t's scale and ν) to their MAP for those weights
   (:func:`inference.optim.latent_fit.fit_latents`), as deterministic pretraining does for VI.
2. Curvature: the GGN of the negative log-likelihood over the random *weights* at the MAP,
   built from the likelihood's output Fisher (:mod:`inference.laplace.curvature`; every likelihood):
   dense ``[P, P]`` for small subsets (last layer, named modules: subnetwork Laplace,
   Daxberger et al. 2021); for large ones Kronecker-factored per
   ``nn.Linear`` layer (KFAC, Martens & Grosse 2015; the Laplace approximation of Ritter et
   al. 2018, :class:`KronRoot`) or diagonal.  The network runs in eval mode (its modes are
   restored): no dropout, batch normalisation on its running statistics, never updated.
   Likelihood latents are fixed at their MAP values for the curvature and in every draw.
3. Prior precision δ·P₀: ``P₀`` is the model prior's precision (``1/σ²`` per weight for
   Normal-family priors, else 1) and ``μ₀`` its mean.  ``prior_precision="model"`` keeps δ = 1
   (the model's own prior; exact for Bayesian linear regression); a number λ is the precision of
   an isotropic prior N(μ₀, λ⁻¹ I) (P₀ = 1, δ = λ; laplace-torch's ``prior_precision``); ``"marglik"``
   (the default) maximises the Laplace evidence

       log Z(δ) = log p(y | w*) − δ/2 ‖w* − μ₀‖²_{P₀} + P/2 log δ − ½ Σ_i log(λ_i + δ),

   λ_i the eigenvalues of the prior-whitened GGN ``P₀^{-½} G P₀^{-½}`` (KFAC: the products
   β_i α_j of the whitened factors' eigenvalues, layer by layer), by MacKay's (1992)
   fixed point δ ← γ / ‖w* − μ₀‖²_{P₀}, γ = Σ λ_i/(λ_i + δ), with the MAP held (post-hoc
   tuning as in Immer et al. 2021 and Daxberger et al. 2021), for every GGN structure.
   ``log Z`` is the whole Laplace evidence log p(y|w*) + log N(w*; μ₀, (δP₀)⁻¹) + P/2 log 2π
   − ½ log det(G + δP₀) (the terms in log det P₀ and 2π cancel), laplace-torch's
   ``log_marginal_likelihood``.  ``"validation"`` picks δ by the validation NLL of the closed-form
   classification predictive (Kristiadi, Hein & Hennig 2020; laplace-torch's
   ``optimize_prior_precision(method="gridsearch", val_loader=...)``): a seeded random
   ``validation_fraction`` (0.2) of the rows is held out, the MAP and GGN are fitted on the rest, δ is
   the point of the log grid ``prior_precision_grid`` (default 10^-4 … 10^6, five a decade) with the lowest
   mean NLL there (every δ from one eigen-decomposition: J Σ(δ) Jᵀ = J U diag((λ+δ)⁻¹) Uᵀ Jᵀ), and the
   MAP and GGN are fitted again on all rows with that δ (search, then refit; ``info["validation"]``).
   ``"auto"`` (the default) is ``"validation"`` for the closed-form predictives (probit, bridge) from a
   MAP fit, ``"marglik"`` otherwise: on a classifier whose MAP separates the training data the GGN is
   ≈ 0 and the evidence's δ leaves the Gaussian far too wide (docs/baselines.md, digits).
4. Posterior N(w*, (G + δP₀)⁻¹); ``num_samples`` draws are taken at fit end into a
   :class:`~inference.laplace.posterior.LaplacePosterior` (one chain).  Predictives
   (:mod:`inference.laplace.posterior`): ``"glm"`` Monte Carlo over the network linearised at the
   MAP (Immer et al. 2021), ``"sample"`` the network itself at the draws (which Immer et al. 2021
   show to underfit when the random subset is large), and for classification ``"probit"``
   (MacKay 1992) and ``"bridge"`` (Hobbhahn et al. 2022) in closed form.  ``"auto"`` (default):
   probit for a categorical likelihood, glm otherwise.  Where the network is linear in its random
   weights (``stochastic="last"``) glm and sample coincide.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Optional, Union

import pyro
import torch

from inference.laplace.curvature import (WeightLayout, effective_dim, evaluation_mode, ggn, jacobian_path, kfac,
                         kfac_unsupported)
from inference.optim.latent_fit import fit_latents
from inference.laplace.posterior import (CLOSED_FORM, PREDICTIVES, KronRoot, LaplacePosterior, LinearisedNetwork,
                                 closed_form_nll, sample_offsets)
from inference.optim.potential import INIT_STRATEGIES, Potential, frozen_deterministic, initial_point
from inference.backends.base import Backend

__all__ = ["LaplaceConfig", "LaplaceBackend", "LaplacePosterior", "LinearisedNetwork", "KronRoot", "log_evidence",
           "mackay_precision", "VALIDATION_GRID"]

HESSIANS = ("auto", "full", "kfac", "diag")
PRIOR_PRECISIONS = ("auto", "marglik", "model", "validation")
#: the δ searched by ``prior_precision="validation"``: 10^-4 … 10^6, five points a decade (laplace-torch's
#: ``gridsearch`` takes a log grid of 10^-4 … 10^4)
VALIDATION_GRID = tuple(10.0 ** (k / 5) for k in range(-20, 31))


@dataclass
class LaplaceConfig:
    """Options of the ``laplace`` backend.

    Attributes:
        hessian: ``"full"`` (dense GGN), ``"kfac"`` (Kronecker-factored per ``nn.Linear`` layer),
            ``"diag"`` (its diagonal) or ``"auto"`` (full when the random subset has at most
            ``max_full_dim`` weights, else KFAC where every random site is an ``nn.Linear`` weight
            or bias, else diagonal).
        max_full_dim: the ``"auto"`` threshold P (the dense GGN costs P² memory, P³ time).
        prior_precision: ``"marglik"`` (δ by the evidence), ``"validation"`` (δ of ``prior_precision_grid``
            with the best validation NLL, then the MAP refitted on all data), ``"model"`` (δ = 1), a positive
            number λ (the precision of an isotropic prior N(μ₀, λ⁻¹ I) around the model prior's mean) or
            ``"auto"`` (validation for a closed-form classification predictive fitted from ``init="map"``,
            else marglik).
        prior_precision_grid: the δ searched by ``"validation"`` (``None``: :data:`VALIDATION_GRID`).
        validation_fraction: the share of the training rows (a seeded random subset) held out by
            ``"validation"``.
        predictive: ``"auto"`` (probit for a categorical likelihood, else glm), ``"glm"`` (Monte Carlo
            over the linearised network), ``"sample"`` (network at the draws), ``"probit"`` or
            ``"bridge"`` (closed-form classification predictives).
        num_samples: draws taken at fit end.
        init, map_steps, map_lr: the MAP fit (``"current"``: the network's weights as they are, the
            likelihood's latents at their MAP for them).
    """

    hessian: str = "auto"
    max_full_dim: int = 4000
    prior_precision: Union[str, float] = "auto"
    prior_precision_grid: Optional[list] = None
    validation_fraction: float = 0.2
    predictive: str = "auto"
    num_samples: int = 200
    init: str = "map"
    map_steps: int = 2000
    map_lr: float = 0.01

    def validate(self):
        choices = {"hessian": HESSIANS, "predictive": ("auto",) + PREDICTIVES, "init": INIT_STRATEGIES}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(valid)}")
        if isinstance(self.prior_precision, str):
            if self.prior_precision not in PRIOR_PRECISIONS:
                raise ValueError(f"unknown prior_precision {self.prior_precision!r}; valid: "
                                 f"{', '.join(PRIOR_PRECISIONS)} or a positive number")
        elif not (math.isfinite(self.prior_precision) and self.prior_precision > 0):
            raise ValueError(f"prior_precision must be one of {', '.join(PRIOR_PRECISIONS)} or a positive finite "
                             f"number, got {self.prior_precision}")
        grid = self.prior_precision_grid
        if grid is not None and not (isinstance(grid, (list, tuple)) and len(grid) > 0 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in grid)):
            raise ValueError(f"prior_precision_grid must be a non-empty list of positive numbers, got {grid!r}")
        if not (math.isfinite(self.validation_fraction) and 0 < self.validation_fraction < 1):
            raise ValueError(f"validation_fraction must lie in (0, 1), got {self.validation_fraction}")
        if self.prior_precision not in ("auto", "validation") and (
                grid is not None or self.validation_fraction != LaplaceConfig.validation_fraction):
            raise ValueError("prior_precision_grid and validation_fraction apply to prior_precision='validation' "
                             "only; add prior_precision='validation' or drop them")
        for name in ("num_samples", "max_full_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if int(self.map_steps) < 0:
            raise ValueError(f"map_steps must be non-negative, got {self.map_steps}")
        if not (math.isfinite(self.map_lr) and self.map_lr > 0):
            raise ValueError(f"map_lr must be positive, got {self.map_lr}")

    def resolved_predictive(self, likelihood) -> str:
        """The predictive for ``likelihood`` (``"auto"`` resolved).

        Raises:
            ValueError: ``probit`` / ``bridge`` with a regression likelihood."""
        classification = likelihood.task == "classification"
        if self.predictive == "auto":
            return "probit" if classification else "glm"
        if self.predictive in ("probit", "bridge") and not classification:
            raise ValueError(f"predictive={self.predictive!r} is a classification predictive; this model's "
                             f"{type(likelihood).__name__} is for regression: use predictive='glm' or 'sample'")
        return self.predictive

    def resolved_prior_precision(self, predictive: str) -> Union[str, float]:
        """The prior precision rule for the resolved ``predictive`` (``"auto"`` resolved).

        Raises:
            ValueError: ``"validation"`` without a closed-form predictive or without a MAP fit."""
        map_fit = self.init == "map" and int(self.map_steps) > 0
        if self.prior_precision == "auto":
            if predictive in CLOSED_FORM and map_fit:
                return "validation"
            if self.prior_precision_grid is not None or self.validation_fraction != LaplaceConfig.validation_fraction:
                raise ValueError(f"prior_precision='auto' is 'marglik' here (predictive {predictive!r}, init "
                                 f"{self.init!r}): prior_precision_grid and validation_fraction do not apply; drop "
                                 f"them, or set prior_precision='validation'")
            return "marglik"
        if self.prior_precision == "validation":
            if predictive not in CLOSED_FORM:
                raise ValueError(f"prior_precision='validation' scores the closed-form classification predictives; "
                                 f"predictive is {predictive!r}: use predictive='probit' or 'bridge', or "
                                 f"prior_precision='marglik'")
            if not map_fit:
                raise ValueError("prior_precision='validation' fits the MAP on part of the data and refits it on all "
                                 "of it; with init='current' or map_steps=0 use prior_precision='marglik' or a number")
        return self.prior_precision


def prior_moments(bnn, layout: WeightLayout) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(μ₀ [P], P₀ [P], normal)``: the weight prior's mean and precision when every site's prior
    is a factorised Normal (``normal`` True), else zeros and ones (``normal`` False)."""
    means, precisions, normal = [], [], True
    priors = bnn.prior_distributions()
    for name, size in zip(layout.names, layout.sizes):
        d = priors[name]
        base = d.base_dist if isinstance(d, torch.distributions.Independent) else d
        if isinstance(base, torch.distributions.Normal):
            means.append(base.loc.reshape(-1).expand(size))
            precisions.append(base.scale.reshape(-1).expand(size) ** -2)
        else:
            normal = False
    if not normal:
        device = bnn.target_scale.device
        return (torch.zeros(layout.dim, dtype=torch.float64, device=device),
                torch.ones(layout.dim, dtype=torch.float64, device=device), False)
    return torch.cat(means).double(), torch.cat(precisions).double(), True


def log_evidence(log_lik: float, eigenvalues: torch.Tensor, sq_norm: float, delta: float) -> float:
    """log Z(δ), the Laplace evidence of the module docstring (MacKay 1992), from the whitened GGN's
    ``eigenvalues`` ``[P]`` and ``sq_norm`` = ‖w* − μ₀‖²_{P₀}."""
    p = eigenvalues.numel()
    return float(log_lik - 0.5 * delta * sq_norm + 0.5 * p * math.log(delta) - 0.5 * torch.log(eigenvalues + delta).sum())


def mackay_precision(eigenvalues: torch.Tensor, sq_norm: float, iterations: int = 500, tol: float = 1e-10) -> float:
    """δ maximising :func:`log_evidence`: MacKay's fixed point δ ← γ(δ)/‖w* − μ₀‖²_{P₀}, from δ = 1.

    At the fixed point ∂ log Z/∂δ = (P − δ Σ 1/(λ_i+δ) − δ‖·‖²)/(2δ) = (γ − δ‖·‖²)/(2δ) = 0.
    """
    delta = 1.0
    for _ in range(iterations):
        new = min(max(effective_dim(eigenvalues, delta) / max(sq_norm, 1e-300), 1e-10), 1e10)
        if abs(new - delta) <= tol * delta:
            return new
        delta = new
    return delta


def _structure(config: LaplaceConfig, layout: WeightLayout) -> str:
    """The GGN structure of ``config.hessian`` (``"auto"`` resolved; see :class:`LaplaceConfig`)."""
    if config.hessian != "auto":
        return config.hessian
    if layout.dim <= config.max_full_dim:
        return "full"
    return "diag" if kfac_unsupported(layout) else "kfac"


class LaplaceBackend(Backend):
    """Laplace approximation on the selected subset (MacKay 1992; Daxberger et al. 2021); module docstring."""

    name = "laplace"
    Config = LaplaceConfig

    def run(self, bnn, x, y, config, seed, progress):
        with evaluation_mode(bnn.net):  # the network's modes are given back after the fit
            return self._run(bnn, x, y, config, seed, progress)

    def _run(self, bnn, x, y, config, seed, progress):
        started = time.perf_counter()
        layout = WeightLayout(bnn)
        if layout.dim == 0:
            raise ValueError("the laplace backend needs random weights; choose stochastic='all', 'last' or a pattern")
        if bnn.batched_draws is False:  # the GLM predictive vmaps over the network's weights
            raise ValueError(f"the laplace backend needs a network that torch.func.vmap can batch over weight draws; "
                             f"this one cannot ({bnn.batching_error}); use svi, map, ensemble or sgld, or make the "
                             f"layer without a batching rule deterministic")
        predictive = config.resolved_predictive(bnn.likelihood)
        rule = config.resolved_prior_precision(predictive)
        mu0, p0, normal = prior_moments(bnn, layout)
        if rule == "model" and not normal:
            raise ValueError(f"prior_precision='model' needs a Normal prior on the weights, got {bnn.prior!r}; "
                             f"use prior_precision='marglik' (an isotropic Gaussian prior tuned by the evidence)")
        if not isinstance(rule, str):  # an isotropic prior of the given precision
            p0 = torch.ones_like(p0)
        structure = _structure(config, layout)
        if structure == "kfac":  # unsupported sites or layer priors: clear errors before the MAP fit
            KronRoot.check_prior(layout, p0)
        path = jacobian_path(layout, layout.flatten(bnn.initial_values()).detach(), x)  # refuses before the fit
        search = {}
        if rule == "validation":
            search = _validation_search(bnn, layout, x, y, config, structure, path, p0, predictive, seed, progress)
        fitted = _map_and_curvature(bnn, layout, x, y, config, structure, path, p0, progress)
        w, latents, log_lik, eigenvalues, basis, record = fitted
        mu0 = mu0.to(w.device)
        sq_norm = float((p0.to(w.device) * (w.double() - mu0) ** 2).sum())
        if rule == "marglik":
            delta = mackay_precision(eigenvalues, sq_norm)
        elif rule == "validation":
            delta = search.pop("prior_precision_scale")
        else:
            delta = 1.0 if rule == "model" else float(rule)
        scale = _root(structure, basis, (eigenvalues + delta).rsqrt(), w.dtype)
        generator = torch.Generator(device=w.device).manual_seed(seed)
        eps = torch.randn(config.num_samples, layout.dim, generator=generator, dtype=w.dtype, device=w.device)
        weights = w + sample_offsets(scale, eps)
        draws = {k: v.unsqueeze(0) for k, v in layout.unflatten(weights).items()}
        draws.update({k: v.expand(1, config.num_samples, *v.shape).clone() for k, v in latents.items()})
        info = {
            "backend": self.name, "config": asdict(config), "seed": seed, "num_data": x.shape[0],
            "num_random": layout.dim, "hessian_structure": structure, "jacobian_path": path, "predictive": predictive,
            "prior_precision_scale": delta, "effective_dim": effective_dim(eigenvalues, delta),
            "log_evidence": log_evidence(log_lik, eigenvalues, sq_norm, delta),
            "map_log_likelihood": log_lik, **record, **search, "fit_seconds": time.perf_counter() - started,
        }  # fmt: skip
        return LaplacePosterior(bnn, draws, w.detach(), scale, predictive, info=info)


def _map_and_curvature(bnn, layout: WeightLayout, x, y, config: LaplaceConfig, structure: str, path: str,
                       p0: torch.Tensor, progress: bool) -> tuple:
    """The MAP on ``(x, y)`` and the prior-whitened GGN there (steps 1–2 of the module docstring):
    ``(w [P], latents, log p(y | w*), eigenvalues λ [P], basis, record)``, ``basis`` the covariance root
    for unit ``(λ + δ)^{-½}`` (:func:`_root`): ``P₀^{-½} V`` ``[P, P]`` (full), ``P₀^{-½}`` ``[P]``
    (diagonal) or the whitened Kronecker factors (KFAC)."""
    potential = Potential(bnn, x, y)
    z, record = initial_point(potential, config.init, config.map_steps, config.map_lr, progress)
    with frozen_deterministic(bnn):
        values, _ = potential.unpack(z.unsqueeze(0))
        values = {k: v[0] for k, v in values.items()}
        if (config.init == "current" or config.map_steps == 0) and bnn.latent_priors():  # weights as given
            values.update(_latents_at_map(bnn, values, x, y))
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
        return w, latents, log_lik, eigenvalues.clamp_min(0.0), root[:, None] * vectors, record
    if structure == "kfac":
        kron_layers, eigenvalues = KronRoot.whiten(g, p0)
        return w, latents, log_lik, eigenvalues, kron_layers, record
    return w, latents, log_lik, (g * p0.reciprocal()).clamp_min(0.0), root, record


def _root(structure: str, basis, inv_sd: torch.Tensor, dtype):
    """The covariance root of :class:`LaplacePosterior` from :func:`_map_and_curvature`'s ``basis`` and
    ``(λ + δ)^{-½}`` ``[P]``."""
    if structure == "kfac":
        return KronRoot.with_sds(basis, inv_sd).to(dtype)
    return (basis * inv_sd[None, :] if structure == "full" else basis * inv_sd).to(dtype)


def _validation_search(bnn, layout: WeightLayout, x, y, config: LaplaceConfig, structure: str, path: str,
                       p0: torch.Tensor, predictive: str, seed: int, progress: bool) -> dict:
    """δ of ``prior_precision="validation"`` (Kristiadi, Hein & Hennig 2020; laplace-torch's
    ``optimize_prior_precision(method="gridsearch")``): a random ``validation_fraction`` of the rows (seeded by
    ``seed``) is held out, the MAP and GGN are fitted on the rest, and the δ of the grid whose closed-form
    predictive has the lowest mean validation NLL wins.  The network (its deterministic parameters, which
    the MAP trains) is given back as it was, so the refit on all rows starts where this fit started.

    Returns the ``info`` entries ``prior_precision_scale`` (δ), ``num_validation`` and ``validation``
    (``[{"prior_precision_scale": δ, "validation_nll": …}]``, one per grid point)."""
    num_fit = int((1 - config.validation_fraction) * x.shape[0])
    if not 1 <= num_fit < x.shape[0]:
        raise ValueError(f"validation_fraction {config.validation_fraction} of {x.shape[0]} training rows leaves "
                         f"{num_fit} to fit and {x.shape[0] - num_fit} to validate; both need at least one row")
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed)).to(x.device)
    fit_rows, held_out = order[:num_fit], order[num_fit:]
    state = {k: v.detach().clone() for k, v in bnn.net.state_dict().items()}
    try:
        w, _, _, eigenvalues, basis, _ = _map_and_curvature(bnn, layout, x[fit_rows], y[fit_rows], config, structure,
                                                             path, p0, progress)
        grid = torch.tensor(config.prior_precision_grid or VALIDATION_GRID, dtype=torch.float64)
        unit = _root(structure, basis, torch.ones_like(eigenvalues), w.dtype)
        scores = closed_form_nll(bnn, w.detach(), unit, eigenvalues, grid, x[held_out], y[held_out], predictive)
    finally:
        bnn.net.load_state_dict(state)
    scores = torch.where(torch.isfinite(scores), scores, torch.full_like(scores, math.inf))
    return {"prior_precision_scale": float(grid[int(scores.argmin())]), "num_validation": int(held_out.numel()),
            "validation": [{"prior_precision_scale": float(d), "validation_nll": float(v)}
                           for d, v in zip(grid, scores)]}


def _latents_at_map(bnn, values: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The likelihood's latents ``{site: [T]}`` at their MAP for the weights in ``values``
    (:func:`inference.optim.latent_fit.fit_latents` on the network's eval-mode outputs over ``x``), started
    from the values there."""
    weights = {k: v for k, v in values.items() if k not in bnn.latent_priors()}
    with torch.no_grad():
        f = bnn.forward_single(weights, x)
    return fit_latents(bnn.likelihood, f, y, {k: values[k] for k in bnn.latent_priors()})
