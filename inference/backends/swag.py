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
   random sites in unconstrained coordinates (:class:`inference.potential.Potential`, the
   likelihood scaled by N/n), deterministic parameters held.  The learning rate is constant
   (``lr``) or cyclical (linear from ``lr`` down to ``lr_min`` over each collection period,
   Maddox et al. 2019, §3); a snapshot θ_i is taken every ``collect_every`` steps (default
   one epoch; cyclical: at the end of each period).  The running first and second moments
   θ̄, θ̄² and the last K = ``max_rank`` deviation columns D_i = θ_i − θ̄_i are kept.
   All members take this phase together as one ``[M, D]`` batch (one batched forward and
   backward pass per step, sharing the minibatch).
3. ``num_samples`` draws per member, taken at fit end,

       θ = θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)),   Σ_diag = mean(θ_i²) − θ̄²,   z₁ ~ N(0, I_P), z₂ ~ N(0, I_K)

   (``diag=True``: SWAG-Diagonal, θ = θ̄ + Σ_diag^{½} z₁), into a
   :class:`~inference.posterior.SamplePosterior` of M chains (the MultiSWAG mixture with the
   members as ArviZ chains).

Networks with BatchNorm layers are refused: SWAG refreshes BatchNorm statistics per draw
(Maddox et al. 2019, §4), and a :class:`~zoo.bnn.BayesianNetwork` draw holds parameters only.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Optional

import pyro
import torch
from torch import nn

from ..posterior import SamplePosterior
from ..potential import Potential, frozen_deterministic
from .base import Backend, NonFiniteLossError, minibatches
from .ensemble import EnsembleBackend, EnsembleConfig, member_initial_values

__all__ = ["SWAGConfig", "MultiSWAGConfig", "SWAGBackend", "MultiSWAGBackend", "SWAGMoments", "swag_samples"]

LR_SCHEDULES = ("constant", "cyclical")


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
    member and ``workers``, the local processes running the members' burn-ins in parallel."""

    num_members: int = 5
    num_samples: int = 40
    workers: int = 1

    def validate(self):
        super().validate()
        if int(self.num_members) < 1:
            raise ValueError(f"num_members (M) must be at least 1, got {self.num_members}")
        if int(self.workers) < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")


class SWAGMoments:
    """Running SWAG statistics of ``M`` members: θ̄, θ̄² ``[M, P]`` and the last K deviations ``[M, K, P]``."""

    def __init__(self, num_members: int, dim: int, max_rank: int, dtype=torch.float32):
        self.count = 0
        self.mean = torch.zeros(num_members, dim, dtype=dtype)
        self.sq_mean = torch.zeros(num_members, dim, dtype=dtype)
        self.deviations = torch.zeros(num_members, max_rank, dim, dtype=dtype)
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
    z1 = torch.randn(num_members, num_samples, dim, generator=generator, dtype=moments.mean.dtype)
    sd = moments.variance.sqrt().unsqueeze(1)
    if diag:
        return moments.mean.unsqueeze(1) + sd * z1
    z2 = torch.randn(num_members, num_samples, rank, generator=generator, dtype=moments.mean.dtype)
    low_rank = z2 @ moments.deviations  # [M, S, P]
    return moments.mean.unsqueeze(1) + sd * z1 / math.sqrt(2) + low_rank / math.sqrt(2 * (rank - 1))


def _check_no_batchnorm(net: nn.Module) -> None:
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        raise ValueError("SWAG refreshes BatchNorm statistics per draw, which a BayesianNetwork draw cannot hold "
                         "(it overrides parameters only); use a network without BatchNorm layers")


class SWAGBackend(Backend):
    """SWAG (one member) and, through ``num_members``, MultiSWAG (module docstring)."""

    name = "swag"
    Config = SWAGConfig

    def run(self, bnn, x, y, config, seed, progress):
        started = time.perf_counter()
        _check_no_batchnorm(bnn.net)
        num_members = int(getattr(config, "num_members", 1))
        potential = Potential(bnn, x, y)
        num_data = potential.num_data
        steps_per_epoch = math.ceil(num_data / (config.batch_size or num_data))
        collect_every = config.collect_every or steps_per_epoch
        if not config.diag and config.num_snapshots(steps_per_epoch) < config.max_rank:
            raise ValueError(f"max_rank K={config.max_rank} exceeds the number of snapshots "
                             f"({config.num_snapshots(steps_per_epoch)} = epochs × {steps_per_epoch} steps / "
                             f"collect_every {collect_every}); raise epochs or lower max_rank")
        burnin_epochs = config.epochs if config.burnin_epochs is None else config.burnin_epochs
        if burnin_epochs:  # the burn-in is a deep ensemble of the members' MAP fits
            burn_in = EnsembleConfig(epochs=burnin_epochs, batch_size=config.batch_size, lr=config.burnin_lr,
                                     num_members=num_members, workers=int(getattr(config, "workers", 1)))
            starts = EnsembleBackend().run(bnn, x, y, burn_in, seed, progress).draws  # {site: [M, 1, ...]}
            z = potential.pack({name: value[:, 0] for name, value in starts.items()})
        else:
            inits = [{}] + [member_initial_values(bnn, seed + m) for m in range(1, num_members)]
            z = torch.stack([potential.pack({**bnn.initial_values(), **potential.latent_init(), **init}) for init in inits])
        pyro.set_rng_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        z = z.detach()
        velocity = torch.zeros_like(z)
        moments = SWAGMoments(num_members, potential.dim, config.max_rank)
        info = {"backend": self.name, "config": asdict(config), "seed": seed, "num_data": num_data,
                "num_chains": num_members, "num_random": potential.dim, "collect_every": collect_every}

        def result(last_z=None) -> SamplePosterior:
            info.update(num_snapshots=moments.count, fit_seconds=time.perf_counter() - started)
            if last_z is not None:  # stopped early: the last finite state, one draw per member
                info["draws_from_last_finite_state"] = True
                return SamplePosterior(bnn, potential.draws(last_z.unsqueeze(1)), info=info)
            theta = swag_samples(moments, config.num_samples, config.diag, generator)
            return SamplePosterior(bnn, potential.draws(theta), info=info)

        step = 0
        with torch.no_grad(), frozen_deterministic(bnn):
            for _ in range(config.epochs):
                for index in minibatches(num_data, config.batch_size, generator):
                    phase = (step % collect_every + 1) / collect_every
                    lr = config.lr if config.lr_schedule == "constant" else (1 - phase) * config.lr + phase * config.lr_min
                    _, grad = potential.value_and_grad(z, index)
                    if not bool(torch.isfinite(grad).all()):
                        raise NonFiniteLossError(step, "the SWAG gradient", result(z))
                    velocity = config.momentum * velocity + grad / num_data
                    z = z + lr * velocity
                    step += 1
                    if step % collect_every == 0:
                        moments.collect(z)
        return result()


class MultiSWAGBackend(SWAGBackend):
    """MultiSWAG: ``num_members`` SWAG runs from independent burn-ins, mixed equally (Wilson & Izmailov 2020)."""

    name = "multiswag"
    Config = MultiSWAGConfig
