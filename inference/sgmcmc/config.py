"""Options of the SG-MCMC backends (:mod:`inference.backends.sgmcmc`; read by :mod:`inference.sgmcmc.fit`): the
shared ones, SGLD's decay ε_t = ε₀ (1 + t/b)^−γ (Welling & Teh 2011), pSGLD's preconditioner (Li et al. 2016),
SGHMC's friction (Chen et al. 2014) and the cycles of cyclical SG-MCMC (Zhang et al. 2020), each with its
``validate``."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from inference.mcmc.budget import DEFAULT_TIME_BUDGET
from inference.optim.checks import check_choice, check_interval, check_positive
from inference.optim.start import INIT_STRATEGIES
from inference.sgmcmc.stability import MAX_BACKOFFS

__all__ = ["SGMCMCConfig", "SGLDConfig", "PSGLDConfig", "SGHMCConfig", "CyclicalConfig"]


@dataclass
class SGMCMCConfig:
    """Options shared by the SG-MCMC backends.

    Attributes:
        num_chains: chains run side by side (vectorised; they share minibatches).
        num_samples: draws kept per chain.
        thin: steps between kept draws.
        step_size: the kernel's (initial) step size ε₀ / η / α₀; ``None``: from the curvature at
            the start point (:mod:`inference.sgmcmc.fit`, docs/mcmc.md "SG-MCMC step sizes").
        batch_size: minibatch size (``None``: full batch); the likelihood is scaled by N/n.
            Unused when fitting from a DataLoader (its batches are used).
        init: ``"map"`` (the ``map`` backend's MAP fit first) or ``"current"`` (the network's weights).
        map_steps / map_lr: the MAP fit's budget of minibatch Adam steps (a DataLoader's batches when
            fitting from one) and learning rate (:func:`inference.optim.start.initial_point`).  A step size right for the stiffest direction
            hardly moves the flat ones (energy's noise precision would relax over ~10⁵ steps), so
            the start sets the noise level: after 1000 steps it was still 95 (prior median 69),
            after 3000 the overfitted ~1 500 (docs/mcmc.md, "SG-MCMC step sizes").
        init_jitter: sd of the Gaussian jitter added to each chain's start, at most 2/√ρ with ρ the
            spectral radius of the Hessian of −log π̃ at the start (:func:`inference.sgmcmc.stability.start_jitter`;
            ``info["start_jitter"]`` is the sd used).
        max_backoffs: restarts allowed, each with the step size divided by 4, when the chains diverge
            (non-finite log density or gradient) before the first kept draw
            (:func:`inference.sgmcmc.stability.backed_off_runs`); 0 stops such a run with the error.
        time_budget: seconds the whole fit may take (120; ``None``: no budget), projected from the MAP start's
            first steps (:func:`~inference.mcmc.budget.start_budget`) and the sampler's first steps
            (:class:`~inference.mcmc.budget.TimeBudgetExceeded`).
    """

    num_chains: int = 4
    num_samples: int = 200
    thin: int = 10
    step_size: Optional[float] = None
    batch_size: Optional[int] = 32
    init: str = "map"
    map_steps: int = 2000
    map_lr: float = 0.01
    init_jitter: float = 0.01
    max_backoffs: int = MAX_BACKOFFS
    time_budget: Optional[float] = DEFAULT_TIME_BUDGET

    def validate(self):
        self._validate_shared()

    def _validate_shared(self):
        for name in ("num_chains", "num_samples", "thin"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "map_steps", "step_offset", "max_backoffs"):
            if int(getattr(self, name, 0)) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        for name in ("step_size", "map_lr"):
            if name == "step_size" and self.step_size is None:
                continue
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1 (or None for full batch), got {self.batch_size}")
        if not (math.isfinite(self.init_jitter) and self.init_jitter >= 0):
            raise ValueError(f"init_jitter must be non-negative, got {self.init_jitter}")
        check_choice("init", self.init, INIT_STRATEGIES)
        if self.time_budget is not None and not (math.isfinite(float(self.time_budget)) and self.time_budget > 0):
            raise ValueError(f"time_budget must be a positive number of seconds or None (no budget), got {self.time_budget}")


@dataclass
class SGLDConfig(SGMCMCConfig):
    """SGLD: shared options, ``warmup_steps`` of burn-in and the decay ε_t = ε₀ (1 + t/b)^−γ."""

    warmup_steps: int = 2000
    step_decay: float = 0.55
    step_offset: float = 1000.0

    def validate(self):
        super().validate()
        check_interval("step_decay (γ)", self.step_decay, "[0, 1]")
        check_positive("step_offset (b)", self.step_offset)


@dataclass
class PSGLDConfig(SGLDConfig):
    """pSGLD: SGLD's options and the RMSprop preconditioner's decay α and damping λ."""

    rms_decay: float = 0.99
    rms_damping: float = 1e-5

    def validate(self):
        super().validate()
        check_interval("rms_decay", self.rms_decay, "(0, 1)")
        check_positive("rms_damping", self.rms_damping)


@dataclass
class SGHMCConfig(SGLDConfig):
    """SGHMC: SGLD's schedule options (default constant, γ = 0) and the friction α ∈ (0, 1]."""

    step_decay: float = 0.0
    friction: float = 0.1

    def validate(self):
        super().validate()
        check_interval("friction", self.friction, "(0, 1]")


@dataclass
class CyclicalConfig(SGMCMCConfig):
    """Cyclical SG-MCMC: ``num_cycles`` M, ``exploration`` β, ``kernel`` (``sgld``/``sghmc``),
    ``friction`` (SGHMC kernel) and the cycle length L: ``cycle_length`` steps, or by default
    ``cycle_epochs`` epochs of minibatch steps as Zhang et al. 2020 (200 epochs in 4 cycles), at least
    long enough for a cycle's ``num_samples / M`` draws ``thin`` steps apart in its sampling phase;
    ``thin`` ``None``: that phase's steps shared among the draws (:meth:`resolved`; docs/mcmc.md).

    ``step_size`` α₀ is the peak of the cosine schedule, taken by the exploration phase's plain
    SGD steps on the N-scaled potential; by default the largest peak whose sampling phase meets
    the inner kernel's step rule and whose exploration stays at half its stability limit
    (:func:`~inference.sgmcmc.step_sizes.cyclical_step_size`)."""

    num_cycles: int = 4
    exploration: float = 0.8
    kernel: str = "sgld"
    friction: float = 0.1
    cycle_length: Optional[int] = None
    cycle_epochs: float = 50.0
    thin: Optional[int] = None

    def validate(self):
        if self.thin is not None and int(self.thin) < 1:
            raise ValueError(f"thin must be at least 1 (or None: from the cycle), got {self.thin}")
        replace(self, thin=self.thin or 1)._validate_shared()
        if not (math.isfinite(self.cycle_epochs) and self.cycle_epochs > 0):
            raise ValueError(f"cycle_epochs must be a positive number, got {self.cycle_epochs}")
        if int(self.num_cycles) < 1:
            raise ValueError(f"num_cycles must be at least 1, got {self.num_cycles}")
        if self.num_samples % self.num_cycles:
            raise ValueError(
                f"num_samples ({self.num_samples}) must be a multiple of num_cycles ({self.num_cycles}): "
                f"each cycle contributes num_samples / num_cycles draws"
            )
        check_interval("exploration (β)", self.exploration, "[0, 1)")
        check_choice("cyclical kernel", self.kernel, ("sgld", "sghmc"))
        check_interval("friction", self.friction, "(0, 1]")
        needed = self.num_samples // self.num_cycles * (self.thin or 1)
        if self.cycle_length is not None and int(self.cycle_length) - math.ceil(self.exploration * self.cycle_length) < needed:
            raise ValueError(
                f"cycle_length {self.cycle_length} leaves fewer than {needed} sampling steps "
                f"(num_samples/num_cycles · thin) after the exploration fraction {self.exploration}; "
                f"lengthen the cycle or leave cycle_length unset"
            )

    def resolved(self, steps_per_epoch: int) -> "CyclicalConfig":
        """This configuration with ``cycle_length`` and ``thin`` in steps, for epochs of ``steps_per_epoch`` steps:
        L = max(⌈``cycle_epochs`` · steps_per_epoch⌉, ⌈(draws · thin)/(1 − β)⌉ + 1) and thin =
        max(1, ⌊(L − ⌈βL⌉)/draws⌋) where not given (draws = ``num_samples / num_cycles``)."""
        draws = self.num_samples // self.num_cycles
        length = self.cycle_length
        if length is None:
            shortest = math.ceil(draws * (self.thin or 1) / (1 - self.exploration) - 1e-9) + 1  # 500 / 0.2 → 2501
            length = max(math.ceil(self.cycle_epochs * steps_per_epoch), shortest)
        thin = self.thin if self.thin is not None else max(1, (length - math.ceil(self.exploration * length)) // draws)
        return replace(self, cycle_length=int(length), thin=int(thin))

    @property
    def sampling_steps(self) -> int:
        """Steps of a cycle's sampling phase that hold its draws (a :meth:`resolved` configuration)."""
        return self.num_samples // self.num_cycles * self.thin

    @property
    def length(self) -> int:
        """Steps per cycle L (a :meth:`resolved` configuration)."""
        return int(self.cycle_length)
