"""SG-MCMC chains over a :class:`~inference.optim.potential.Potential`: gradient estimates, default step, the run.

* :func:`gradient_estimator` — ``z [C, D] -> (log π̃ [C], ∇ log π̃ [C, D])`` on the next minibatch: random
  rows of the stored data (:func:`index_batches`) or a DataLoader's next batch, the likelihood scaled
  by N/n;
* :func:`curvature_step_size` — the default step size of :mod:`inference.sgmcmc.step_sizes` from the
  spectral radius of the Hessian of −log π̃ at the start point, on up to :data:`~inference.sgmcmc.
  step_sizes.CURVATURE_ROWS` training rows (scaled by N/m), for the minibatch ratio r = N/n; the same
  radius caps the chains' start jitter (:func:`inference.sgmcmc.stability.start_jitter`);
* :func:`cycle_draw_index` — which steps of cyclical SG-MCMC (Zhang et al. 2020) are kept;
* :func:`sample_sgmcmc` — the kernel's steps on :func:`inference.mcmc.driver.run_chains`, the kept
  draws as a :class:`~inference.posterior.SamplePosterior`.  Chains that diverge *before the first kept
  draw* (a non-finite value, or a collapse of the log density: :mod:`inference.sgmcmc.stability`)
  restart from their starts with a smaller step; past the last back-off that is a
  :class:`~inference.sgmcmc.stability.SamplerDivergedError`, and a non-finite value after a kept draw a
  :class:`~inference.optim.training.NonFiniteLossError` carrying the draws so far.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, NamedTuple, Optional

import torch

from inference.mcmc.budget import Monitor
from inference.mcmc.convergence import chain_convergence
from inference.mcmc.driver import run_chains
from inference.optim.batches import LoaderBatches, minibatches
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.start import endless_batches
from inference.optim.training import NonFiniteLossError
from inference.posterior import SamplePosterior
from inference.sgmcmc.stability import MAX_BACKOFFS, CollapseCheck, SamplerDivergedError, backed_off_runs
from inference.sgmcmc.step_sizes import CURVATURE_ROWS, hessian_operator, spectral_radius
from inference.sgmcmc.updates import Kernel

__all__ = ["index_batches", "gradient_estimator", "StartCurvature", "curvature_operator", "curvature_step_size",
           "cycle_draw_index", "first_kept", "sample_sgmcmc"]



def index_batches(num_data: int, batch_size: Optional[int], generator: torch.Generator) -> Iterator[Optional[torch.Tensor]]:
    """Row indices ``[n]`` of shuffled minibatches of ``batch_size``, epoch after epoch without end; ``None``
    (the full data) forever when ``batch_size`` is ``None`` or at least ``num_data``."""
    if batch_size is None or batch_size >= num_data:
        while True:
            yield None
    while True:
        yield from minibatches(num_data, batch_size, generator)


def gradient_estimator(potential: Potential, loader: Optional[LoaderBatches], batch_size: Optional[int],
                       generator: torch.Generator) -> Callable:
    """``estimate(z [C, D]) -> (log π̃ [C], ∇ log π̃ [C, D])`` on the next minibatch: of ``batch_size`` rows of
    the potential's data (:func:`index_batches`), or ``loader``'s next batch; each call takes a new one."""
    if loader is None:
        indices = index_batches(potential.num_data, batch_size, generator)
        return lambda z: potential.value_and_grad(z, next(indices))
    batches = endless_batches(loader, generator)
    return lambda z: potential.batch_value_and_grad(z, *next(batches))


class StartCurvature(NamedTuple):
    """The curvature rows at the start point and the Hessian of −log π̃ on them.

    Attributes:
        hessian: ``v [D] -> ∇²(−log π̃)(z0) v`` on the rows ``x``, ``y`` with their likelihood scaled by N/m.
        batch_ratio: r = N/n of the sampler's minibatches (1 for full batch).
        x, y: the m curvature rows.
    """

    hessian: Callable
    batch_ratio: float
    x: torch.Tensor
    y: torch.Tensor


def curvature_operator(potential: Potential, z0: torch.Tensor, loader: Optional[LoaderBatches],
                       batch_size: Optional[int], generator: torch.Generator) -> StartCurvature:
    """The Hessian-vector product of −log π̃ at the start point ``z0`` ``[D]`` on the curvature rows.

    The curvature rows are a random :data:`~inference.sgmcmc.step_sizes.CURVATURE_ROWS` of the potential's
    rows (all when fewer), or the loader's first batches up to that many rows, their likelihood scaled by
    N/m; the minibatch ratio is r = N/n for minibatches of ``batch_size`` (the loader's first batch)."""
    if loader is None:
        n = potential.num_data if batch_size is None else min(batch_size, potential.num_data)
        rows = None
        if potential.num_data > CURVATURE_ROWS:
            rows = torch.randperm(potential.num_data, generator=generator)[:CURVATURE_ROWS]
        x, y = (potential.x, potential.y) if rows is None else (potential.x[rows], potential.y[rows])
    else:  # the loader's first batches, up to CURVATURE_ROWS rows
        batches = []
        for batch in loader.epoch(generator):
            batches.append(batch)
            if sum(b[0].shape[0] for b in batches) >= CURVATURE_ROWS:
                break
        n = batches[0][0].shape[0]
        x, y = (torch.cat([b[i] for b in batches]) for i in (0, 1))
    hessian = hessian_operator(lambda z: -potential.batch_log_density(z.unsqueeze(0), x, y).squeeze(0), z0)
    return StartCurvature(hessian, potential.num_data / n, x, y)


def curvature_step_size(start: StartCurvature, z0: torch.Tensor, rule: Optional[Callable],
                        generator: torch.Generator) -> tuple[Optional[float], dict]:
    """The default step size at the start point ``z0`` ``[D]`` and the record of the start's curvature.

    ``rule(hessian, curvature, r)`` is a step rule of :mod:`inference.sgmcmc.step_sizes` (``None``: no
    step, the curvature only): ``hessian`` the Hessian-vector product of −log π̃ on the curvature rows
    at ``z0`` (``start``, :func:`curvature_operator`), ``curvature(operator)`` the spectral radius of an operator by
    power iteration from a random start.  The record holds ``hessian_radius`` (ρ of ``hessian`` itself,
    which sets the chains' start jitter, :func:`start_jitter`), the last ``curvature`` a rule took,
    ``batch_ratio``, ``step_size`` and ``curvature_rows``."""
    hessian, batch_ratio = start.hessian, start.batch_ratio
    radii, raw = [], []

    def curvature(operator):
        if operator is hessian and raw:
            radii.append(raw[0])
            return raw[0]
        start = torch.randn(z0.shape, generator=generator).to(z0)
        radii.append(spectral_radius(operator, start))
        if operator is hessian:
            raw.append(radii[-1])
        return radii[-1]

    record = {}
    if rule is not None:
        step = rule(hessian, curvature, batch_ratio)
        record.update(curvature=radii[-1], step_size=step)
    else:
        step = None
    record.update(hessian_radius=curvature(hessian), batch_ratio=batch_ratio, curvature_rows=start.x.shape[0])
    return step, record


def cycle_draw_index(length: int, per_cycle: int, thin: int, sampling_steps: int) -> Callable[[int], Optional[int]]:
    """``draw_index`` of cyclical SG-MCMC: cycles of ``length`` steps, each keeping ``per_cycle`` draws
    ``thin`` steps apart from the last ``sampling_steps`` steps of the cycle; step ``t`` (0-based) → the
    draw slot of the state after it, or ``None``."""
    first_kept = length - sampling_steps  # draws come from the end of each cycle

    def draw_index(t: int) -> Optional[int]:
        cycle, offset = divmod(t, length)
        offset -= first_kept
        return cycle * per_cycle + offset // thin if offset >= 0 and offset % thin == thin - 1 else None

    return draw_index


#: the divergence reason of a run stopped by a non-finite log density or gradient
NON_FINITE = "the log density or its gradient became non-finite"


def first_kept(draw_index: Callable[[int], Optional[int]], num_iterations: int) -> int:
    """The first step whose state ``draw_index`` keeps (``num_iterations`` if none)."""
    return next((t for t in range(num_iterations) if draw_index(t) is not None), num_iterations)


def sample_sgmcmc(bnn, potential: Potential, make_kernel: Callable[[float], Kernel], step_size: float,
                  z: torch.Tensor, generator: torch.Generator, info: dict, started: float, *, num_iterations: int,
                  num_draws: int, draw_index: Callable[[int], Optional[int]], num_warmup: int, progress: bool,
                  desc: str, collapse: Optional[Callable[[], CollapseCheck]] = None,
                  max_backoffs: int = MAX_BACKOFFS, monitor: Optional[Monitor] = None, head: Optional[str] = None,
                  first_batch: Optional[Callable[[], tuple]] = None) -> SamplePosterior:
    """Run the kernel ``make_kernel(step_size)`` from the starts ``z`` ``[C, D]`` for ``num_iterations``
    steps (the first ``num_warmup`` burn-in), keeping the ``num_draws`` draws of ``draw_index``; the
    posterior's ``info`` is ``info`` with ``fit_seconds`` since ``started`` (``time.perf_counter``).  The
    steps run without gradients, with the deterministic parameters frozen
    (:func:`~inference.optim.potential.frozen_deterministic`) and, with ``head``, the output module
    evaluated on cached features (:meth:`~inference.optim.potential.Potential.cached_head`); ``monitor``
    (a :func:`~inference.mcmc.budget.time_budget`) may stop them.  A run that diverges — a non-finite
    value, or a collapse by a new ``collapse()`` check (:class:`~inference.sgmcmc.stability.CollapseCheck`)
    — before its first kept draw restarts with a smaller step (:func:`~inference.sgmcmc.stability.
    backed_off_runs`); ``info["step_size_backoffs"]`` then lists the steps given up and
    ``info["config"]["step_size"]`` is the one used.  The draws' convergence
    (:func:`~inference.mcmc.convergence.chain_convergence`, on the potential's rows, or on the batch
    ``first_batch()`` returns for a DataLoader fit) goes into ``info``, with a warning when the chains
    have not mixed.

    Raises:
        NonFiniteLossError: a non-finite log density or gradient at the starts (the starts as one draw
            per chain), after a kept draw (the draws kept so far).
        SamplerDivergedError: a divergence before the first kept draw after the last back-off (the last
            finite state).
    """
    watch_until = first_kept(draw_index, num_iterations)

    def posterior(draws, stats, num_kept: int, last_z) -> SamplePosterior:
        info["fit_seconds"] = time.perf_counter() - started
        if num_kept == 0:  # nothing collected yet: the last finite state, one draw per chain
            info["draws_from_last_finite_state"] = True
            return SamplePosterior(bnn, potential.draws(last_z.unsqueeze(1)), info=info)
        kept = {k: v[:, :num_kept] for k, v in stats.items()}
        return SamplePosterior(bnn, potential.draws(draws[:, :num_kept]), sample_stats=kept, info=info)

    def attempt(step: float):
        kernel = make_kernel(step)
        check = collapse() if collapse is not None else None

        def transition(state, _):
            new = kernel.update(state, generator)
            return new, {"lp": new.log_density, "step_size": torch.full_like(new.log_density, kernel.step_size(state.step))}

        state = kernel.init(z)
        if not bool(torch.isfinite(state.log_density).all() and torch.isfinite(state.grad).all()):
            raise NonFiniteLossError(0, "the log density or its gradient", posterior(None, {}, 0, z))
        run = run_chains(
            transition, state, num_iterations=num_iterations, num_draws=num_draws, draw_index=draw_index,
            num_warmup=num_warmup, stop_on_non_finite=True, progress=progress, desc=desc, monitor=monitor,
            stop_when=None if check is None else (lambda it, s: it < watch_until and check(it, s)),
        )  # fmt: skip
        collapsed = check is not None and run.stopped_at is not None and bool(check.reason)
        return run, check.reason if collapsed else NON_FINITE

    with torch.no_grad(), frozen_deterministic(bnn), potential.cached_head(head):
        run, reason, step_size, backoffs = backed_off_runs(attempt, step_size, max_backoffs, desc)
        if run.stopped_at is None:
            batch = first_batch() if first_batch is not None else None
            info.update(chain_convergence(info["backend"], potential, run.z, batch=batch, stacklevel=5))
    if backoffs:
        info["step_size_backoffs"] = backoffs
        if isinstance(info.get("config"), dict):
            info["config"]["step_size"] = step_size
    if run.stopped_at is not None:  # steps taken when the non-finite value or the collapse appeared
        result = posterior(run.z, run.stats, run.num_kept, run.state.z)
        if run.num_kept == 0:
            raise SamplerDivergedError(run.stopped_at + 1, reason, step_size, len(backoffs), result)
        raise NonFiniteLossError(run.stopped_at + 1, "the log density or its gradient", result)
    return posterior(run.z, run.stats, run.num_kept, run.state.z)
