"""The ``swag`` and ``multiswag`` backends: SWA-Gaussian (Maddox et al. 2019) and its mixture
MultiSWAG (Wilson & Izmailov 2020).

This module holds the options (:class:`SWAGConfig`: the SWAG phase's SGD, the snapshots, the burn-in, the
BatchNorm refresh; :class:`MultiSWAGConfig`: the members and their workers) and the backends; the
algorithm — burn-in, SGD iterates and their moments, the draws, the BatchNorm refresh — is assembled from
the parts of :mod:`inference.swag` by :func:`inference.swag.fit.fit_swag` (its module docstring describes
it step by step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from inference.ensembles.initialisation import check_member_options
from inference.optim.checks import check_choice, check_interval, check_positive
from inference.swag.fit import fit_swag
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
        burnin_epochs, burnin_lr: the Adam burn-in (MAP fit) before the SWAG phase (``None``: the ``ensemble``
            backend's members' 200 epochs, or the SWAG phase's where more, :func:`inference.swag.sgd.burnin_epochs_of`;
            a short burn-in leaves the members underfitted and the noise precision far from its optimum).
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
            check_positive(name, float(getattr(self, name)))
        check_interval("momentum", self.momentum, "[0, 1)")
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_choice("batchnorm", self.batchnorm, BATCHNORM_REFRESH)
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
        return fit_swag(bnn, x, y, config, seed, progress, self.name)


class MultiSWAGBackend(SWAGBackend):
    """MultiSWAG: ``num_members`` SWAG runs from independent burn-ins, mixed equally (Wilson & Izmailov 2020)."""

    name = "multiswag"
    Config = MultiSWAGConfig
