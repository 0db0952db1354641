"""SGLD, pSGLD and SGHMC as Pyro MCMC kernels for any Pyro model.

``pyro.infer.MCMC(SGLD(model), num_samples=2000, warmup_steps=500).run(x, y)``
samples the model's continuous latent sites with the update rules of
:mod:`inference.sgmcmc.updates` (one chain, ``C = 1``):

* :class:`SGLD` — Welling & Teh 2011, eq. 4: z ← z + (ε_t/2) g + √ε_t ξ.
* :class:`PSGLD` — Li et al. 2016, Alg. 1 (RMSprop preconditioner, Γ(θ) omitted).
* :class:`SGHMC` — Chen et al. 2014, eq. 15 with M = I and β̂ = 0.

The kernels follow Pyro's kernel API as :class:`pyro.infer.mcmc.HMC` does: ``setup`` finds a
starting point with a Pyro init strategy, ``sample(params)`` returns the next dict of
*unconstrained* values and ``transforms`` maps each site to its unconstrained space
(``biject_to(support).inv``), which :class:`pyro.infer.MCMC` inverts on its draws.

**The default step size** (``step_size=None``) is chosen in ``setup`` at the start point by the
rules of :mod:`inference.sgmcmc.step_sizes` (as the ``fit`` backends): the spectral radius λ of
the Hessian of −log π̃ by power iteration on Hessian-vector products, with the likelihood on up
to 16 minibatches drawn once and replayed (all data when no plate subsamples), and the
minibatch ratio r = N/n read from the observed sites' scale.  Each chain chooses its own.

**The gradient estimate.**  g = ∇_z log π̃(z) on the unconstrained space, from one trace of the
model conditioned on the constrained values x = T⁻¹(z):

    log π̃(z) = Σ_sites scale · log p(site) − Σ_latents log|det ∂T/∂x|,

i.e. ``Trace.log_prob_sum()`` (which applies each site's scale) plus the log-Jacobian of
x = T⁻¹(z).  Each trace re-runs the model, so a ``pyro.plate("data", N, subsample_size=n)``
draws a fresh minibatch per step and its scale N/n makes the likelihood term an unbiased
estimate of the full-data one; the model decides — without a subsampled plate the kernels
take full-batch steps.  (:func:`pyro.infer.mcmc.util.initialize_model`, which HMC uses, is
not used: it rejects subsampled plates.)

Randomness (initial point, minibatches, injected noise) comes from torch's global generator,
so ``pyro.set_rng_seed`` seeds a run, and the chains of ``MCMC(num_chains=C)`` — which Pyro
runs in worker processes seeded ``seed + chain`` or one after another — differ.  A NaN/inf
log density or gradient during the warm-up restarts the chain with a quarter of the step (at most
8 times, as the ``fit`` backends back off); later it raises ``RuntimeError`` (the step size is too
large for the model).
"""
from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from collections import OrderedDict
from functools import partial
from typing import Callable, Optional, Union

import pyro.poutine as poutine
import torch
from pyro.infer.autoguide.initialization import (
    InitMessenger, init_to_feasible, init_to_mean, init_to_median, init_to_sample, init_to_uniform,
)  # fmt: skip
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from inference.sgmcmc.pyro_potential import ModelPotential
from inference.sgmcmc.stability import BACKOFF_FACTOR, MAX_BACKOFFS
from inference.sgmcmc.updates import Kernel, StepSize, as_schedule, psgld, sghmc, sgld
from inference.sgmcmc.step_sizes import (
    PSGLD_WARM_START, hessian_operator, preconditioned, rms_preconditioner, sghmc_step_size,
    sgld_step_size, spectral_radius,
)  # fmt: skip

__all__ = ["SGLD", "PSGLD", "SGHMC", "PYRO_INIT_STRATEGIES"]

#: ``init_strategy`` names and the Pyro init strategies they stand for
PYRO_INIT_STRATEGIES = {
    "uniform": init_to_uniform, "median": init_to_median, "mean": init_to_mean,
    "feasible": init_to_feasible, "sample": init_to_sample,
}  # fmt: skip
_MAX_INIT_TRIES = 100  # as pyro.infer.mcmc.util._find_valid_initial_params


