"""The ``mc-dropout`` backend: MC dropout (Gal & Ghahramani 2016) on the chosen layers.

Dropout with rate p (keep probability q = 1 − p) acts on the inputs of the *dropout
layers*: the ``nn.Linear`` layers whose whole weight is a chosen random site (other chosen
sites — biases, other layer types, partially random weights — are point estimates).  The
fit is the MAP optimisation of :func:`inference.optim.map.fit_map` with inverted dropout
active on those inputs during training (fresh per-example masks each step) and the
variational objective of Gal & Ghahramani 2016 (appendix, eq. for the KL term): with a
prior N(0, l⁻²) on each weight (length-scale l = 1/σ for a ``Normal(0, σ)`` prior) the
dropped weight matrices M carry the penalty q·l²/2·‖M‖² (q times their negative log prior),
the other random sites their full negative log prior, and the noise precision τ is learned
(MAP, its Gamma prior) jointly.  Dividing the objective by N τ gives the usual weight decay
λ = q l² / (2 N τ), i.e. τ = q l² / (2 N λ), the relation of Gal & Ghahramani 2016 between
the noise precision, the length-scale and the weight decay.  Other priors enter the same
way (q times their log density), which is the paper's derivation only for Normal priors.
Learned under dropout, τ fits the residuals of the dropped-out network, so it holds the masks'
spread that the MC predictive adds again; after the fit the stored draws' latents are set to
those that maximise the MC predictive's log density on the training rows
(:func:`inference.dropout.sampling.predictive_latents`), the criterion by which the paper
chooses τ on validation data.

The posterior: dropout on a layer's inputs with a mask z ∈ {0, 1}^in shared by all points
equals the weight W·diag(z)/q, so at the end of the fit ``num_samples`` S mask sets are
drawn (seeded by the fit's seed) and stored as S weight draws of every dropout layer — a
:class:`~inference.posterior.SamplePosterior` of one chain × S draws, whose other sites hold
the fitted point values.  Prediction is the mixture over those S draws (dropout kept on at
test time, the MC dropout predictive); each test point's predictive distribution is the
same as with per-point masks.  The network is put in ``eval()`` mode, so an architecture's
own dropout (``build_architecture(..., dropout=p)``) does not act in addition; that rate
is the default of the backend's ``dropout`` option.

``protocol="gal2016"`` is the UCI protocol of Gal & Ghahramani 2016 as their code runs it
(:mod:`inference.dropout.gal2016`): a validation search over the grid ``dropout_grid`` × ``tau_grid`` on
the first 80 % of the training rows, then one refit on all of them with the best cell.  The selection is
in ``info["validation"]`` (one row per cell) and ``info["dropout"]`` / ``info["tau"]``.  The paper
reports 10 000 MC draws (``num_samples=10000``); the default 200 is for interactive use.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Optional

from inference.dropout.gal2016 import GAL2016_TRAINING, cell_draws, search_gal2016
from inference.dropout.sampling import dropout_layers, fit_dropout_map, masked_draws, predictive_latents
from inference.optim.map import MAPOptions, run_info
from inference.optim.training import NonFiniteLossError, OptimiserOptions
from inference.posterior import SamplePosterior
from inference.backends.base import Backend

__all__ = ["MCDropoutConfig", "MCDropoutBackend", "DEFAULT_DROPOUT", "PROTOCOLS"]

#: rate used when neither the option nor the architecture sets one (in the range of the rates
#: Gal & Ghahramani 2016 searched on the UCI data sets)
DEFAULT_DROPOUT = 0.05
PROTOCOLS = ("fixed", "gal2016")


@dataclass
class MCDropoutConfig(MAPOptions):
    """The MAP optimiser's options (:class:`~inference.optim.map.MAPOptions`) plus the dropout rate
    p ∈ [0, 1) (``None``: the architecture's ``dropout`` when positive, else :data:`DEFAULT_DROPOUT`), the
    number of stored mask draws ``num_samples`` and the ``protocol``: ``"fixed"`` (that rate, the noise
    learned) or ``"gal2016"`` (the validation search of :mod:`inference.dropout.gal2016` over
    ``dropout_grid`` (default :data:`~inference.dropout.gal2016.GAL2016_DROPOUT_GRID`) × ``tau_grid``
    (noise precisions in original target units; ``None``: learned), with ``length_scale`` l and
    ``validation_fraction``).  ``epochs`` ``None`` is 200 (fixed) or the protocol's 4000 (gal2016);
    gal2016 trains with the paper's minibatch, rate and schedule
    (:data:`~inference.dropout.gal2016.GAL2016_TRAINING`), so those options keep their defaults there."""

    epochs: Optional[int] = None
    dropout: Optional[float] = None
    num_samples: int = 200
    protocol: str = "fixed"
    dropout_grid: Optional[list] = None
    tau_grid: Optional[list] = None
    length_scale: float = 1e-2
    validation_fraction: float = 0.2

    @property
    def own_budget(self) -> bool:
        """Whether the protocol sets the epochs (:mod:`lab.runs.spec` then keeps ``epochs=None``)."""
        return self.protocol == "gal2016"

    def resolved(self) -> "MCDropoutConfig":
        """This config with the protocol's epochs (and, for gal2016, its training settings) filled in."""
        if self.protocol == "gal2016":
            return dataclasses.replace(self, **{**GAL2016_TRAINING, "epochs": GAL2016_TRAINING["epochs"] if self.epochs is None else self.epochs})
        return dataclasses.replace(self, epochs=200 if self.epochs is None else self.epochs)

    def validate(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r} of mc-dropout; valid: {', '.join(PROTOCOLS)}")
        MAPOptions.validate(self.resolved())
        if self.dropout is not None and not (math.isfinite(self.dropout) and 0 <= self.dropout < 1):
            raise ValueError(f"dropout rate must lie in [0, 1), got {self.dropout}")
        if int(self.num_samples) < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")
        if self.protocol == "fixed":
            for name in ("dropout_grid", "tau_grid"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is searched by protocol='gal2016' only; add protocol='gal2016' or "
                                     f"drop {name}")
            return
        if self.dropout is not None:
            raise ValueError("protocol='gal2016' chooses the dropout rate from dropout_grid on validation data: drop "
                             "dropout= (or pass dropout_grid=[rate] to fix it)")
        defaults = OptimiserOptions()
        for name in ("batch_size", "lr", "lr_schedule", "lr_final_factor", "lr_step_fraction", "optimizer"):
            if getattr(self, name) != getattr(defaults, name):
                raise ValueError(f"protocol='gal2016' trains with Gal & Ghahramani 2016's settings (Adam lr 1e-3, "
                                 f"minibatches of 128, a constant rate; only epochs may change): option {name} does "
                                 f"not apply; use protocol='fixed' to set it")
        _check_grid("dropout_grid", self.dropout_grid, lambda v: 0 <= v < 1, "rates in [0, 1)")
        _check_grid("tau_grid", self.tau_grid, lambda v: v > 0, "positive noise precisions (original target units)")
        if not (math.isfinite(self.length_scale) and self.length_scale > 0):
            raise ValueError(f"length_scale must be positive, got {self.length_scale}")
        if not (math.isfinite(self.validation_fraction) and 0 < self.validation_fraction < 1):
            raise ValueError(f"validation_fraction must lie in (0, 1), got {self.validation_fraction}")


def _check_grid(name: str, values, valid, what: str) -> None:
    if values is None:
        return
    ok = isinstance(values, (list, tuple)) and len(values) > 0 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and valid(v) for v in values)
    if not ok:
        raise ValueError(f"{name} must be a non-empty list of {what}, got {values!r}")


