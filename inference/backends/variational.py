"""Backends of the variational families: ``svi-lrt``, ``graves``, ``sparse-vd``, ``kingma-vd``
and ``radial``.

All follow the one backend contract and train with the one training loop,
:func:`inference.variational.fit.fit_guide` (minibatches, Adam with the learning-rate schedule, KL
annealing, deterministic pretraining — the guide's means start at the pretrained weights —,
particle averaging, non-finite checks).  The objective per minibatch is
−(N/n) Σ_batch E_q[log p(y|x,w)] + β KL(q ‖ p).  The length of ``svi-lrt``, ``graves`` and ``radial`` is chosen
on held-out rows unless ``epochs`` is given (:mod:`inference.variational.length`: the held-out predictive of q at
the end of each fit of a ladder of doubling lengths, each with its own cosine schedule, then a refit on every row
for the best length; ``early_stopping=False``: the fixed 200 epochs); the dropout families keep their budget from
the data size (``early_stopping=True`` chooses within it).

* ``graves`` — Gaussian mean-field with a Gaussian prior (the model's Normal prior, or
  N(``prior_mean``, ``prior_sd``²)) and its analytic KL (Graves 2011).  Default estimator
  ``"lrt"`` (below; until issue 38's sixth pass ``"weights"``, one fused draw of all weights per step
  shared by the minibatch, as seed 002's Graves layers draw them — still ``estimator="weights"``, and the
  seed-002 grid's choice).
* ``svi-lrt`` — the same family and prior as ``svi``'s mean-field guide, trained with local
  reparameterisation (``estimator="lrt"``, Kingma, Salimans & Welling 2015) wherever a
  Linear/Conv layer's weight is fully random; weight sampling elsewhere.  ``graves`` without its prior options.
* ``sparse-vd`` — sparse variational dropout (Molchanov, Ashukha & Vetrov 2017), LRT by default.
* ``kingma-vd`` — variational dropout with α ≤ 1 (Kingma, Salimans & Welling 2015), LRT by default.
  Both train for a length set by the data size (:class:`DropoutVDConfig`: at least 5000 steps, a
  quarter of the epochs as pretraining; ``protocol="paper"`` keeps the fixed 200 epochs).
* ``radial`` — the Radial AutoGuide (Farquhar, Osborne & Gal 2020); its prior cross-entropy is
  exact by default, or estimated from ``mc_kl_samples`` = M draws with the ``"reparameterized"``
  (memory independent of M; Nazarovs et al. 2021) or ``"naive"`` estimator.
  Option ``elbo_path`` as for ``svi`` (:mod:`inference.variational.elbo_paths`): ``"fused"``
  (:meth:`AutoRadial.elbo_terms`, no Pyro traces, the same random numbers and estimator) wherever
  the model's Pyro program is the stock one, else ``"pyro-trace"``
  (:func:`inference.variational.elbo.elbo_terms`); ``info["elbo_path"]`` records it.

Per-layer sparsity (the family's pruning rule, see :mod:`inference.variational.pruning`) is
computed after every epoch, shown in the progress bar and stored in
``posterior.info["history"]["sparsity" / "layer_sparsity"]``; ``posterior.info["sparsity"]``
holds the final report.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from inference.backends.base import Backend
from inference.optim.batches import as_batches
from inference.optim.training import LoopOptions
from inference.variational.posterior import VariationalPosterior
from inference.variational.elbo_paths import check_elbo_path, elbo_particle, elbo_path_info, resolve_elbo_path
from inference.variational.families import get_family
from inference.variational.fit import fit_guide
from inference.variational.guides import stock_model_blocker
from inference.variational.length import HeldOutLengthOptions, fit_held_out_length
from inference.variational.meanfield import ESTIMATORS
from inference.variational.protocol import SNR_RULE
from inference.variational.radial_kl import resolve_mc_kl
from inference.variational.stacked_radial import fit_radial_stacked, radial_stack_blocker

__all__ = [
    "MeanFieldConfig",
    "DropoutVDConfig",
    "VD_PROTOCOLS",
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


#: the dropout families' training budgets (:class:`DropoutVDConfig`)
VD_PROTOCOLS = ("data-size", "paper")
#: epochs of the ``"paper"`` budget, and the least of ``"data-size"``
PAPER_EPOCHS = 200
#: optimisation steps the ``"data-size"`` budget trains for at least
MIN_STEPS = 5000


@dataclass
class MeanFieldConfig(HeldOutLengthOptions, LoopOptions):
    """Options shared by the mean-field family backends: :class:`~inference.optim.training.LoopOptions`, the
    held-out choice of the length (:class:`~inference.variational.length.HeldOutLengthOptions`; the dropout
    families keep their own budget, :class:`DropoutVDConfig`) plus

    Attributes:
        estimator: ``"lrt"`` (default: local reparameterisation, Kingma, Salimans & Welling 2015, wherever a
            Linear/Conv layer's weight is wholly random; weight draws elsewhere) or ``"weights"`` (one draw of all
            weights per step, shared by the minibatch: seed 002's Graves layers).  Both estimate the same ELBO;
            LRT's gradient variance falls with the batch size, and Graves over every weight of UCI energy reached
            its held-out optimum only after ~33 000 steps with ``"weights"`` (issue 38, RESULTS section 7).
        prune_threshold: threshold of the family's pruning rule used for the tracked sparsity
            (default: the family's, 0.83 / 3 / 0).
        track_sparsity: compute per-layer sparsity after every epoch.
    """

    FAMILY: ClassVar[str] = "graves"

    estimator: str = "lrt"
    prune_threshold: Optional[float] = None
    track_sparsity: bool = True

    def validate(self):
        super().validate()
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; valid estimators: {', '.join(ESTIMATORS)}")
        get_family(self.FAMILY).pruning_rule.check_threshold(self.prune_threshold)

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
    """Mean-field Normal against the model's prior, local reparameterisation by default (``graves`` without
    its prior options)."""


@dataclass
class DropoutVDConfig(MeanFieldConfig):
    """The variational-dropout families' options: LRT, Adam lr 3e-3, a KL ramp over 100 epochs, and a
    training length from the data size.

    Attributes:
        protocol: ``"data-size"`` (default) — ``epochs`` ``None`` is the papers' 200, or more on small
            data so that the fit takes at least ``min_steps`` optimisation steps
            (``max(200, ⌈min_steps / steps per epoch⌉)``), and ``pretrain_epochs`` ``None`` a quarter of
            them (deterministic pretraining: the guide's means start at the pretrained weights, as
            Molchanov, Ashukha & Vetrov 2017 start from a pretrained network; a model with a learned noise
            pretrains for the epochs of the best held-out log-likelihood, at most ``epochs``, and keeps the noise
            — and a last-layer model's deterministic body — at the pretrained values while the guide trains, so
            the dropout noise under q is not learned into the noise and counted twice in the predictive:
            :func:`inference.variational.fit.fit_guide`'s ``held_out_pretraining``); or ``"paper"`` — the fixed
            budget these backends had before issue 38, whatever the data size: 200 epochs from the
            network's own initialisation (``pretrain_epochs`` ``None`` is 0).  Given values are kept.
        min_steps: the optimisation steps ``"data-size"`` trains for at least (default 5000, the
            command line's target; 200 epochs of batch 64 on 200 points are only 800).
    """

    lr: float = 3e-3
    kl_anneal_epochs: int = 100
    epochs: Optional[int] = None
    pretrain_epochs: Optional[int] = None
    protocol: str = "data-size"
    min_steps: int = MIN_STEPS

    @property
    def own_budget(self) -> bool:
        """Whether the protocol sets the epochs (:mod:`lab.runs.spec` then keeps ``epochs=None``)."""
        return self.protocol == "paper"

    def resolved(self, steps_per_epoch: int) -> "DropoutVDConfig":
        """This config with ``epochs`` and ``pretrain_epochs`` filled in for ``steps_per_epoch`` steps per epoch."""
        epochs, pretrain_epochs = self.epochs, self.pretrain_epochs
        if epochs is None:
            epochs = PAPER_EPOCHS if self.protocol == "paper" else max(
                PAPER_EPOCHS, math.ceil(self.min_steps / max(1, steps_per_epoch)))
        if pretrain_epochs is None:
            pretrain_epochs = 0 if self.protocol == "paper" else epochs // 4
        return dataclasses.replace(self, epochs=epochs, pretrain_epochs=pretrain_epochs)

    def validate(self):
        if self.protocol not in VD_PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r} of {self.FAMILY}; valid: {', '.join(VD_PROTOCOLS)}")
        if int(self.min_steps) < 1:
            raise ValueError(f"min_steps must be at least 1, got {self.min_steps}")
        MeanFieldConfig.validate(self.resolved(1))  # the other options, at a stand-in data size


@dataclass
class SparseVDConfig(DropoutVDConfig):
    """Sparse VD (Molchanov, Ashukha & Vetrov 2017): :class:`DropoutVDConfig`."""

    FAMILY: ClassVar[str] = "sparse-vd"


@dataclass
class KingmaVDConfig(DropoutVDConfig):
    """Variational dropout with α ≤ 1 (Kingma, Salimans & Welling 2015): :class:`DropoutVDConfig`."""

    FAMILY: ClassVar[str] = "kingma-vd"


@dataclass
class RadialConfig(HeldOutLengthOptions, LoopOptions):
    """Options of the ``radial`` backend: :class:`~inference.optim.training.LoopOptions`, the held-out choice of
    the length (:class:`~inference.variational.length.HeldOutLengthOptions`) plus

    Attributes:
        mc_kl_samples: M, Monte Carlo draws of the prior cross-entropy per step (≥ 1); giving it
            selects a Monte Carlo estimator (default: none, the exact cross-entropy).
        mc_kl_estimator: ``"exact"`` (closed form; needs a Normal prior), ``"reparameterized"``
            (M-independent Monte Carlo; needs a Normal prior) or ``"naive"`` (any prior); default
            ``"exact"`` without M, ``"reparameterized"`` with it (``resolve_mc_kl``).
        prune_threshold, track_sparsity: sparsity tracking with the rule |μ|/σ < λ (default 0.83).
        elbo_path: ``"auto"`` (fused where the model allows it), ``"fused"`` or ``"pyro-trace"``.
    """

    mc_kl_samples: Optional[int] = None
    mc_kl_estimator: Optional[str] = None
    prune_threshold: Optional[float] = None
    track_sparsity: bool = True
    elbo_path: str = "auto"

    def validate(self):
        super().validate()
        resolve_mc_kl(self.mc_kl_samples, self.mc_kl_estimator)
        SNR_RULE.check_threshold(self.prune_threshold)
        check_elbo_path(self.elbo_path)


class _VariationalBackend(Backend):
    """Shared run(): the family's guide and particle through :func:`~inference.variational.fit.fit_guide`,
    with sparsity tracking by the family's pruning rule.  Subclasses set ``guide_name`` and define
    ``_guide_kwargs(config)``, ``_particle(bnn, config)`` and ``_extra_info(bnn, guide, config)``; a config
    with ``resolved(steps_per_epoch)`` (:class:`DropoutVDConfig`) gets its training length from the data."""

    guide_name = ""
    budget = "elbo"
    prunes = True  # the family's pruning rule (prune_threshold)

    def run(self, bnn, x, y, config, seed: int, progress: bool) -> VariationalPosterior:
        if not bnn.sites:
            raise ValueError(
                f"backend {self.name!r} needs random weights but the model has none (stochastic='none'); "
                f"choose stochastic='all', 'last' or a module pattern, or use backend 'svi' for the deterministic net"
            )
        if isinstance(config, DropoutVDConfig):
            config = config.resolved(as_batches(x, y, config.batch_size).steps_per_epoch)

        def one_fit(xs, ys, options, stop, held_out):
            return fit_guide(
                self.name, bnn, xs, ys, options, seed, progress, self.guide_name, self._guide_kwargs(options),
                self._particle(bnn, options), info=lambda guide: self._extra_info(bnn, guide, options),
                sparsity=(options.prune_threshold, options.track_sparsity and not held_out), fused_adam=True,
                held_out_pretraining=isinstance(options, DropoutVDConfig) and options.protocol == "data-size", stop=stop,
                desc=f"{self.name} (held-out length)" if held_out else None,
            )

        return fit_held_out_length(one_fit, bnn, x, y, config, seed)


class _MeanFieldBackend(_VariationalBackend):
    guide_name = "mean-field"

    def _guide_kwargs(self, config):
        return config.guide_kwargs()

    def _extra_info(self, bnn, guide, config):
        lrt = guide.lrt_module_names(bnn) if config.estimator == "lrt" else []
        return {"family": config.FAMILY, "estimator": config.estimator, "lrt_modules": lrt}

    def _particle(self, bnn, config):
        return lambda guide, xb, yb, num_data: guide.elbo_terms(bnn, xb, yb, num_data, config.estimator)


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
    fit_stacked = staticmethod(fit_radial_stacked)  # the fused path with the exact cross-entropy
    stack_blocker = staticmethod(radial_stack_blocker)
    stacks_trained_body = True
    stacks_weight_priors = True

    def _guide_kwargs(self, config):
        return {
            "init_scale": config.init_scale,
            "mc_kl_samples": config.mc_kl_samples,
            "mc_kl_estimator": config.mc_kl_estimator,
        }

    def _extra_info(self, bnn, guide, config):
        path, reason = resolve_elbo_path(config.elbo_path, stock_model_blocker(bnn))
        estimator = guide.mc_kl_estimator
        samples = None if estimator == "exact" else guide.mc_kl_samples
        return {"mc_kl_samples": samples, "mc_kl_estimator": estimator, **elbo_path_info(path, reason)}

    def _particle(self, bnn, config):
        path, _ = resolve_elbo_path(config.elbo_path, stock_model_blocker(bnn))
        return elbo_particle(bnn, path)
