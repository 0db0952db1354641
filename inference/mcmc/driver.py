"""One warm-up / sampling loop for every sampler (HMC, NUTS and SG-MCMC).

:func:`run_chains` iterates a transition ``(state, params) -> (state, info)`` over all
chains at once, feeds warm-up iterations to an optional :class:`~inference.mcmc.adaptation.
Adaptation` (whose state is the ``params`` the transition reads), keeps the draws chosen by
``draw_index``, and shows ``zoo.progress.tqdm`` progress bars, one for the warm-up and one for the
sampling iterations, unless ``progress=False``.  States
are NamedTuples with fields ``z`` ``[C, D]``, ``log_density`` ``[C]`` and ``grad`` ``[C, D]``;
``info`` is a dict of per-chain ``[C]`` tensors, stored per kept draw as ``[C, S]``.  An optional
:class:`~inference.mcmc.budget.Monitor` sees every iteration's wall time and ``info`` and may stop the
run by raising (:func:`inference.mcmc.budget.time_budget`).
"""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple, Optional

import torch
from zoo.progress import tqdm

from inference.mcmc.adaptation import Adaptation
from inference.mcmc.budget import Monitor

__all__ = ["ChainRun", "run_chains", "thinned"]


class ChainRun(NamedTuple):
    """What :func:`run_chains` returns.

    Attributes:
        z: the kept draws ``[C, S, D]`` (only the first ``num_kept`` are filled when stopped early).
        stats: ``{name: [C, S]}`` from the transitions' ``info`` at the kept draws.
        num_kept: draws filled.
        state: the last (finite) chain state.
        params: the final adaptation state (or the ``params`` given).
        warmup_divergences: transitions with ``info["diverging"]`` set during warm-up.
        warmup_seconds / sampling_seconds: wall time of the two phases.
        stopped_at: the iteration whose new state was non-finite (``stop_on_non_finite``) or made ``stop_when``
            true, else ``None``.
    """

    z: torch.Tensor
    stats: dict
    num_kept: int
    state: Any
    params: Any
    warmup_divergences: int
    warmup_seconds: float
    sampling_seconds: float
    stopped_at: Optional[int]


def thinned(num_warmup: int, thin: int) -> Callable[[int], Optional[int]]:
    """``draw_index`` keeping every ``thin``-th iteration after ``num_warmup``: iteration ``it``
    → draw ``(it − num_warmup) // thin`` when ``it − num_warmup ≡ thin − 1 (mod thin)``."""

    def draw_index(it: int) -> Optional[int]:
        draw, rest = divmod(it - num_warmup, thin)
        return draw if it >= num_warmup and rest == thin - 1 else None

    return draw_index


def _finite(state) -> bool:
    return bool(torch.isfinite(state.log_density).all() and torch.isfinite(state.grad).all())


def run_chains(
    transition: Callable,
    state,
    *,
    num_iterations: int,
    num_draws: int,
    draw_index: Callable[[int], Optional[int]],
    params=None,
    adaptation: Optional[Adaptation] = None,
    num_warmup: int = 0,
    stop_on_non_finite: bool = False,
    stop_when: Optional[Callable[[int, Any], bool]] = None,
    progress: bool = True,
    desc: str = "",
    monitor: Optional[Monitor] = None,
) -> ChainRun:
    """Run ``num_iterations`` transitions of all chains; keep ``num_draws`` draws per chain.

    Iterations ``it < num_warmup`` update ``params`` with ``adaptation.update(params, state, info)``
    and end with ``adaptation.final(params)``; their draws are never kept.  ``draw_index(it)``
    names the draw slot of a later iteration's new state (or ``None``).  ``stop_when(it, state)``, when
    given, is asked after each iteration's (finite) new state; ``True`` stops the run there.  ``monitor.update(m, seconds,
    info)`` follows every iteration (its wall ``seconds``, adaptation included); what it raises ends the
    run (the progress bars closed).
    """
    num_chains, dim = state.z.shape
    keep = state.z.new_empty(num_chains, num_draws, dim)
    stats: dict = {}
    num_kept, warmup_divergences, divergences, stopped_at = 0, 0, 0, None
    phases = [(f"{desc} warm-up", num_warmup), (f"{desc} sampling", num_iterations - num_warmup)]
    bars = [tqdm(total=n, desc=label, disable=not progress or n <= 0) for label, n in phases if n > 0]
    started, warmup_seconds = time.perf_counter(), 0.0
    watch = monitor.init() if monitor is not None else None
    try:
        for it in range(num_iterations):
            bar = bars[0] if it < num_warmup or len(bars) == 1 else bars[1]
            began = time.perf_counter()
            new, info = transition(state, params)
            if stop_on_non_finite and not _finite(new):
                stopped_at = it
                break
            state = new
            if stop_when is not None and stop_when(it, state):
                stopped_at = it
                break
            if "diverging" in info:
                count = int(info["diverging"].sum())
                warmup_divergences += count if it < num_warmup else 0
                divergences += count if it >= num_warmup else 0
            if it < num_warmup:
                if adaptation is not None:
                    params = adaptation.update(params, state, info)
                if it + 1 == num_warmup:
                    if adaptation is not None:
                        params = adaptation.final(params)
                    warmup_seconds = time.perf_counter() - started
            else:
                draw = draw_index(it)
                if draw is not None:
                    keep[:, draw] = state.z
                    for key, value in info.items():
                        stats.setdefault(key, value.new_empty(num_chains, num_draws))[:, draw] = value
                    num_kept = draw + 1
            if progress and it % 10 == 0:
                postfix = {"lp": f"{float(state.log_density.mean()):.4g}"}
                if "step_size" in info:
                    postfix["step"] = f"{float(info['step_size'].mean()):.3g}"
                if "diverging" in info:
                    postfix["div"] = divergences if it >= num_warmup else warmup_divergences
                bar.set_postfix(postfix, refresh=False)
            bar.update(1)
            if it + 1 == num_warmup:
                bar.close()
            if monitor is not None:
                watch = monitor.update(watch, time.perf_counter() - began, info)
    finally:
        for bar in bars:
            bar.close()
    sampling_seconds = time.perf_counter() - started - warmup_seconds
    return ChainRun(keep, stats, num_kept, state, params, warmup_divergences, warmup_seconds, sampling_seconds, stopped_at)