class MCDropoutBackend(Backend):
    """MC dropout on the chosen layers (see the module docstring); fits from tensors or a DataLoader's batches."""

    name = "mc-dropout"
    Config = MCDropoutConfig
    accepts_loader = True  # the MAP fit reads a DataLoader's batches
    budget = "map"

    def run(self, bnn, x, y, config: MCDropoutConfig, seed: int, progress: bool) -> SamplePosterior:
        started = time.perf_counter()
        layers = dropout_layers(bnn)
        if config.protocol == "gal2016":
            config = config.resolved()
            found = search_gal2016(bnn, x, y, config, layers, seed, progress)
            info = run_info(self.name, config, seed, x, started, protocol="gal2016", dropout=found.rate, tau=found.tau,
                            dropout_sites=list(layers), num_samples=config.num_samples,
                            num_validation=found.num_validation, validation=found.validation,
                            **({"history": found.history} if found.history is not None else {}))
            draws = cell_draws(bnn, found.point, layers, found.rate, found.tau, config.num_samples, seed)
            return SamplePosterior(bnn, draws, info=info)
        config = config.resolved()
        rate = config.dropout if config.dropout is not None else (getattr(bnn.net, "dropout", 0.0) or DEFAULT_DROPOUT)
        bnn.net.eval()  # the backend applies dropout itself, at the chosen layers only

        def posterior(fit, draws) -> SamplePosterior:
            info = run_info(self.name, config, seed, x, started, dropout=rate, dropout_sites=list(layers),
                            num_samples=config.num_samples, history=fit.history)
            return SamplePosterior(bnn, draws, info=info)

        try:
            fit = fit_dropout_map(bnn, x, y, config, layers, rate, seed, progress)
        except NonFiniteLossError as error:
            error.posterior = posterior(error.posterior, masked_draws(error.posterior.values, layers, rate,
                                                                      config.num_samples, seed))
            raise
        draws = masked_draws(fit.values, layers, rate, config.num_samples, seed)
        return posterior(fit, predictive_latents(bnn, draws, x, y))
