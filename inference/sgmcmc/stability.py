"""Keeping SG-MCMC chains stable from their start: the start jitter, the collapse check and the step back-off.

A step size is stable along a direction of curvature λ only below a limit (SGLD: ε < 4/λ); a step set by
hand for another scale, or by the curvature rule (:mod:`inference.sgmcmc.step_sizes`) at a start whose
curvature misleads, can exceed it along the stiffest direction.  There the chains either overflow
(a non-finite log density or gradient) or — where the stiff direction is a precision the chains can
lower, such as a likelihood's noise precision — settle far below the posterior's typical log density,
with every draw wrong.  The rule (docs/mcmc.md, "SG-MCMC step sizes"):

* :func:`start_jitter` — the chains start near the start's Laplace approximation: jitter sd at most
  2/√ρ, ρ the spectral radius of the Hessian of −log π̃ at the start;
* :class:`CollapseCheck` — before the first kept draw, a chain has *diverged* when its log density is
  non-finite or its mean minibatch log density over the last :data:`COLLAPSE_WINDOW` steps lies more than
  Δ = 5 D + 5 σ below the start's log density log π̃(z₀) estimated on the curvature rows: beyond the drop
  f·D/2 of a Gaussian posterior whose variance is f = 10 times the start's Laplace approximation
  (E[log π(z₀) − log π(z)] = f D/2 for a stationary draw), by more than five standard errors σ of the
  difference of the two estimates (σ² = σ_W² + σ_0²: the window mean's minibatch noise and the
  curvature rows' own sampling error);
* :func:`backed_off_runs` — a run that diverged before its first kept draw restarts from its starts with
  the step divided by :data:`BACKOFF_FACTOR`, at most ``max_backoffs`` times.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import torch

from inference.mcmc.driver import ChainRun
from inference.optim.potential import Potential
from inference.optim.training import NonFiniteLossError

__all__ = ["BACKOFF_FACTOR", "MAX_BACKOFFS", "COLLAPSE_WINDOW", "start_jitter", "CollapseCheck", "collapse_check",
           "backed_off_runs", "SamplerDivergedError"]

#: a run that diverges before its first kept draw restarts with its step size divided by this
BACKOFF_FACTOR = 4.0
#: restarts at most (4⁸ = 65 536: from a step 10⁴ times too large for the stiffest direction)
MAX_BACKOFFS = 8
#: steps whose mean minibatch log density the collapse check compares with the start's
COLLAPSE_WINDOW = 50
#: f: the collapse threshold's variance inflation over the start's Laplace approximation
COLLAPSE_INFLATION = 10.0
#: standard errors of the window mean's minibatch noise added to the threshold
COLLAPSE_NOISE_SE = 5.0
#: the start jitter's sd at most this many posterior sds along the stiffest direction
JITTER_OVERDISPERSION = 2.0


def start_jitter(jitter: float, hessian_radius: float) -> float:
    """The chains' start jitter: ``jitter``, but at most :data:`JITTER_OVERDISPERSION`/√ρ — twice the
    posterior sd along the stiffest direction of a Gaussian with the start's Hessian (spectral radius ρ):
    overdispersed along it, as R-hat's chains should start (Gelman & Rubin 1992), and at most
    JITTER_OVERDISPERSION²·D/2 = 2D nats below the mode.  A fixed jitter wider than that moves the starts
    ~ρ·jitter²·D/2 nats below it (10⁵ on an Euler-angle head with ρ ≈ 10⁸): a descent the first steps
    spend on, indistinguishable at first from a collapse."""
    if not (math.isfinite(hessian_radius) and hessian_radius > 0):
        return jitter
    return min(jitter, JITTER_OVERDISPERSION / math.sqrt(hessian_radius))


class CollapseCheck:
    """``check(it, state) -> bool``: whether a chain has collapsed (module docstring), step by step.

    Attributes:
        reference: log π̃(z₀) at the start on the curvature rows (likelihood scaled by N/m).
        threshold: Δ, in nats.
        window: W, steps per mean.
        reason: after a ``True``: what collapsed, for the error and the warning.
    """

    def __init__(self, reference: float, threshold: float, window: int = COLLAPSE_WINDOW):
        self.reference, self.threshold, self.window = reference, threshold, window
        self.reason = ""
        self._recent: list = []

    def fresh(self) -> "CollapseCheck":
        """The same check with no steps seen (one per attempt)."""
        return CollapseCheck(self.reference, self.threshold, self.window)

    def __call__(self, it: int, state) -> bool:
        self._recent.append(state.log_density.detach().double())
        if len(self._recent) > self.window:
            self._recent.pop(0)
        if len(self._recent) < self.window:
            return False
        mean = torch.stack(self._recent).mean(0)  # [C]
        drop = self.reference - mean
        if not bool((drop > self.threshold).any()):
            return False
        self.reason = (f"the mean log density of chain {int(drop.argmax())} over steps {it + 2 - self.window}-{it + 1} "
                       f"lies {float(drop.max()):.4g} nats below the start's (limit {self.threshold:.4g})")
        return True


def collapse_check(potential: Potential, z0: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                   batch_ratio: float) -> CollapseCheck:
    """The :class:`CollapseCheck` of a run from ``z0`` ``[D]`` with minibatches of n = N / ``batch_ratio``
    rows, from the m curvature rows ``x``, ``y``.

    σ_W: a minibatch of n of the N rows estimates the log-likelihood sum as (N/n) Σ_batch ℓ_i, whose sd
    is N s √(1 − n/N) / √n (s the sd of the per-row log-likelihoods ℓ_i at ``z0``, sampling without
    replacement); the mean of W such independent estimates has sd σ_W = that / √W (0 for full batch).
    σ_0 = N s √(1 − m/N) / √m is the same for the reference log π̃(z₀) on the m curvature rows (0 when they
    are all N rows): a start whose m rows happen to fit well would otherwise make an unmoved chain look
    collapsed (Euler increments, 8 003 rows, m = 2 048: a drop of 3 700 nats against a limit of 3 591
    at every step size down to 10⁻¹⁴)."""
    N = potential.num_data
    n = max(1, round(N / batch_ratio))
    with torch.no_grad():
        values, _ = potential.unpack(z0.unsqueeze(0))
        per_row = potential.bnn.log_likelihood(values, x, y).reshape(-1).double()
        reference = float(potential.batch_log_density(z0.unsqueeze(0), x, y).squeeze(0))
    spread = float(per_row.std(unbiased=False)) if per_row.numel() > 1 else 0.0
    m = per_row.numel()
    window_noise = N * spread * math.sqrt(max(0.0, 1.0 - n / N)) / math.sqrt(n) / math.sqrt(COLLAPSE_WINDOW)
    reference_noise = N * spread * math.sqrt(max(0.0, 1.0 - m / N)) / math.sqrt(m)
    threshold = COLLAPSE_INFLATION * z0.shape[-1] / 2 + COLLAPSE_NOISE_SE * math.hypot(window_noise, reference_noise)
    return CollapseCheck(reference, threshold)


def backed_off_runs(run: Callable[[float], tuple[ChainRun, str]], step_size: float, max_backoffs: int,
                    desc: str) -> tuple[ChainRun, str, float, list]:
    """``run(step_size)`` again with the step divided by :data:`BACKOFF_FACTOR` while it diverges early.

    ``run(step) -> (ChainRun, reason)``; an attempt *diverged early* when it stopped (``stopped_at`` set:
    a non-finite value or a collapse, ``reason`` saying which) before it kept any draw.  Each restart is
    warned (``RuntimeWarning``) and recorded.  Returns the last attempt, its reason, its step size and
    the record ``[{"step_size": ε, "diverged_at_step": k, "reason": ...}, ...]`` of the attempts given up."""
    record = []
    while True:
        attempt, reason = run(step_size)
        if attempt.stopped_at is None or attempt.num_kept > 0 or len(record) >= max_backoffs:
            return attempt, reason, step_size, record
        record.append({"step_size": step_size, "diverged_at_step": attempt.stopped_at + 1, "reason": reason})
        smaller = step_size / BACKOFF_FACTOR
        warnings.warn(f"{desc}: at step {attempt.stopped_at + 1}, before the first kept draw, with step size "
                      f"{step_size:.3g}, {reason}; restarting from the starts with step size {smaller:.3g} "
                      f"(back-off {len(record)} of at most {max_backoffs}; option max_backoffs)",
                      RuntimeWarning, stacklevel=3)
        step_size = smaller


class SamplerDivergedError(NonFiniteLossError):
    """SG-MCMC chains that still diverged before their first kept draw after the last back-off.

    Attributes (beyond :class:`~inference.optim.training.NonFiniteLossError`'s): ``reason`` (what
    diverged) and ``step_size`` (the last step size tried)."""

    def __init__(self, step: int, reason: str, step_size: float, backoffs: int, posterior=None):
        RuntimeError.__init__(
            self, f"the chains diverged at step {step} with step size {step_size:.3g} after {backoffs} back-off(s): "
                  f"{reason}. The run stopped and kept the last finite state (available as .posterior). Give a "
                  f"smaller step_size, raise max_backoffs, or start closer to a mode (init='map', more map_steps).")
        self.step, self.what, self.reason, self.step_size, self.backoffs = step, reason, reason, step_size, backoffs
        self.posterior = posterior

    def __reduce__(self):
        return type(self), (self.step, self.reason, self.step_size, self.backoffs)
