"""The ``mc-dropout`` backend: MC dropout (Gal & Ghahramani 2016) on the chosen layers.

Dropout with rate p (keep probability q = 1 − p) acts on the inputs of the *dropout
layers*: the ``nn.Linear`` layers whose whole weight is a chosen random site (other chosen
sites — biases, other layer types, partially random weights — are point estimates).  The
fit is the MAP optimisation of :func:`inference.backends.map.fit_map` with inverted dropout
active on those inputs during training (fresh per-example masks each step) and the
variational objective of Gal & Ghahramani 2016 (appendix, eq. for the KL term): with a
prior N(0, l⁻²) on each weight (length-scale l = 1/σ for a ``Normal(0, σ)`` prior) the
dropped weight matrices M carry the penalty q·l²/2·‖M‖² (q times their negative log prior),
the other random sites their full negative log prior, and the noise precision τ is learned
(MAP, its Gamma prior) jointly.  Dividing the objective by N τ gives the usual weight decay
λ = q l² / (2 N τ), i.e. τ = q l² / (2 N λ), the relation of Gal & Ghahramani 2016 between
the noise precision, the length-scale and the weight decay.  Other priors enter the same
way (q times their log density), which is the paper's derivation only for Normal priors.

The posterior: dropout on a layer's inputs with a mask z ∈ {0, 1}^in shared by all points
equals the weight W·diag(z)/q, so at the end of the fit ``num_samples`` S mask sets are
drawn (seeded by the fit's seed) and stored as S weight draws of every dropout layer — a
:class:`~inference.posterior.SamplePosterior` of one chain × S draws, whose other sites hold
the fitted point values.  Prediction is the mixture over those S draws (dropout kept on at
test time, the MC dropout predictive); each test point's predictive distribution is the
same as with per-point masks.  The network is put in ``eval()`` mode, so an architecture's
own dropout (``build_architecture(..., dropout=p)``) does not act in addition; that rate
is the default of the backend's ``dropout`` option.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..posterior import SamplePosterior
from .base import Backend, NonFiniteLossError
from .map import MAPConfig, fit_map, run_info

__all__ = ["MCDropoutConfig", "MCDropoutBackend", "dropout_layers", "DEFAULT_DROPOUT"]

#: rate used when neither the option nor the architecture sets one (in the range of the rates
#: Gal & Ghahramani 2016 searched on the UCI data sets)
DEFAULT_DROPOUT = 0.05


@dataclass
class MCDropoutConfig(MAPConfig):
    """:class:`~inference.backends.map.MAPConfig` plus the dropout rate p ∈ [0, 1) (``None``:
    the architecture's ``dropout`` when positive, else :data:`DEFAULT_DROPOUT`) and the number
    of stored mask draws ``num_samples``."""

    dropout: Optional[float] = None
    num_samples: int = 200

    def validate(self):
        super().validate()
        if self.dropout is not None and not (math.isfinite(self.dropout) and 0 <= self.dropout < 1):
            raise ValueError(f"dropout rate must lie in [0, 1), got {self.dropout}")
        if int(self.num_samples) < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")


def dropout_layers(bnn) -> dict[str, nn.Linear]:
    """``{site name: layer}`` of the chosen sites that are whole ``nn.Linear`` weights.

    Raises:
        ValueError: no chosen site is one (MC dropout would have nothing to drop).
    """
    layers = {}
    for site in bnn.sites:
        module_name, _, param = site.name.rpartition(".")
        module = bnn.net.get_submodule(module_name) if module_name else bnn.net
        if param == "weight" and site.mask is None and isinstance(module, nn.Linear):
            layers[site.name] = module
    if not layers:
        raise ValueError(
            f"mc-dropout drops the inputs of nn.Linear layers whose whole weight is random; none of the chosen "
            f"sites ({', '.join(s.name for s in bnn.sites) or 'none'}) is one; choose e.g. stochastic='all' or 'last'"
        )
    return layers


@contextlib.contextmanager
def _input_dropout(layers, rate: float):
    """Inverted dropout on the inputs of ``layers`` while active (training forward passes)."""
    hooks = [m.register_forward_pre_hook(lambda m, args: (F.dropout(args[0], rate, True), *args[1:]))
             for m in layers]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def masked_draws(point: dict, layers: dict, rate: float, num_samples: int, seed: int) -> dict:
    """``{site: [1, S, *shape]}``: dropout layers' weights W·diag(z_s)/q, z_s ~ Bernoulli(q)^in; others repeated."""
    generator = torch.Generator().manual_seed(seed)
    keep = 1.0 - rate
    draws = {}
    for name, value in point.items():
        if name in layers:
            masks = torch.bernoulli(torch.full((num_samples, value.shape[-1]), keep), generator=generator).to(value)
            draws[name] = (value.unsqueeze(0) * masks.unsqueeze(1) / keep).to(value.dtype)
        else:
            draws[name] = value.unsqueeze(0).expand(num_samples, *value.shape).clone()
    return {name: v.unsqueeze(0) for name, v in draws.items()}


class MCDropoutBackend(Backend):
    """MC dropout on the chosen layers (see the module docstring); fits from tensors or a DataLoader's batches."""

    name = "mc-dropout"
    Config = MCDropoutConfig
    accepts_loader = True  # fit_map reads a DataLoader's batches

    def run(self, bnn, x, y, config: MCDropoutConfig, seed: int, progress: bool) -> SamplePosterior:
        started = time.perf_counter()
        layers = dropout_layers(bnn)
        rate = config.dropout if config.dropout is not None else (getattr(bnn.net, "dropout", 0.0) or DEFAULT_DROPOUT)
        bnn.net.eval()  # the backend applies dropout itself, at the chosen layers only
        keep_weights = {name: 1.0 - rate for name in layers}

        def posterior(fit) -> SamplePosterior:
            info = run_info(self.name, config, seed, x, started, dropout=rate, dropout_sites=list(layers),
                            num_samples=config.num_samples, history=fit.history)
            return SamplePosterior(bnn, masked_draws(fit.values, layers, rate, config.num_samples, seed), info=info)

        try:
            fit = fit_map(bnn, x, y, config, seed, progress, prior_weights=keep_weights,
                          training_context=lambda: _input_dropout(layers.values(), rate),
                          desc=f"mc-dropout (p={rate:g})")
        except NonFiniteLossError as error:
            error.posterior = posterior(error.posterior)
            raise
        return posterior(fit)