def _positive(name: str, value, upper: Optional[float] = None, closed: bool = False) -> float:
    """``value`` as a float in (0, ∞), or (0, upper) / (0, upper] when ``upper`` is given."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    top_ok = upper is None or x < upper or (closed and x == upper)
    if not (math.isfinite(x) and x > 0 and top_ok):
        interval = "(0, ∞)" if upper is None else f"(0, {upper}{']' if closed else ')'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return x


def _constant(value: float, t: int) -> float:
    return value


def _scaled(schedule: Callable[[int], float], factor: float, t: int) -> float:
    """``factor · schedule(t)`` (a module-level function: kernels are pickled for worker processes)."""
    return factor * schedule(t)


def _finite(state) -> bool:
    """Whether the log density and the gradient are finite (a NaN/inf makes their sum non-finite)."""
    return bool(torch.isfinite(state.log_density.sum() + state.grad.sum()))


class _StochasticGradientKernel(MCMCKernel, ModelPotential):
    """The Pyro side shared by the three kernels; subclasses give ``_build(value_and_grad)``; the model's
    log density on the unconstrained space comes from :class:`~inference.sgmcmc.pyro_potential.ModelPotential`."""

    def __init__(self, model: Callable, step_size: Optional[StepSize] = None, init_strategy: Union[str, Callable] = "uniform"):
        if not callable(model):
            raise ValueError(f"model must be a callable Pyro model, got {model!r}")
        self.model = model
        self._default_step = step_size is None
        if step_size is None:  # chosen by setup at the start point; a placeholder until then
            step_size = math.nan
        else:
            as_schedule(step_size)  # ValueError naming step_size for a bad constant
        # a module-level partial, not as_schedule's lambda: Pyro pickles kernels for "spawn" workers
        self._schedule = step_size if callable(step_size) else partial(_constant, float(step_size))
        self._given_schedule = self._schedule  # a back-off scales _schedule; each chain's setup starts from this
        if not self._default_step:
            _positive("step_size", self._schedule(0))  # a schedule must start positive too
        if isinstance(init_strategy, str):
            if init_strategy not in PYRO_INIT_STRATEGIES:
                raise ValueError(f"unknown init_strategy {init_strategy!r}; valid: {', '.join(PYRO_INIT_STRATEGIES)}")
            init_strategy = PYRO_INIT_STRATEGIES[init_strategy]
        self._init_strategy = init_strategy
        self.transforms: Optional[dict] = None  # site -> constrained-to-unconstrained transform, set by setup
        self._initial_params: Optional[dict] = None
        self._reset()

    @abstractmethod
    def _build(self, value_and_grad) -> Kernel:
        """The :mod:`inference.sgmcmc.updates` kernel over ``value_and_grad`` (one chain)."""

    @abstractmethod
    def _default_step_size(self, hessian, z: torch.Tensor) -> float:
        """The step rule of :mod:`inference.sgmcmc.step_sizes` at ``z`` ``[1, D]``, ``hessian`` that of −log π̃."""

    def _reset(self) -> None:
        self._state = None
        self._kernel: Optional[Kernel] = None
        self._start_z: Optional[torch.Tensor] = None
        self._backoffs = self._steps_taken = 0

    # ------------------------------------------------------------------ Pyro kernel API
    @property
    def initial_params(self) -> Optional[dict]:
        """Unconstrained starting values by site (set by ``setup``, or by the user before it)."""
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Optional[dict]) -> None:
        self._initial_params = params

    @property
    def step_size(self) -> float:
        """ε_t of the next step (the schedule at the number of steps taken); NaN for a default step
        size before ``setup`` has chosen it."""
        return self._schedule(self._state.step if self._state is not None else 0)

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Trace the model on ``(*args, **kwargs)``, find its latent sites and a finite start, and
        choose the default step size there.

        ``warmup_steps``: with the default step size, the step is chosen again after them, at the
        chain's state then (nearer the mode than an init strategy's start; for pSGLD with its
        settled RMSprop average); nothing else is adapted, and :class:`pyro.infer.MCMC` drops the
        warm-up draws itself."""
        self._args, self._kwargs = args, kwargs
        self._schedule = self._given_schedule
        trace = poutine.trace(InitMessenger(self._init_strategy)(self.model)).get_trace(*args, **kwargs)
        self._read_structure(trace)
        self._kernel = self._build(self._value_and_grad)
        if self._initial_params is not None:
            self._check_names(self._initial_params)
            self._start(self._pack(self._initial_params), "the given initial_params")
        else:
            for _ in range(_MAX_INIT_TRIES):
                z = self._pack({n: self.transforms[n](trace.nodes[n]["value"].detach()) for n in self._names})
                if self._start(z, None):
                    self._initial_params = self._unpack(z[0])
                    break
                trace = poutine.trace(InitMessenger(self._init_strategy)(self.model)).get_trace(*args, **kwargs)
            else:
                raise ValueError(f"no finite log density at {_MAX_INIT_TRIES} initial points from init_strategy")
        self._warmup_steps = self._warmup_total = warmup_steps
        if self._default_step:
            self._choose_step_size()

    def _choose_step_size(self) -> None:
        """The default step at the current state (the kernel's state does not depend on it)."""
        z = self._state.z
        step = self._default_step_size(hessian_operator(self._fixed_batch_potential(), z[0]), z)
        self._schedule = partial(_constant, step)
        self._kernel = self._build(self._value_and_grad)

    def sample(self, params: dict) -> dict:
        """One step; ``params`` (the previous call's result) is not read: the kernel keeps its own
        state, which also holds what ``params`` lacks (gradient, momentum, preconditioner).

        A non-finite log density or gradient during the warm-up restarts the chain from its start
        with the step size (schedule) divided by :data:`~inference.sgmcmc.stability.BACKOFF_FACTOR`,
        at most :data:`~inference.sgmcmc.stability.MAX_BACKOFFS` times, with a ``RuntimeWarning``
        (the back-off of the ``fit`` backends, :mod:`inference.sgmcmc.stability`; Pyro drops the
        warm-up draws); after the warm-up, or past the last back-off, it raises ``RuntimeError``."""
        if self._default_step and self._state.step == self._warmup_steps > 0:
            self._choose_step_size()
        new = self._kernel.update(self._state, torch.default_generator)
        if _finite(new):
            self._state = new
            self._steps_taken += 1
            return self._unpack(self._state.z[0])
        if self._steps_taken < self._warmup_total and self._backoffs < MAX_BACKOFFS:
            self._back_off(new.step)
            return self._unpack(self._state.z[0])
        self._state = new
        raise RuntimeError(
            f"{type(self).__name__}: the log density or its gradient became non-finite at step "
            f"{new.step} (step size {self._last_step_size():.3g}, after {self._backoffs} back-off(s)); use a "
            f"smaller step_size"
        )

    def _back_off(self, step: int) -> None:
        """Restart from the start with the schedule divided by BACKOFF_FACTOR (``sample``'s docstring)."""
        given = self._last_step_size()
        self._backoffs += 1
        self._schedule = partial(_scaled, self._schedule, 1.0 / BACKOFF_FACTOR)
        self._kernel = self._build(self._value_and_grad)
        self._steps_taken += 1
        # the step is re-chosen (default step) when the restarted chain has taken the warm-up that is left
        self._warmup_steps = max(self._warmup_total - self._steps_taken, 0)
        self._state = self._kernel.init(self._start_z)
        warnings.warn(f"{type(self).__name__}: the log density became non-finite at step {step} of the warm-up "
                      f"with step size {given:.3g}; restarting from the start with step size "
                      f"{self._last_step_size():.3g} (back-off {self._backoffs} of at most {MAX_BACKOFFS})",
                      RuntimeWarning, stacklevel=3)

    def logging(self) -> OrderedDict:
        lp = float(self._state.log_density[0]) if self._state is not None else math.nan
        return OrderedDict([("step size", f"{self._last_step_size():.2e}"), ("log density", f"{lp:.4g}")])

    def diagnostics(self) -> dict:
        """``divergences`` (always empty: there is no Metropolis step to diverge; a non-finite
        state raises instead — the key is there for ``MCMC.summary`` / ``az.from_pyro``) and
        the last ``step size``."""
        return {"divergences": [], "step size": self._last_step_size()}

    def cleanup(self) -> None:
        self._reset()
        self._initial_params = None  # as HMC: the next chain finds its own start

    def _radius(self, operator, z: torch.Tensor) -> float:
        return spectral_radius(operator, torch.randn_like(z[0]))

    def _start(self, z: torch.Tensor, what: Optional[str]) -> bool:
        """Set the state at ``z``; ``False`` (or ``ValueError`` naming ``what``) when not finite."""
        state = self._kernel.init(z)
        if _finite(state):
            self._state, self._start_z = state, z
            return True
        if what is not None:
            raise ValueError(f"the log density or its gradient is not finite at {what}")
        return False

    def _last_step_size(self) -> float:
        """ε of the last step taken (of the first one before any)."""
        return self._schedule(max(self._state.step - 1, 0) if self._state is not None else 0)


