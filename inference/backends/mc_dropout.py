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

``protocol="gal2016"`` is the UCI protocol of Gal & Ghahramani 2016 as their code runs it
(DropoutUncertaintyExps, after its 2018 grid-search update): the first 80 % of the training rows
(``validation_fraction`` 0.2 held out, in the data's order) fit one network per cell of the grid
``dropout_grid`` × ``tau_grid`` (the paper's per-dataset grids ship with the bundled UCI sets,
``Dataset.info["dropout_rates"]`` / ``["tau_values"]``), the cell with the best validation
log-likelihood (``num_samples`` MC draws) wins, and one network is refitted on all training rows with
it.  Each fit is the paper's: dropout before every whole-weight ``nn.Linear``, Glorot-uniform weights
and zero biases, the loss mean (y − f)² (standardised targets) + λ Σ‖W‖² over those weights with
λ = l²(1 − p)/(2 N τ) (l = ``length_scale`` 1e-2, N the rows of that fit), Adam (lr 1e-3, ε 1e-7) on
minibatches of 128 for ``epochs``, the noise precision held at τ (original target units, as in the
paper's code) for the predictive density.  ``epochs`` defaults to 4000, the UCI files' 40 × 100 that
the grid-search code ran for its per-split result files; the code behind the 2016 tables ran 40 × 10
= 400, which underfits here (yacht split 0, p = 0.01, τ = 0.54: train RMSE 1.69 and test RMSE 1.93
after 400 epochs, where their log has 0.92; a plain PyTorch MLP with the same settings gets 1.93).  The grid's cells train as one
``vmap``-ed model.  Without ``tau_grid`` the noise precision is learned (MAP, as with
``protocol="fixed"``) and only the rate is searched (also the choice for classification).  The
selection is in ``info["validation"]`` (one row per cell) and ``info["dropout"]`` / ``info["tau"]``.
The paper reports 10 000 MC draws (``num_samples=10000``); the default 200 is for interactive use.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from zoo.likelihoods import GaussianLikelihood

from inference.optim.batches import LoaderBatches
from inference.posterior import SamplePosterior
from inference.optim.training import OptimiserOptions
from inference.backends.base import Backend, NonFiniteLossError
from inference.backends.ensemble import member_initial_values
from inference.backends.map import MAPConfig, fit_map, run_info

__all__ = ["MCDropoutConfig", "MCDropoutBackend", "dropout_layers", "DEFAULT_DROPOUT", "PROTOCOLS",
           "GAL2016_DROPOUT_GRID", "GAL2016_TRAINING"]

#: rate used when neither the option nor the architecture sets one (in the range of the rates
#: Gal & Ghahramani 2016 searched on the UCI data sets)
DEFAULT_DROPOUT = 0.05
PROTOCOLS = ("fixed", "gal2016")
#: the dropout rates of Gal & Ghahramani 2016's grid (the same file for every UCI set of their code)
GAL2016_DROPOUT_GRID = (0.005, 0.01, 0.05, 0.1)
#: their grid-search code's training: epochs (the UCI files' n_epochs 40 × 100, the runs of its result files), minibatch,
#: Adam's rate and a constant schedule
GAL2016_TRAINING = {"epochs": 4000, "batch_size": 128, "lr": 1e-3, "lr_schedule": "constant"}


@dataclass
class MCDropoutConfig(MAPConfig):
    """:class:`~inference.backends.map.MAPConfig` plus the dropout rate p ∈ [0, 1) (``None``:
    the architecture's ``dropout`` when positive, else :data:`DEFAULT_DROPOUT`), the number
    of stored mask draws ``num_samples`` and the ``protocol``: ``"fixed"`` (that rate, the noise
    learned) or ``"gal2016"`` (the validation search of the module docstring over ``dropout_grid``
    (default :data:`GAL2016_DROPOUT_GRID`) × ``tau_grid`` (noise precisions in original target
    units; ``None``: learned), with ``length_scale`` l and ``validation_fraction``).  ``epochs``
    ``None`` is 200 (fixed) or the protocol's 4000 (gal2016); gal2016 trains with the paper's minibatch,
    rate and schedule (:data:`GAL2016_TRAINING`), so those options keep their defaults there."""

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
        """Whether the protocol sets the epochs (:mod:`lab.runs` then keeps ``epochs=None``)."""
        return self.protocol == "gal2016"

    def resolved(self) -> "MCDropoutConfig":
        """This config with the protocol's epochs (and, for gal2016, its training settings) filled in."""
        if self.protocol == "gal2016":
            return dataclasses.replace(self, **{**GAL2016_TRAINING, "epochs": GAL2016_TRAINING["epochs"] if self.epochs is None else self.epochs})
        return dataclasses.replace(self, epochs=200 if self.epochs is None else self.epochs)

    def validate(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r} of mc-dropout; valid: {', '.join(PROTOCOLS)}")
        MAPConfig.validate(self.resolved())
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


def _fit_rate(bnn, x, y, config: MCDropoutConfig, layers: dict, rate: float, seed: int, progress: bool):
    """The MAP fit with dropout ``rate`` on ``layers`` and the prior scaled by q = 1 − rate (noise learned)."""
    return fit_map(bnn, x, y, config, seed, progress, prior_weights={name: 1.0 - rate for name in layers},
                   training_context=lambda: _input_dropout(layers.values(), rate), desc=f"mc-dropout (p={rate:g})")


def _glorot_start(bnn, layers: dict, seed: int) -> dict:
    """Fresh site values (:func:`member_initial_values`) with Keras' Dense initialisation on ``layers``:
    Glorot-uniform weights U(±√(6/(in + out))) and zero biases (Glorot & Bengio 2010)."""
    start = member_initial_values(bnn, seed)
    generator = torch.Generator().manual_seed(seed)
    for name, layer in layers.items():
        fan_out, fan_in = layer.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        start[name] = ((torch.rand(layer.weight.shape, generator=generator) * 2 - 1) * bound).to(start[name])
        bias = name[: -len("weight")] + "bias"
        if bias in start:
            start[bias] = torch.zeros_like(start[bias])
    return start


def _train_cells(bnn, layers: dict, x, y, cells: list, config: MCDropoutConfig, seed: int, progress: bool) -> dict:
    """Gal & Ghahramani 2016's fits of the grid ``cells`` [(p, τ)] as one ``vmap``-ed model; ``{site: [C, ...]}``.

    Cell c minimises mean (y − f_c)² + λ_c Σ‖W_c‖² (λ_c = l²(1 − p_c)/(2 N τ_c), W the ``layers``'
    weights) with per-example inverted dropout at rate p_c on the inputs of ``layers``; the cells share
    the minibatches.  Adam is element-wise, so each cell's updates are those it would get alone.
    """
    from tqdm.auto import tqdm

    starts = [_glorot_start(bnn, layers, seed + c) for c in range(len(cells))]
    values = {n: torch.stack([s[n] for s in starts]).to(x).requires_grad_(True) for n in starts[0]}
    like = {"dtype": x.dtype, "device": x.device}
    keep = torch.tensor([1.0 - p for p, _ in cells], **like)
    decay = config.length_scale ** 2 * keep / (2 * x.shape[0] * torch.tensor([t for _, t in cells], **like))
    holder = {}

    def drop(module, args):
        h = args[0]
        return (h * (torch.rand_like(h) < holder["keep"]).to(h.dtype) / holder["keep"], *args[1:])

    def forward(v, k, xb):
        holder["keep"] = k
        return bnn.forward_single(v, xb)

    batched = vmap(forward, in_dims=(0, 0, None), randomness="different")
    optimizer = torch.optim.Adam(list(values.values()), lr=config.lr, eps=1e-7)  # Keras' Adam
    generator = torch.Generator().manual_seed(seed)
    hooks = [m.register_forward_pre_hook(drop) for m in layers.values()]
    step = 0
    try:
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(seed)
            for _ in tqdm(range(int(config.epochs)), desc=f"mc-dropout gal2016 ({len(cells)} cells)",
                          disable=not progress):
                order = torch.randperm(x.shape[0], generator=generator).to(x.device)
                for index in order.split(int(config.batch_size)):
                    f = batched(values, keep, x[index])
                    penalty = sum(values[n].pow(2).flatten(1).sum(1) for n in layers)
                    loss = ((f - y[index]).pow(2).flatten(1).mean(1) + decay * penalty).sum()
                    if not torch.isfinite(loss):
                        raise NonFiniteLossError(step, "the loss of a gal2016 grid cell")
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    step += 1
    finally:
        for hook in hooks:
            hook.remove()
    return {n: v.detach() for n, v in values.items()}


def _cell_draws(bnn, point: dict, layers: dict, rate: float, tau: Optional[float], num_samples: int, seed: int):
    """Masked draws of ``point``; with ``tau`` (original units) the noise precision held at τ·scale²."""
    draws = masked_draws(point, layers, rate, num_samples, seed)
    if tau is not None:
        precision = (tau * bnn.target_scale ** 2).reshape(-1)
        draws["noise_precision"] = precision.expand(1, num_samples, precision.shape[0]).clone()
    return draws


def _validation_ll(bnn, draws: dict, x, y, seed: int) -> float:
    """Mean log predictive density (original units) of the held-out rows ``(x, y)`` (``y`` standardised)."""
    if bnn.likelihood.task == "regression":
        y = y * bnn.target_scale + bnn.target_loc
    prediction = SamplePosterior(bnn, draws).predict(x, y=y, seed=seed)
    value = float(prediction.log_predictive_density().mean())
    return value if math.isfinite(value) else -math.inf


def _check_gal2016(bnn, x, config: MCDropoutConfig) -> None:
    if isinstance(x, LoaderBatches):
        raise ValueError("protocol='gal2016' holds out validation rows of the training data: pass tensors, "
                         "fit(bnn, x, y, ...), not a DataLoader")
    if config.tau_grid is None:
        return
    likelihood = bnn.likelihood
    if not (isinstance(likelihood, GaussianLikelihood) and likelihood.learn_noise):
        raise ValueError(f"tau_grid sets the Gaussian noise precision, which needs a GaussianLikelihood with "
                         f"learn_noise=True (--noise learned); got {likelihood!r} (leave tau_grid out to search "
                         f"the dropout rate only)")
    if bnn.deterministic_parameters():
        raise ValueError("protocol='gal2016' with tau_grid fits whole networks per grid cell: make every trainable "
                         "parameter random (stochastic='all') or freeze the deterministic ones")


class MCDropoutBackend(Backend):
    """MC dropout on the chosen layers (see the module docstring); fits from tensors or a DataLoader's batches."""

    name = "mc-dropout"
    Config = MCDropoutConfig
    accepts_loader = True  # fit_map reads a DataLoader's batches

    def run(self, bnn, x, y, config: MCDropoutConfig, seed: int, progress: bool) -> SamplePosterior:
        started = time.perf_counter()
        layers = dropout_layers(bnn)
        if config.protocol == "gal2016":
            return self._gal2016(bnn, x, y, config.resolved(), layers, seed, progress, started)
        config = config.resolved()
        rate = config.dropout if config.dropout is not None else (getattr(bnn.net, "dropout", 0.0) or DEFAULT_DROPOUT)
        bnn.net.eval()  # the backend applies dropout itself, at the chosen layers only

        def posterior(fit) -> SamplePosterior:
            info = run_info(self.name, config, seed, x, started, dropout=rate, dropout_sites=list(layers),
                            num_samples=config.num_samples, history=fit.history)
            return SamplePosterior(bnn, masked_draws(fit.values, layers, rate, config.num_samples, seed), info=info)

        try:
            fit = _fit_rate(bnn, x, y, config, layers, rate, seed, progress)
        except NonFiniteLossError as error:
            error.posterior = posterior(error.posterior)
            raise
        return posterior(fit)

    def _gal2016(self, bnn, x, y, config: MCDropoutConfig, layers: dict, seed: int, progress: bool,
                 started: float) -> SamplePosterior:
        """The validation search over the grid, then the refit on every training row (module docstring)."""
        _check_gal2016(bnn, x, config)
        num_fit = int((1 - config.validation_fraction) * x.shape[0])  # the paper's code: int(0.8 N) rows first
        if not 1 <= num_fit < x.shape[0]:
            raise ValueError(f"validation_fraction {config.validation_fraction} of {x.shape[0]} training rows leaves "
                             f"{num_fit} to fit and {x.shape[0] - num_fit} to validate; both need at least one row")
        bnn.net.eval()  # the backend applies dropout itself, at the chosen layers only
        rates = list(config.dropout_grid or GAL2016_DROPOUT_GRID)
        taus = [None] if config.tau_grid is None else list(config.tau_grid)
        cells = [(p, t) for p in rates for t in taus]
        fit_rows, held_out = (x[:num_fit], y[:num_fit]), (x[num_fit:], y[num_fit:])
        scores, state = [], {k: v.detach().clone() for k, v in bnn.net.state_dict().items()}
        if config.tau_grid is not None:
            fitted = _train_cells(bnn, layers, *fit_rows, cells, config, seed, progress)
            for c, (p, t) in enumerate(cells):
                point = {n: v[c] for n, v in fitted.items()}
                scores.append(_validation_ll(bnn, _cell_draws(bnn, point, layers, p, t, config.num_samples, seed),
                                             *held_out, seed))
        else:
            for p, _ in cells:
                bnn.net.load_state_dict(state)  # every cell starts from the same network
                fit = _fit_rate(bnn, *fit_rows, config, layers, p, seed, progress)
                scores.append(_validation_ll(bnn, masked_draws(fit.values, layers, p, config.num_samples, seed),
                                             *held_out, seed))
            bnn.net.load_state_dict(state)
        rate, tau = cells[max(range(len(cells)), key=scores.__getitem__)]
        history = None
        if tau is None:
            fit = _fit_rate(bnn, x, y, config, layers, rate, seed, progress)
            point, history = fit.values, fit.history
        else:
            point = {n: v[0] for n, v in _train_cells(bnn, layers, x, y, [(rate, tau)], config, seed, progress).items()}
        info = run_info(self.name, config, seed, x, started, protocol="gal2016", dropout=rate, tau=tau,
                        dropout_sites=list(layers), num_samples=config.num_samples, num_validation=x.shape[0] - num_fit,
                        validation=[{"dropout": p, "tau": t, "validation_ll": v} for (p, t), v in zip(cells, scores)],
                        **({"history": history} if history is not None else {}))
        return SamplePosterior(bnn, _cell_draws(bnn, point, layers, rate, tau, config.num_samples, seed), info=info)
