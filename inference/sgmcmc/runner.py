"""SG-MCMC chains over a :class:`~inference.optim.potential.Potential`: gradient estimates, default step, the run.

* :func:`gradient_estimator` — ``z [C, D] -> (log π̃ [C], ∇ log π̃ [C, D])`` on the next minibatch: random
  rows of the stored data (:func:`index_batches`) or a DataLoader's next batch, the likelihood scaled
  by N/n;
* :func:`curvature_step_size` — the default step size of :mod:`inference.sgmcmc.step_sizes` from the
  spectral radius of the Hessian of −log π̃ at the start point, on up to :data:`~inference.sgmcmc.
  step_sizes.CURVATURE_ROWS` training rows (scaled by N/m), for the minibatch ratio r = N/n;
* :func:`cycle_draw_index` — which steps of cyclical SG-MCMC (Zhang et al. 2020) are kept;
* :func:`sample_sgmcmc` — the kernel's steps on :func:`inference.mcmc.driver.run_chains`, the kept
  draws as a :class:`~inference.posterior.SamplePosterior`; a non-finite log density or gradient stops
  the run with :class:`~inference.optim.training.NonFiniteLossError` carrying the draws so far.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

import torch

from inference.mcmc.budget import Monitor
from inference.mcmc.convergence import chain_convergence
from inference.mcmc.driver import run_chains
from inference.optim.batches import LoaderBatches, minibatches
from inference.optim.potential import Potential, frozen_deterministic
from inference.optim.start import endless_batches
from inference.optim.training import NonFiniteLossError
from inference.posterior import SamplePosterior
from inference.sgmcmc.step_sizes import CURVATURE_ROWS, hessian_operator, spectral_radius
from inference.sgmcmc.updates import Kernel

__all__ = ["index_batches", "gradient_estimator", "curvature_step_size", "cycle_draw_index", "sample_sgmcmc"]


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


def curvature_step_size(potential: Potential, z0: torch.Tensor, rule: Callable, loader: Optional[LoaderBatches],
                        batch_size: Optional[int], generator: torch.Generator) -> tuple[float, dict]:
    """The default step size at the start point ``z0`` ``[D]`` and the record of how it was chosen.

    The curvature rows are a random :data:`~inference.sgmcmc.step_sizes.CURVATURE_ROWS` of the potential's
    rows (all when fewer), or the loader's first batches up to that many rows; the minibatch ratio is
    r = N/n for minibatches of ``batch_size`` (the loader's first batch).  ``rule(hessian, curvature, r)``
    is a step rule of :mod:`inference.sgmcmc.step_sizes`: ``hessian`` the Hessian-vector product of
    −log π̃ on the curvature rows at ``z0``, ``curvature(operator)`` the spectral radius of an operator
    by power iteration from a random start.  The record holds the last ``curvature``, ``batch_ratio``,
    ``step_size`` and ``curvature_rows``."""
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
    batch_ratio = potential.num_data / n
    hessian = hessian_operator(lambda z: -potential.batch_log_density(z.unsqueeze(0), x, y).squeeze(0), z0)
    radii = []

    def curvature(operator):
        start = torch.randn(z0.shape, generator=generator).to(z0)
        radii.append(spectral_radius(operator, start))
        return radii[-1]

    step = rule(hessian, curvature, batch_ratio)
    return step, {"curvature": radii[-1], "batch_ratio": batch_ratio, "step_size": step, "curvature_rows": x.shape[0]}


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


def sample_sgmcmc(bnn, potential: Potential, kernel: Kernel, z: torch.Tensor, generator: torch.Generator, info: dict,
                  started: float, *, num_iterations: int, num_draws: int, draw_index: Callable[[int], Optional[int]],
                  num_warmup: int, progress: bool, desc: str, monitor: Optional[Monitor] = None,
                  head: Optional[str] = None, first_batch: Optional[Callable[[], tuple]] = None) -> SamplePosterior:
    """Run ``kernel`` from the starts ``z`` ``[C, D]`` for ``num_iterations`` steps (the first ``num_warmup``
    burn-in), keeping the ``num_draws`` draws of ``draw_index``; the posterior's ``info`` is ``info`` with
    ``fit_seconds`` since ``started`` (``time.perf_counter``).  The steps run without gradients and with
    the deterministic parameters frozen (:func:`~inference.optim.potential.frozen_deterministic`) and, with
    ``head``, the output module evaluated on cached features (:meth:`~inference.optim.potential.Potential.
    cached_head`); ``monitor`` (a :func:`~inference.mcmc.budget.time_budget`) may stop them.  The draws'
    convergence (:func:`~inference.mcmc.convergence.chain_convergence`, on the potential's rows, or on the
    batch ``first_batch()`` returns for a DataLoader fit) goes into ``info``, with a warning when the chains
    have not mixed.

    Raises:
        NonFiniteLossError: a non-finite log density or gradient at the starts (the starts as one draw
            per chain) or after step ``k`` (the draws kept so far, else the last finite state).
    """

    def posterior(draws, stats, num_kept: int, last_z) -> SamplePosterior:
        info["fit_seconds"] = time.perf_counter() - started
        if num_kept == 0:  # nothing collected yet: the last finite state, one draw per chain
            info["draws_from_last_finite_state"] = True
            return SamplePosterior(bnn, potential.draws(last_z.unsqueeze(1)), info=info)
        kept = {k: v[:, :num_kept] for k, v in stats.items()}
        return SamplePosterior(bnn, potential.draws(draws[:, :num_kept]), sample_stats=kept, info=info)

    def step(state, _):
        new = kernel.update(state, generator)
        return new, {"lp": new.log_density, "step_size": torch.full_like(new.log_density, kernel.step_size(state.step))}

    with torch.no_grad(), frozen_deterministic(bnn), potential.cached_head(head):
        state = kernel.init(z)
        if not bool(torch.isfinite(state.log_density).all() and torch.isfinite(state.grad).all()):
            raise NonFiniteLossError(0, "the log density or its gradient", posterior(None, {}, 0, z))
        run = run_chains(
            step, state, num_iterations=num_iterations, num_draws=num_draws, draw_index=draw_index,
            num_warmup=num_warmup, stop_on_non_finite=True, progress=progress, desc=desc, monitor=monitor,
        )  # fmt: skip
        if run.stopped_at is None:
            batch = first_batch() if first_batch is not None else None
            info.update(chain_convergence(info["backend"], potential, run.z, batch=batch, stacklevel=5))
    if run.stopped_at is not None:  # steps taken when the non-finite value appeared
        result = posterior(run.z, run.stats, run.num_kept, run.state.z)
        raise NonFiniteLossError(run.stopped_at + 1, "the log density or its gradient", result)
    return posterior(run.z, run.stats, run.num_kept, run.state.z)
