"""Backends for the variational families of seeds 002 and 004: ``svi-lrt``, ``graves``,
``sparse-vd``, ``kingma-vd`` and ``radial``.

All follow the one backend contract and share :func:`inference.backends.svi.run_training_loop`
(minibatches, Adam with the learning-rate schedule, KL warm-up/annealing of seed 002 eq. 4.2,
non-finite checks) and :func:`~inference.backends.svi.pretrain` (deterministic pretraining,
seed 002 §4.2.2: the guide's means start at the pretrained weights).  The objective per
minibatch is  −(N/n) Σ_batch E_q[log p(y|x,w)] + β KL(q ‖ p).

* ``graves`` — Gaussian mean-field with a Gaussian prior (the model's Normal prior, or
  N(``prior_mean``, ``prior_sd``²)) and its analytic KL (Graves 2011).  Default estimator
  ``"weights"``: one fused draw of all weights per step (:class:`MeanFieldGuide`'s fast path) —
  this is the library's default estimator for fully stochastic Linear networks
  (``benchmarks/svi_step.py``).
* ``svi-lrt`` — the same family and prior as ``svi``'s mean-field guide, trained with local
  reparameterisation (``estimator="lrt"``, Kingma et al. 2015) wherever a Linear/Conv layer's
  weight is fully random; weight sampling elsewhere.
* ``sparse-vd`` — sparse variational dropout (Molchanov et al. 2017), LRT by default.
* ``kingma-vd`` — variational dropout with α ≤ 1 (Kingma et al. 2015), LRT by default.
* ``radial`` — the Radial AutoGuide (Farquhar et al. 2020) through Pyro traces and
  :func:`inference.elbo.elbo_terms`; its KL uses ``mc_kl_samples`` = M draws with the
  ``"reparameterized"`` (seed 004, memory independent of M) or ``"naive"`` estimator.

Per-layer sparsity (the family's pruning rule, see :mod:`inference.variational.pruning`) is
computed after every epoch, shown in the progress bar and stored in
``posterior.info["history"]["sparsity" / "layer_sparsity"]``; ``posterior.info["sparsity"]``
holds the final report.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar, Optional

import pyro

from ..elbo import elbo_terms
from ..posterior import VariationalPosterior
from ..variational.families import get_family
from ..variational.meanfield import ESTIMATORS
from ..variational.pruning import guide_sparsity
from ..variational.radial import check_mc_kl_options
from .base import Backend
from .svi import LoopOptions, run_training_loop, start_fit

__all__ = [
    "MeanFieldConfig",
    "GravesConfig",
    "SVILRTConfig",
    "SparseVDConfig",
    "KingmaVDConfig",
    "RadialConfig",
    "GravesBackend",
    "SVILRTBackend",
    "SparseVDBackend",
    "KingmaVDBackend",
    "RadialBackend",
]


@dataclass
class MeanFieldConfig(LoopOptions):
    """Options shared by the mean-field family backends: :class:`~inference.backends.svi.LoopOptions` plus

    Attributes:
        estimator: ``"weights"`` (one draw of all weights per step) or ``"lrt"`` (local
            reparameterisation where applicable).
        prune_threshold: threshold of the family's pruning rule used for the tracked sparsity
            (default: the family's, 0.83 / 3 / 0).
        track_sparsity: compute per-layer sparsity after every epoch.
    """

    FAMILY: ClassVar[str] = "graves"

    estimator: str = "weights"
    prune_threshold: Optional[float] = None
    track_sparsity: bool = True

    def validate(self):
        super().validate()
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; valid estimators: {', '.join(ESTIMATORS)}")
        get_family(self.FAMILY).check_threshold(self.prune_threshold)

    def guide_kwargs(self) -> dict:
        return {"family": self.FAMILY, "init_scale": self.init_scale}


@dataclass
class GravesConfig(MeanFieldConfig):
    """:class:`MeanFieldConfig` plus Graves's prior: ``prior_mean`` / ``prior_sd`` replace the
    model's Normal prior's mean / sd in the KL when given (``None``: keep the model's)."""

    prior_mean: Optional[float] = None
    prior_sd: Optional[float] = None

    def validate(self):
        super().validate()
        if self.prior_mean is not None and not math.isfinite(self.prior_mean):
            raise ValueError(f"prior_mean must be finite, got {self.prior_mean}")
        if self.prior_sd is not None and not (math.isfinite(self.prior_sd) and self.prior_sd > 0):
            raise ValueError(f"prior_sd must be positive, got {self.prior_sd}")

    def guide_kwargs(self) -> dict:
        return {**super().guide_kwargs(), "prior_mean": self.prior_mean, "prior_sd": self.prior_sd}


@dataclass
class SVILRTConfig(MeanFieldConfig):
    """Mean-field Normal against the model's prior, local reparameterisation by default."""

    estimator: str = "lrt"


@dataclass
class SparseVDConfig(MeanFieldConfig):
    """Sparse VD: LRT (as Molchanov et al.), Adam lr 3e-3 and a KL ramp over 100 epochs."""

    FAMILY: ClassVar[str] = "sparse-vd"
    estimator: str = "lrt"
    lr: float = 3e-3
    kl_anneal_epochs: int = 100


@dataclass
class KingmaVDConfig(MeanFieldConfig):
    """Kingma VD: LRT (as Kingma et al. 2015), Adam lr 3e-3 and a KL ramp over 100 epochs."""

    FAMILY: ClassVar[str] = "kingma-vd"
    estimator: str = "lrt"
    lr: float = 3e-3
    kl_anneal_epochs: int = 100


@dataclass
class RadialConfig(LoopOptions):
    """Options of the ``radial`` backend: :class:`~inference.backends.svi.LoopOptions` plus

    Attributes:
        mc_kl_samples: M, Monte Carlo draws of the prior cross-entropy per step (≥ 1).
        mc_kl_estimator: ``"reparameterized"`` (seed 004; needs a Normal prior) or ``"naive"``.
        prune_threshold, track_sparsity: sparsity tracking with the rule |μ|/σ < λ (default 0.83).
    """

    mc_kl_samples: int = 10
    mc_kl_estimator: str = "reparameterized"
    prune_threshold: Optional[float] = None
    track_sparsity: bool = True

    def validate(self):
        super().validate()
        check_mc_kl_options(self.mc_kl_samples, self.mc_kl_estimator)
        get_family("graves").check_threshold(self.prune_threshold)


#: per-epoch history of the variational backends (the SVI loop's plus the tracked sparsity)
HISTORY_KEYS = ("epoch", "loss", "expected_log_likelihood", "kl", "kl_weight", "lr", "sparsity", "layer_sparsity")


class _VariationalBackend(Backend):
    """Shared run(): pretraining, guide, the shared loop, sparsity tracking, the posterior."""

    guide_name = ""

    def _guide_kwargs(self, config) -> dict:
        raise NotImplementedError

    def _objective(self, bnn, guide, x, y, num_data, config):
        raise NotImplementedError

    def _extra_info(self, bnn, guide, config) -> dict:
        return {}

    def run(self, bnn, x, y, config, seed: int, progress: bool) -> VariationalPosterior:
        if not bnn.sites:
            raise ValueError(
                f"backend {self.name!r} needs random weights but the model has none (stochastic='none'); "
                f"choose stochastic='all', 'last' or a module pattern, or use backend 'svi' for the deterministic net"
            )
        guide_kwargs = self._guide_kwargs(config)
        start = start_fit(self.name, bnn, x, y, config, seed, progress, self.guide_name, guide_kwargs, HISTORY_KEYS)
        guide, history, info = start.guide, start.history, start.info
        info.update(self._extra_info(bnn, guide, config))
        num_data = x.shape[0]

        def result():
            info["fit_seconds"] = time.perf_counter() - start.started
            info["sparsity"] = guide_sparsity(guide, bnn, config.prune_threshold)
            return VariationalPosterior(bnn, guide, self.guide_name, guide_kwargs, info)

        def on_epoch(epoch):
            report = guide_sparsity(guide, bnn, config.prune_threshold)
            history["sparsity"].append(report["sparsity"])
            history["layer_sparsity"].append(report["layers"])
            return {"sparsity": f"{report['sparsity']:.3f}", "layers": "/".join(f"{v:.2f}" for v in report["layers"].values())}

        objective = self._objective(bnn, guide, x, y, num_data, config)
        run_training_loop(
            objective, start.params, num_data, config, start.generator, history, result,
            desc=f"{self.name} ({bnn.num_random} random)", progress=progress,
            on_epoch=on_epoch if config.track_sparsity else None, fused_adam=True,
        )
        return result()


class _MeanFieldBackend(_VariationalBackend):
    guide_name = "mean-field"

    def _guide_kwargs(self, config):
        return config.guide_kwargs()

    def _extra_info(self, bnn, guide, config):
        lrt = guide.lrt_module_names(bnn) if config.estimator == "lrt" else []
        return {"family": config.FAMILY, "estimator": config.estimator, "lrt_modules": lrt}

    def _objective(self, bnn, guide, x, y, num_data, config):
        def objective(index, beta):
            loss, loglik, kl = 0.0, 0.0, 0.0
            for _ in range(config.num_particles):
                ell, divergence = guide.elbo_terms(bnn, x[index], y[index], num_data, config.estimator)
                loss = loss + (beta * divergence - ell) / config.num_particles
                loglik = loglik + ell.detach() / config.num_particles
                kl = kl + divergence.detach() / config.num_particles
            return loss, loglik, kl

        return objective


class GravesBackend(_MeanFieldBackend):
    name = "graves"
    Config = GravesConfig


class SVILRTBackend(_MeanFieldBackend):
    name = "svi-lrt"
    Config = SVILRTConfig


class SparseVDBackend(_MeanFieldBackend):
    name = "sparse-vd"
    Config = SparseVDConfig


class KingmaVDBackend(_MeanFieldBackend):
    name = "kingma-vd"
    Config = KingmaVDConfig


class RadialBackend(_VariationalBackend):
    name = "radial"
    Config = RadialConfig
    guide_name = "radial"

    def _guide_kwargs(self, config):
        return {
            "init_scale": config.init_scale,
            "mc_kl_samples": config.mc_kl_samples,
            "mc_kl_estimator": config.mc_kl_estimator,
        }

    def _extra_info(self, bnn, guide, config):
        return {"mc_kl_samples": config.mc_kl_samples, "mc_kl_estimator": config.mc_kl_estimator}

    def _objective(self, bnn, guide, x, y, num_data, config):
        def objective(index, beta):
            loss, loglik, kl = 0.0, 0.0, 0.0
            for _ in range(config.num_particles):
                with pyro.validation_enabled(False):
                    terms = elbo_terms(bnn.model, guide, x[index], y[index], num_data)
                loss = loss + terms.loss(beta) / config.num_particles
                loglik = loglik + terms.expected_log_likelihood.detach() / config.num_particles
                kl = kl + terms.kl.detach() / config.num_particles
            return loss, loglik, kl

        return objective
