"""The ``laplace`` backend: a Gaussian around the MAP of the random subset (MacKay 1992).

This module holds the options and assembles the parts of :mod:`inference.laplace`:

1. MAP and curvature (:func:`inference.laplace.map_ggn.map_and_curvature`): the MAP
   (:func:`inference.optim.start.initial_point`; ``init="current"`` keeps the network's weights, post-hoc
   Laplace, Daxberger et al. 2021, and sets the likelihood's latents to their MAP for them), then the GGN of
   the negative log-likelihood over the random *weights* there (:mod:`inference.laplace.curvature`; every
   likelihood): dense ``[P, P]`` for small subsets (last layer, named modules: subnetwork Laplace,
   Daxberger et al. 2021); for large ones Kronecker-factored per ``nn.Linear`` layer (KFAC, Martens &
   Grosse 2015; Ritter et al. 2018) or diagonal.  The network runs in eval mode (its modes are restored):
   no dropout, batch normalisation on its running statistics, never updated.  Likelihood latents are
   fixed at their MAP values for the curvature and in every draw.
2. Prior precision δ·P₀ (:mod:`inference.laplace.evidence`): ``P₀`` is the model prior's precision and
   ``μ₀`` its mean.  ``prior_precision="model"`` keeps δ = 1 (the model's own prior; exact for Bayesian
   linear regression); a number λ is the precision of an isotropic prior N(μ₀, λ⁻¹ I) (P₀ = 1, δ = λ;
   laplace-torch's ``prior_precision``); ``"marglik"`` maximises the Laplace evidence log Z(δ) by MacKay's
   fixed point with the MAP held (Immer et al. 2021); ``"validation"`` holds out a seeded random
   ``validation_fraction`` (0.2) of the rows (or each of ``validation_folds`` folds in turn), fits the MAP
   and GGN on the rest for the refit's epochs, takes the δ of
   ``prior_precision_grid`` (default 10^-4 … 10^6, five a decade) with the lowest validation NLL of the
   closed-form classification predictive (Kristiadi, Hein & Hennig 2020), and fits the MAP and GGN again
   on all rows (search, then refit; ``info["validation"]``).  ``"auto"`` (the default) is
   ``"validation"`` for the closed-form predictives (probit, bridge) from a MAP fit, ``"marglik"``
   otherwise.  ``info["log_evidence"]`` is log Z at the chosen δ (laplace-torch's
   ``log_marginal_likelihood``).
3. Posterior N(w*, (G + δP₀)⁻¹); ``num_samples`` draws are taken at fit end into a
   :class:`~inference.laplace.laplace_posterior.LaplacePosterior` (one chain).  Predictives
   (:mod:`inference.laplace.laplace_posterior`): ``"glm"`` Monte Carlo over the network linearised at the
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

import torch

from inference.laplace.curvature import WeightLayout, effective_dim, evaluation_mode, jacobian_path
from inference.laplace.evidence import log_evidence, mackay_precision, prior_moments, validation_search
from inference.laplace.map_ggn import covariance_root, hessian_structure, map_and_curvature
from inference.laplace.laplace_posterior import CLOSED_FORM, PREDICTIVES, KronRoot, LaplacePosterior, gaussian_draws
from inference.optim.map import MAPOptions
from inference.optim.start import INIT_STRATEGIES, batches_per_epoch
from inference.backends.base import Backend

__all__ = ["LaplaceConfig", "LaplaceBackend"]

HESSIANS = ("auto", "full", "kfac", "diag")
PRIOR_PRECISIONS = ("auto", "marglik", "model", "validation")


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
        prior_precision_grid: the δ searched by ``"validation"`` (``None``:
            :data:`inference.laplace.evidence.VALIDATION_GRID`).
        validation_fraction: the share of the training rows (a seeded random subset) held out by
            ``"validation"`` with one fold.
        validation_folds: the folds of ``"validation"``: 1 (default) holds ``validation_fraction`` out once (as
            laplace-torch's validation set); K ≥ 2 is K-fold cross-validation, every row held out once, a MAP per
            fold (K fits instead of one; a less noisy δ, docs/baselines.md).
        predictive: ``"auto"`` (probit for a categorical likelihood, else glm), ``"glm"`` (Monte Carlo
            over the linearised network), ``"sample"`` (network at the draws), ``"probit"`` or
            ``"bridge"`` (closed-form classification predictives).
        num_samples: draws taken at fit end.
        init, map_steps, map_lr: the MAP fit (``"current"``: the network's weights as they are, the
            likelihood's latents at their MAP for them); ``map_steps`` ``None``: the ``map`` backend's own
            budget, its default epochs of minibatches of 64 on the training rows (:func:`map_budget`), so that
            the Laplace approximation sits at the mode the ``map`` backend finds.
    """

    hessian: str = "auto"
    max_full_dim: int = 4000
    prior_precision: Union[str, float] = "auto"
    prior_precision_grid: Optional[list] = None
    validation_fraction: float = 0.2
    validation_folds: int = 1
    predictive: str = "auto"
    num_samples: int = 200
    init: str = "map"
    map_steps: Optional[int] = None
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
        folds = self.validation_folds
        if folds < 1:
            raise ValueError(f"validation_folds must be a whole number ≥ 1 (1: one held-out split, K ≥ 2: K-fold "
                             f"cross-validation), got {folds!r}")
        if folds > 1 and self.validation_fraction != LaplaceConfig.validation_fraction:
            raise ValueError(f"validation_fraction applies to one held-out split; validation_folds={folds} holds out "
                             f"1/{folds} of the rows in each fold: drop validation_fraction or set validation_folds=1")
        if self.prior_precision not in ("auto", "validation") and self._search_options_set():
            raise ValueError("prior_precision_grid, validation_fraction and validation_folds apply to "
                             "prior_precision='validation' only; add prior_precision='validation' or drop them")
        for name in ("num_samples", "max_full_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.map_steps is not None and int(self.map_steps) < 0:
            raise ValueError(f"map_steps must be non-negative, got {self.map_steps}")
        if not (math.isfinite(self.map_lr) and self.map_lr > 0):
            raise ValueError(f"map_lr must be positive, got {self.map_lr}")

    def _search_options_set(self) -> bool:
        """Whether an option of the validation search differs from its default."""
        return (self.prior_precision_grid is not None or self.validation_fraction != LaplaceConfig.validation_fraction
                or self.validation_folds != LaplaceConfig.validation_folds)

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
        map_fit = self.init == "map" and (self.map_steps is None or int(self.map_steps) > 0)
        if self.prior_precision == "auto":
            if predictive in CLOSED_FORM and map_fit:
                return "validation"
            if self._search_options_set():
                raise ValueError(f"prior_precision='auto' is 'marglik' here (predictive {predictive!r}, init "
                                 f"{self.init!r}): prior_precision_grid, validation_fraction and validation_folds do "
                                 f"not apply; drop them, or set prior_precision='validation'")
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


def map_budget(num_data: int) -> int:
    """The ``map`` backend's default number of Adam steps on ``num_data`` rows: its default epochs
    (:class:`~inference.optim.training.OptimiserOptions`) of minibatches of
    :data:`~inference.optim.start.MAP_BATCH_SIZE`."""
    return MAPOptions().epochs * batches_per_epoch(num_data)


class LaplaceBackend(Backend):
    """Laplace approximation on the selected subset (MacKay 1992; Daxberger et al. 2021); module docstring."""

    name = "laplace"
    Config = LaplaceConfig
    budget = "map-steps"

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
        structure = hessian_structure(config.hessian, config.max_full_dim, layout)
        if structure == "kfac":  # unsupported sites or layer priors: clear errors before the MAP fit
            KronRoot.check_prior(layout, p0)
        path = jacobian_path(layout, layout.flatten(bnn.initial_values()).detach(), x)  # refuses before the fit
        map_steps = map_budget(x.shape[0]) if config.map_steps is None else int(config.map_steps)
        fit_options = {"init": config.init, "map_steps": map_steps, "map_lr": config.map_lr}
        search = {}
        if rule == "validation":
            search = validation_search(bnn, layout, x, y, structure, path, p0, predictive, seed, progress,
                                       validation_fraction=config.validation_fraction, folds=config.validation_folds,
                                       grid=config.prior_precision_grid, **fit_options)
        w, latents, log_lik, eigenvalues, basis, record = map_and_curvature(bnn, layout, x, y, structure, path, p0,
                                                                            progress=progress, seed=seed, **fit_options)
        mu0 = mu0.to(w.device)
        sq_norm = float((p0.to(w.device) * (w.double() - mu0) ** 2).sum())
        if rule == "marglik":
            delta = mackay_precision(eigenvalues, sq_norm)
        elif rule == "validation":
            delta = search.pop("prior_precision_scale")
        else:
            delta = 1.0 if rule == "model" else float(rule)
        scale = covariance_root(structure, basis, (eigenvalues + delta).rsqrt(), w.dtype)
        draws = gaussian_draws(layout, w, scale, latents, config.num_samples, seed)
        info = {
            "backend": self.name, "config": asdict(config), "seed": seed, "num_data": x.shape[0],
            "num_random": layout.dim, "hessian_structure": structure, "jacobian_path": path, "predictive": predictive,
            "prior_precision_scale": delta, "effective_dim": effective_dim(eigenvalues, delta),
            "log_evidence": log_evidence(log_lik, eigenvalues, sq_norm, delta),
            "map_log_likelihood": log_lik, **record, **search, "fit_seconds": time.perf_counter() - started,
        }  # fmt: skip
        return LaplacePosterior(bnn, draws, w.detach(), scale, predictive, info=info)