class SGLD(_StochasticGradientKernel):
    """Stochastic-gradient Langevin dynamics (Welling & Teh 2011, eq. 4).

    z ← z + (ε_t/2) g + √ε_t ξ on the unconstrained space; ``step_size`` is ε (a float), a
    schedule t -> ε_t (e.g. :func:`inference.sgmcmc.updates.polynomial_decay`, Welling & Teh's
    a(b + t)^−γ) or ``None`` (default: the curvature rule, module docstring; also for
    :class:`PSGLD` and :class:`SGHMC`).  ``init_strategy``: a name in :data:`PYRO_INIT_STRATEGIES` or a Pyro init strategy.
    """

    def _build(self, value_and_grad) -> Kernel:
        return sgld(value_and_grad, self._schedule)

    def _default_step_size(self, hessian, z: torch.Tensor) -> float:
        return sgld_step_size(self._radius(hessian, z), self._batch_ratio)


class PSGLD(_StochasticGradientKernel):
    """Preconditioned SGLD with the RMSprop preconditioner (Li et al. 2016, Alg. 1, Γ omitted).

    V ← αV + (1−α) ḡ⊙ḡ with ḡ = g/N, G = 1 ⊘ (λ + √V), z ← z + (ε_t/2) G⊙g + √(ε_t G) ξ
    (``rms_decay`` α ∈ (0, 1), ``rms_damping`` λ > 0).  ``num_data`` N defaults to the number
    of observed values in the full data set: Σ over observed sites of (values × scale), e.g. N
    for a ``pyro.plate("data", N, subsample_size=n)`` of scalar observations.
    """

    def __init__(
        self, model: Callable, step_size: Optional[StepSize] = None, rms_decay: float = 0.99, rms_damping: float = 1e-5,
        num_data: Optional[int] = None, init_strategy: Union[str, Callable] = "uniform",
    ):  # fmt: skip
        super().__init__(model, step_size, init_strategy)
        self.rms_decay = _positive("rms_decay", rms_decay, upper=1.0)
        self.rms_damping = _positive("rms_damping", rms_damping)
        self.num_data = None if num_data is None else _positive("num_data", num_data)

    def _build(self, value_and_grad) -> Kernel:
        return psgld(value_and_grad, self._schedule, self._num_data(), self.rms_decay, self.rms_damping, self._warm_start())

    def _num_data(self) -> float:
        return self.num_data if self.num_data is not None else max(self._num_observed, 1.0)

    def _warm_start(self) -> int:
        return 1 if self._batch_ratio == 1 else PSGLD_WARM_START

    def _default_step_size(self, hessian, z: torch.Tensor) -> float:
        """SGLD's rule on G^{1/2} H G^{1/2}, G from the kernel's RMSprop average."""
        square_avg = self._state.square_avg[0]
        return sgld_step_size(self._radius(preconditioned(hessian, rms_preconditioner(square_avg, self.rms_damping)), z),
                              self._batch_ratio)  # fmt: skip


class SGHMC(_StochasticGradientKernel):
    """Stochastic-gradient HMC (Chen et al. 2014, eq. 15 with M = I and β̂ = 0).

    v ← (1−α) v + η g + √(2αη) ξ, z ← z + v (``step_size`` η, ``friction`` α ∈ (0, 1]); this
    is Chen et al.'s p ← (1−Dh)p − h∇Ũ + √(2Dh) ξ, θ ← θ + hp with η = h², α = Dh.
    """

    def __init__(
        self, model: Callable, step_size: Optional[StepSize] = None, friction: float = 0.1,
        init_strategy: Union[str, Callable] = "uniform",
    ):  # fmt: skip
        super().__init__(model, step_size, init_strategy)
        self.friction = _positive("friction", friction, upper=1.0, closed=True)

    def _build(self, value_and_grad) -> Kernel:
        return sghmc(value_and_grad, self._schedule, self.friction)

    def _default_step_size(self, hessian, z: torch.Tensor) -> float:
        return sghmc_step_size(self._radius(hessian, z), self._batch_ratio, self.friction)
