"""The ``swag`` and ``multiswag`` backends: SWA-Gaussian (Maddox et al. 2019) and its mixture
MultiSWAG (Wilson & Izmailov 2020).

Each member (``swag``: one; ``multiswag``: ``num_members`` M, default 5):

1. Burn-in: the members' MAP fits, ``burnin_epochs`` of minibatch Adam at ``burnin_lr``
   (cosine decay), run by the ``ensemble`` backend (:mod:`inference.backends.ensemble`; in
   ``workers`` local processes for ``multiswag``): member 0 starts from the network's weights
   and fits the deterministic parameters jointly; members m ≥ 1 start from a fresh
   initialisation under seed ``seed + m`` with the deterministic parameters held at member
   0's values.
2. SWAG phase: ``epochs`` of minibatch SGD (momentum ``momentum``) on −log π(z)/N over the
   random sites in unconstrained coordinates (:class:`inference.optim.potential.Potential`, the
   likelihood scaled by N/n), deterministic parameters held.  The learning rate is constant
   (``lr``) or cyclical (linear from ``lr`` down to ``lr_min`` over each collection period,
   Maddox et al. 2019, §3); a snapshot θ_i is taken every ``collect_every`` steps (default
   one epoch; cyclical: at the end of each period).  The running first and second moments
   θ̄, θ̄² and the last K = ``max_rank`` deviation columns D_i = θ_i − θ̄_i are kept.
   All members take this phase together as one ``[M, D]`` batch (one batched forward and
   backward pass per step, sharing the minibatch).
3. ``num_samples`` draws per member, taken at fit end,

       θ = θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)),   Σ_diag = mean(θ_i²) − θ̄²,   z₁ ~ N(0, I_P), z₂ ~ N(0, I_K)

   (``diag=True``: SWAG-Diagonal, θ = θ̄ + Σ_diag^{½} z₁), into a :class:`SWAGPosterior` (a
   :class:`~inference.posterior.SamplePosterior`) of M chains (the MultiSWAG mixture with the
   members as ArviZ chains).

BatchNorm (Maddox et al. 2019, §4 and their ``bn_update``): the burn-in and the SWAG phase
normalise by each minibatch's statistics (the layers' running buffers set aside,
:func:`batch_statistics`), and after sampling the running mean and variance are recomputed
with one pass over the training data (minibatches of ``batch_size`` in data order, momentum
``None``: the average over the batches) for every draw (``batchnorm="draw"``) or once per
member at its SWA mean θ̄ (``batchnorm="mean"``, ``S`` times cheaper).  The statistics are
stored as extra draws ``batchnorm:<layer>.running_mean`` / ``.running_var`` ``[M, S, C]`` of a
:class:`SWAGPosterior`, whose network (:class:`BatchNormDraws`) predicts each draw with its own
statistics.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass
from typing import Optional

import pyro
import torch
from torch import nn
from torch.func import functional_call, vmap

from zoo.bnn import BayesianNetwork

from inference.posterior import SamplePosterior
from inference.optim.potential import Potential, frozen_deterministic
from inference.backends.base import Backend, NonFiniteLossError, minibatches
from inference.backends.ensemble import EnsembleBackend, EnsembleConfig, check_member_options, member_initial_values

__all__ = ["SWAGConfig", "MultiSWAGConfig", "SWAGBackend", "MultiSWAGBackend", "SWAGMoments", "SWAGPosterior",
           "BatchNormDraws", "swag_samples", "batch_statistics", "batchnorm_statistics", "BATCHNORM_PREFIX"]

LR_SCHEDULES = ("constant", "cyclical")
BATCHNORM_REFRESH = ("draw", "mean")
#: draws named ``BATCHNORM_PREFIX + "<layer>.running_mean"`` hold a draw's BatchNorm statistics
BATCHNORM_PREFIX = "batchnorm:"


@dataclass
class SWAGConfig:
    """Options of the ``swag`` backend (module docstring).

    Attributes:
        epochs: SGD epochs of the SWAG phase.
        batch_size: minibatch size (``None``: full batch).
        lr: SGD learning rate on −log π/N (the cyclical schedule's maximum).
        lr_schedule: ``constant`` or ``cyclical``; ``lr_min`` the cyclical minimum.
        momentum: SGD momentum.
        collect_every: steps between snapshots (``None``: one epoch).
        max_rank: K, the deviation columns kept (needs K ≥ 2 and at least K snapshots).
        diag: SWAG-Diagonal (no low-rank part).
        num_samples: draws per member.
        burnin_epochs, burnin_lr: the Adam burn-in (MAP fit) before the SWAG phase (``None``: as many
            epochs as the SWAG phase; a short burn-in leaves the noise precision far from its optimum).
        batchnorm: networks with BatchNorm only: refresh its statistics per ``"draw"`` (Maddox et al.
            2019) or once per member at θ̄ (``"mean"``).
    """

    epochs: int = 100
    batch_size: Optional[int] = 64
    lr: float = 1e-4
    lr_schedule: str = "constant"
    lr_min: float = 1e-4
    momentum: float = 0.9
    collect_every: Optional[int] = None
    max_rank: int = 20
    diag: bool = False
    num_samples: int = 200
    burnin_epochs: Optional[int] = None
    burnin_lr: float = 1e-2
    batchnorm: str = "draw"

    def validate(self):
        for name in ("epochs", "num_samples"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.burnin_epochs is not None and int(self.burnin_epochs) < 0:
            raise ValueError(f"burnin_epochs must be non-negative (or None), got {self.burnin_epochs}")
        if not self.diag and int(self.max_rank) < 2:
            raise ValueError(f"max_rank K must be at least 2 (the low-rank covariance D Dᵀ/(K−1) needs two deviation "
                             f"columns), got {self.max_rank}; or use diag=True (SWAG-Diagonal)")
        for name in ("lr", "lr_min", "burnin_lr"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
        if self.batchnorm not in BATCHNORM_REFRESH:
            raise ValueError(f"unknown batchnorm {self.batchnorm!r}; valid: {', '.join(BATCHNORM_REFRESH)}")
        for name in ("batch_size", "collect_every"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1 (or None), got {getattr(self, name)}")
        if self.collect_every is None and not self.diag and self.epochs < self.max_rank:
            raise ValueError(f"max_rank K={self.max_rank} exceeds the number of snapshots ({self.epochs}: one per "
                             f"epoch); raise epochs or lower max_rank")

    def num_snapshots(self, steps_per_epoch: int) -> int:
        return self.epochs * steps_per_epoch // (self.collect_every or steps_per_epoch)


@dataclass
class MultiSWAGConfig(SWAGConfig):
    """:class:`SWAGConfig` plus ``num_members`` M (default 5, Wilson & Izmailov 2020), 40 draws per
    member, and ``workers`` and ``executor`` (``"local"`` processes or ``"ray"`` tasks) running the
    members' burn-ins in parallel, as for the ensemble backend."""

    num_members: int = 5
    num_samples: int = 40
    workers: int = 1
    executor: str = "local"

    def validate(self):
        super().validate()
        check_member_options(self, "M")


class SWAGMoments:
    """Running SWAG statistics of ``M`` members: θ̄, θ̄² ``[M, P]`` and the last K deviations ``[M, K, P]``."""

    def __init__(self, num_members: int, dim: int, max_rank: int, dtype=torch.float32, device=None):
        self.count = 0
        self.mean = torch.zeros(num_members, dim, dtype=dtype, device=device)
        self.sq_mean = torch.zeros(num_members, dim, dtype=dtype, device=device)
        self.deviations = torch.zeros(num_members, max_rank, dim, dtype=dtype, device=device)
        self.max_rank = max_rank

    def collect(self, theta: torch.Tensor) -> None:
        """Add snapshot ``theta`` ``[M, P]``: update the moments, then store θ − θ̄ (Maddox et al. 2019, Alg. 1)."""
        self.count += 1
        self.mean += (theta - self.mean) / self.count
        self.sq_mean += (theta * theta - self.sq_mean) / self.count
        self.deviations[:, (self.count - 1) % self.max_rank] = theta - self.mean

    @property
    def variance(self) -> torch.Tensor:
        """Σ_diag ``[M, P]`` (clamped at 1e-30 against round-off, as in Maddox et al.'s code)."""
        return (self.sq_mean - self.mean**2).clamp_min(1e-30)


def swag_samples(moments: SWAGMoments, num_samples: int, diag: bool, generator: torch.Generator) -> torch.Tensor:
    """``[M, S, P]`` draws θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)) (``diag``: θ̄ + Σ_diag^{½} z₁)."""
    num_members, dim = moments.mean.shape
    rank = moments.max_rank
    if not diag and moments.count < rank:
        raise ValueError(f"max_rank K={rank} exceeds the number of snapshots ({moments.count}); collect more snapshots "
                         f"(epochs, collect_every) or lower max_rank")
    like = {"dtype": moments.mean.dtype, "device": moments.mean.device}
    z1 = torch.randn(num_members, num_samples, dim, generator=generator, **like)
    sd = moments.variance.sqrt().unsqueeze(1)
    if diag:
        return moments.mean.unsqueeze(1) + sd * z1
    z2 = torch.randn(num_members, num_samples, rank, generator=generator, **like)
    low_rank = z2 @ moments.deviations  # [M, S, P]
    return moments.mean.unsqueeze(1) + sd * z1 / math.sqrt(2) + low_rank / math.sqrt(2 * (rank - 1))


def _batchnorm_layers(net: nn.Module) -> dict:
    """``{name: layer}`` of the BatchNorm layers that keep running statistics."""
    return {name: m for name, m in net.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats}


@contextlib.contextmanager
def batch_statistics(net: nn.Module):
    """Within: every BatchNorm layer normalises by the batch's own statistics, in train and eval mode
    alike (its running buffers are set aside and restored on exit), as SWAG's SGD does."""
    layers = _batchnorm_layers(net)
    names = ("running_mean", "running_var", "num_batches_tracked")
    saved = {name: [getattr(m, b) for b in names] for name, m in layers.items()}
    try:
        for m in layers.values():
            m.track_running_stats = False
            for b in names:
                setattr(m, b, None)
        yield
    finally:
        for name, m in layers.items():
            m.track_running_stats = True
            for b, value in zip(names, saved[name]):
                setattr(m, b, value)


@torch.no_grad()
def batchnorm_statistics(bnn, weights: dict, x: torch.Tensor, batch_size: Optional[int]) -> dict:
    """Recomputed BatchNorm statistics ``{BATCHNORM_PREFIX + "<layer>.running_<mean|var>": [S, C]}`` of
    ``S`` weight draws ``{site: [S, *shape]}`` (Maddox et al. 2019's ``bn_update``).

    Per draw: fresh buffers, the BatchNorm layers in train mode with momentum ``None`` (the running
    statistics become the average over batches of the batch mean and unbiased variance), other
    layers in eval mode, one pass over ``x`` ``[N, ...]`` in ``ceil(N / batch_size)`` nearly equal
    batches in data order.
    """
    layers = _batchnorm_layers(bnn.net)
    x = bnn.placed_input(x)
    num = next(iter(weights.values())).shape[0]
    batches = torch.tensor_split(x, math.ceil(x.shape[0] / (batch_size or x.shape[0])))
    modes = {m: m.training for m in bnn.net.modules()}
    momenta = {m: m.momentum for m in layers.values()}
    out = {f"{BATCHNORM_PREFIX}{name}.{b}": [] for name in layers for b in ("running_mean", "running_var")}
    try:
        bnn.net.eval()
        for m in layers.values():
            m.train()
            m.momentum = None
        for s in range(num):
            buffers = {}
            for name, m in layers.items():
                buffers.update({f"{name}.running_mean": torch.zeros_like(m.running_mean),
                                f"{name}.running_var": torch.ones_like(m.running_var),
                                f"{name}.num_batches_tracked": torch.zeros_like(m.num_batches_tracked)})
            params = {n: bnn.site(n).to_param(v[s]) for n, v in weights.items()}
            for batch in batches:  # the layers update ``buffers`` in place
                functional_call(bnn.net, {**params, **buffers}, (batch,), strict=False)
            for name in layers:
                for b in ("running_mean", "running_var"):
                    out[f"{BATCHNORM_PREFIX}{name}.{b}"].append(buffers[f"{name}.{b}"])
    finally:
        for m, mode in modes.items():
            m.training = mode
        for m, momentum in momenta.items():
            m.momentum = momentum
    return {k: torch.stack(v) for k, v in out.items()}


class BatchNormDraws(BayesianNetwork):
    """``bnn`` predicting each draw with its own BatchNorm statistics, read from the draws
    ``BATCHNORM_PREFIX + "<layer>.running_<mean|var>"`` ``[S, C]`` (:func:`batchnorm_statistics`)."""

    def __init__(self, bnn: BayesianNetwork):
        super().__init__(bnn.net, prior=bnn.prior, likelihood=bnn.likelihood,
                         train_deterministic=bnn.train_deterministic, output_dim=bnn.output_dim,
                         target_loc=bnn.target_loc.clone(),
                         target_scale=bnn.target_scale.clone(), sites=bnn.sites)
        self.active_at_prediction = tuple(getattr(bnn, "active_at_prediction", ()))

    def forward_draws(self, values, x):
        stats = {k[len(BATCHNORM_PREFIX):]: v for k, v in values.items() if k.startswith(BATCHNORM_PREFIX)}
        if not stats:
            return super().forward_draws(values, x)
        weights = {s.name: values[s.name] for s in self.sites}  # not the likelihood latents
        x = self.placed_input(x)
        if self.batched_draws is None:
            self.check_forward(x)

        def single(w, buffers):
            return functional_call(self.net, {**{n: self.site(n).to_param(v) for n, v in w.items()}, **buffers},
                                   (x,), strict=False)

        with self.prediction_mode():
            if self.batched_draws:
                return vmap(single, randomness="different")(weights, stats)
            num = next(iter(stats.values())).shape[0]
            return torch.stack([single({k: v[i] for k, v in weights.items()}, {k: v[i] for k, v in stats.items()})
                                for i in range(num)])


class SWAGPosterior(SamplePosterior):
    """SWAG / MultiSWAG draws ``[M, S, ...]``; with BatchNorm statistics among the draws (module
    docstring) the network is a :class:`BatchNormDraws`."""

    kind = "swag"

    def __init__(self, bnn, draws, sample_stats=None, info=None):
        if any(k.startswith(BATCHNORM_PREFIX) for k in draws) and not isinstance(bnn, BatchNormDraws):
            bnn = BatchNormDraws(bnn)
        super().__init__(bnn, draws, sample_stats, info)


class SWAGBackend(Backend):
    """SWAG (one member) and, through ``num_members``, MultiSWAG (module docstring)."""

    name = "swag"
    Config = SWAGConfig

    def run(self, bnn, x, y, config, seed, progress):
        started = time.perf_counter()
        num_members = int(getattr(config, "num_members", 1))
        potential = Potential(bnn, x, y)
        num_data = potential.num_data
        steps_per_epoch = math.ceil(num_data / (config.batch_size or num_data))
        collect_every = config.collect_every or steps_per_epoch
        if not config.diag and config.num_snapshots(steps_per_epoch) < config.max_rank:
            raise ValueError(f"max_rank K={config.max_rank} exceeds the number of snapshots "
                             f"({config.num_snapshots(steps_per_epoch)} = epochs × {steps_per_epoch} steps / "
                             f"collect_every {collect_every}); raise epochs or lower max_rank")
        like = bnn.target_scale  # the model's dtype and device
        moments = SWAGMoments(num_members, potential.dim, config.max_rank, like.dtype, like.device)
        with batch_statistics(bnn.net):
            z, stopped = self._sgd(bnn, x, y, config, seed, progress, potential, moments, collect_every)
        info = {"backend": self.name, "config": asdict(config), "seed": seed, "num_data": num_data,
                "num_chains": num_members, "num_random": potential.dim, "collect_every": collect_every,
                "num_snapshots": moments.count}
        if stopped is None:
            generator = torch.Generator(device=like.device).manual_seed(seed)
            theta = swag_samples(moments, config.num_samples, config.diag, generator)
        else:  # stopped early: the last finite state, one draw per member
            info["draws_from_last_finite_state"] = True
            theta = z.unsqueeze(1)
        draws = potential.draws(theta)
        if _batchnorm_layers(bnn.net):
            centre = moments.mean if stopped is None else z
            draws.update(_refreshed_statistics(bnn, draws, centre, potential, x, config))
        info["fit_seconds"] = time.perf_counter() - started
        posterior = SWAGPosterior(bnn, draws, info=info)
        if stopped is not None:
            raise NonFiniteLossError(stopped, "the SWAG gradient", posterior)
        return posterior

    def _sgd(self, bnn, x, y, config, seed, progress, potential, moments, collect_every):
        """Burn-in and the SWAG phase; ``(last finite z [M, D], step of a NaN/inf gradient or None)``."""
        num_members, num_data = moments.mean.shape[0], potential.num_data
        burnin_epochs = config.epochs if config.burnin_epochs is None else config.burnin_epochs
        if burnin_epochs:  # the burn-in is a deep ensemble of the members' MAP fits
            burn_in = EnsembleConfig(epochs=burnin_epochs, batch_size=config.batch_size, lr=config.burnin_lr,
                                     num_members=num_members, workers=int(getattr(config, "workers", 1)),
                                     executor=getattr(config, "executor", "local"))
            starts = EnsembleBackend().run(bnn, x, y, burn_in, seed, progress).draws  # {site: [M, 1, ...]}
            z = potential.pack({name: value[:, 0] for name, value in starts.items()})
        else:
            inits = [{}] + [member_initial_values(bnn, seed + m) for m in range(1, num_members)]
            z = torch.stack([potential.pack({**bnn.initial_values(), **potential.latent_init(), **init}) for init in inits])
        pyro.set_rng_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        z = z.detach()
        velocity = torch.zeros_like(z)
        step = 0
        with torch.no_grad(), frozen_deterministic(bnn):
            for _ in range(config.epochs):
                for index in minibatches(num_data, config.batch_size, generator):
                    phase = (step % collect_every + 1) / collect_every
                    lr = config.lr if config.lr_schedule == "constant" else (1 - phase) * config.lr + phase * config.lr_min
                    _, grad = potential.value_and_grad(z, index)
                    if not bool(torch.isfinite(grad).all()):
                        return z, step
                    velocity = config.momentum * velocity + grad / num_data
                    z = z + lr * velocity
                    step += 1
                    if step % collect_every == 0:
                        moments.collect(z)
        return z, None


def _refreshed_statistics(bnn, draws: dict, centre: torch.Tensor, potential, x, config) -> dict:
    """BatchNorm statistics ``{name: [M, S, C]}`` of the draws ``{site: [M, S, ...]}`` (``config.batchnorm``:
    per draw, or per member at its ``centre`` θ̄ ``[M, D]``, repeated over its draws)."""
    num_members, num_samples = next(iter(draws.values())).shape[:2]
    if config.batchnorm == "mean":
        at_centre = potential.draws(centre.unsqueeze(1))
        weights = {s.name: at_centre[s.name][:, 0] for s in bnn.sites}
        stats = batchnorm_statistics(bnn, weights, x, config.batch_size)
        return {k: v.unsqueeze(1).expand(num_members, num_samples, *v.shape[1:]).clone() for k, v in stats.items()}
    weights = {s.name: draws[s.name].reshape(num_members * num_samples, *s.shape) for s in bnn.sites}
    stats = batchnorm_statistics(bnn, weights, x, config.batch_size)
    return {k: v.reshape(num_members, num_samples, *v.shape[1:]) for k, v in stats.items()}


class MultiSWAGBackend(SWAGBackend):
    """MultiSWAG: ``num_members`` SWAG runs from independent burn-ins, mixed equally (Wilson & Izmailov 2020)."""

    name = "multiswag"
    Config = MultiSWAGConfig
