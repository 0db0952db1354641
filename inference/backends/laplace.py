"""The ``laplace`` backend: a Gaussian around the MAP of the random subset (MacKay 1992).

This module holds the options (:class:`LaplaceConfig`: the Hessian structure, the prior precision rule,
the predictive, the MAP fit) and the backend; the algorithm — MAP and GGN, the prior precision by the
evidence or a validation search, the Gaussian and its draws and predictives — is assembled from the parts
of :mod:`inference.laplace` by :func:`inference.laplace.fit.fit_laplace` (its module docstring describes
it step by step).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from inference.laplace.fit import fit_laplace
from inference.laplace.laplace_posterior import PREDICTIVES, VALIDATED
from inference.optim.checks import check_choice, check_interval, check_positive
from inference.optim.start import INIT_STRATEGIES
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
            ``"auto"`` (validation for a classifier's probit, bridge or glm predictive fitted from
            ``init="map"``, else marglik: on a classifier whose MAP separates the training rows the evidence's
            δ leaves every predictive near-uniform, :mod:`inference.laplace.evidence`).
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
            budget, its default epochs of minibatches of 64 on the training rows
            (:func:`~inference.optim.start.map_budget`), so that
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
            check_choice(name, getattr(self, name), valid)
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
        check_interval("validation_fraction", self.validation_fraction, "(0, 1)")
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
        check_positive("map_lr", self.map_lr)

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

    def resolved_prior_precision(self, predictive: str, likelihood) -> Union[str, float]:
        """The prior precision rule for the resolved ``predictive`` and the model's ``likelihood`` (``"auto"``
        resolved).

        Raises:
            ValueError: ``"validation"`` for regression, with the ``sample`` predictive or without a MAP fit."""
        map_fit = self.init == "map" and (self.map_steps is None or int(self.map_steps) > 0)
        classification = likelihood.task == "classification"
        if self.prior_precision == "auto":
            if classification and predictive in VALIDATED and map_fit:
                return "validation"
            if self._search_options_set():
                raise ValueError(f"prior_precision='auto' is 'marglik' here (predictive {predictive!r}, init "
                                 f"{self.init!r}): prior_precision_grid, validation_fraction and validation_folds do "
                                 f"not apply; drop them, or set prior_precision='validation'")
            return "marglik"
        if self.prior_precision == "validation":
            if not classification:
                raise ValueError(f"prior_precision='validation' scores a classifier's held-out NLL; this model's "
                                 f"{type(likelihood).__name__} is for regression: use prior_precision='marglik'")
            if predictive not in VALIDATED:
                raise ValueError(f"prior_precision='validation' scores the probit, bridge and glm predictives; "
                                 f"predictive is {predictive!r}: use predictive='glm' (the linearised network), "
                                 f"'probit' or 'bridge', or prior_precision='marglik'")
            if not map_fit:
                raise ValueError("prior_precision='validation' fits the MAP on part of the data and refits it on all "
                                 "of it; with init='current' or map_steps=0 use prior_precision='marglik' or a number")
        return self.prior_precision


class LaplaceBackend(Backend):
    """Laplace approximation on the selected subset (MacKay 1992; Daxberger et al. 2021); module docstring."""

    name = "laplace"
    Config = LaplaceConfig
    budget = "map-steps"

    def run(self, bnn, x, y, config, seed, progress):
        return fit_laplace(bnn, x, y, config, seed, progress, self.name)
