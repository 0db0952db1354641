"""The ``swag`` and ``multiswag`` backends: SWA-Gaussian (Maddox et al. 2019) and its mixture
MultiSWAG (Wilson & Izmailov 2020).

Each member (``swag``: one; ``multiswag``: ``num_members`` M, default 5):

1. Burn-in: the members' MAP fits, ``burnin_epochs`` of minibatch Adam at ``burnin_lr``
   (cosine decay), as an ensemble (:func:`inference.ensembles.map_members.fit_ensemble`; in
   ``workers`` local processes for ``multiswag``).
2. SWAG phase: ``epochs`` of minibatch SGD (momentum ``momentum``) on −log π(z)/N over the
   random sites, deterministic parameters held, at a constant (``lr``) or cyclical rate (``lr`` down
   to ``lr_min`` over each collection period); a snapshot θ_i every ``collect_every`` steps (default
   one epoch; cyclical: at the end of each period) updates the running moments θ̄, θ̄² and the last
   K = ``max_rank`` deviation columns (:mod:`inference.swag.sgd`, :mod:`inference.swag.moments`).
3. ``num_samples`` draws per member, taken at fit end,

       θ = θ̄ + Σ_diag^{½} z₁/√2 + D z₂/√(2(K−1)),   Σ_diag = mean(θ_i²) − θ̄²,   z₁ ~ N(0, I_P), z₂ ~ N(0, I_K)

   (``diag=True``: SWAG-Diagonal, θ = θ̄ + Σ_diag^{½} z₁), into a
   :class:`~inference.swag.swag_posterior.SWAGPosterior` (a :class:`~inference.posterior.SamplePosterior`) of
   M chains (the MultiSWAG mixture with the members as ArviZ chains).

BatchNorm (Maddox et al. 2019, §4; :mod:`inference.swag.batchnorm`): training normalises by each
minibatch's statistics, and after sampling the running statistics are recomputed with one pass over
the training data for every draw (``batchnorm="draw"``) or once per member at its SWA mean θ̄
(``batchnorm="mean"``, ``S`` times cheaper), stored as extra draws that the posterior's network
predicts each draw with.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import torch

from inference.ensembles.initialisation import check_member_options
from inference.optim.map import run_info
from inference.optim.potential import Potential
from inference.optim.training import NonFiniteLossError
from inference.swag.batchnorm import batch_statistics, batchnorm_layers, refreshed_statistics
from inference.swag.moments import init_moments
from inference.swag.swag_posterior import SWAGPosterior, swag_samples
from inference.swag.sgd import swag_iterates
from inference.backends.base import Backend

__all__ = ["SWAGConfig", "MultiSWAGConfig", "SWAGBackend", "MultiSWAGBackend"]

LR_SCHEDULES = ("constant", "cyclical")
BATCHNORM_REFRESH = ("draw", "mean")


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


class SWAGBackend(Backend):
    """SWAG (one member) and, through ``num_members``, MultiSWAG (module docstring)."""

    name = "swag"
    Config = SWAGConfig
    budget = "swag"

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
        moments = init_moments(num_members, potential.dim, config.max_rank, like.dtype, like.device)
        with batch_statistics(bnn.net):
            z, stopped = swag_iterates(bnn, x, y, config, seed, progress, potential, moments, collect_every)
        info = run_info(self.name, config, seed, x, started, num_chains=num_members, num_random=potential.dim,
                        collect_every=collect_every, num_snapshots=moments.count)
        if stopped is None:
            generator = torch.Generator(device=like.device).manual_seed(seed)
            theta = swag_samples(moments, config.num_samples, config.diag, generator)
        else:  # stopped early: the last finite state, one draw per member
            info["draws_from_last_finite_state"] = True
            theta = z.unsqueeze(1)
        draws = potential.draws(theta)
        if batchnorm_layers(bnn.net):
            centre = moments.mean if stopped is None else z
            draws.update(refreshed_statistics(bnn, draws, centre, potential, x, config.batchnorm, config.batch_size))
        info["fit_seconds"] = time.perf_counter() - started
        posterior = SWAGPosterior(bnn, draws, info=info)
        if stopped is not None:
            raise NonFiniteLossError(stopped, "the SWAG gradient", posterior)
        return posterior


class MultiSWAGBackend(SWAGBackend):
    """MultiSWAG: ``num_members`` SWAG runs from independent burn-ins, mixed equally (Wilson & Izmailov 2020)."""

    name = "multiswag"
    Config = MultiSWAGConfig
