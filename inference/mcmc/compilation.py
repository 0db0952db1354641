"""When to ``torch.compile`` a sampler's transition: only where it pays.

A compiled NUTS subtree (or HMC leapfrog step) is several times cheaper per gradient than the
eager Python loop over the same step, but compiling it costs seconds to tens of seconds in a
fresh process (dynamo, AOT autograd, inductor and a C++ compile; docs/mcmc.md, "Start-up
cost").  A fit of a few thousand gradients is over before a compile would have paid back.

:class:`LazyCompile` decides while the chains run, as in the ski-rental problem: it starts
with the eager transition, times each iteration, and switches to the compiled one once the
eager time the remaining iterations would still take, times the share compiling saves
(1 − :data:`COMPILED_COST_FRACTION`), exceeds the expected compile time — the time measured for
the same compiled unit earlier in this process, else :data:`COLD_COMPILE_SECONDS`.  Since each
iteration re-checks the forecast, a fit that needs the compile gets it after one or two eager
iterations, and one that does not never pays for it.  Once compiled it stays compiled.

:func:`compile_blocker` names what stops a network's potential from compiling at all (a
recurrent layer, or a network evaluated draw by draw without ``vmap``), so that such a model
runs eagerly from the start instead of paying for a failed attempt.
"""
from __future__ import annotations

import time
import warnings
from typing import Callable, Optional

from torch import nn
from tqdm.auto import tqdm

__all__ = ["COMPILE_MODES", "COLD_COMPILE_SECONDS", "COMPILED_COST_FRACTION", "LazyCompile", "compile_blocker",
           "should_compile", "unit_key"]

#: ``compile`` options of the HMC / NUTS backends
COMPILE_MODES = (True, False, "auto")
#: first compile of a NUTS subtree / HMC leapfrog step in a fresh process with an empty inductor
#: cache, 2-core development machine (docs/mcmc.md): 8-14 s idle, 15-25 s under load
COLD_COMPILE_SECONDS = 15.0
#: compiled ÷ eager cost per iteration assumed by the forecast (measured 0.1-0.2 on the benchmark
#: models; the larger value makes the rule wait a little longer before compiling)
COMPILED_COST_FRACTION = 0.25

_measured: dict = {}  # compiled unit's key -> seconds its first compiled call took in this process


def compile_blocker(bnn) -> Optional[str]:
    """Why ``torch.compile`` cannot compile the potential of ``bnn``, or ``None``.

    Recurrent modules (``nn.RNNBase``: GRU, LSTM, RNN) are not traced by dynamo and have no ``vmap``
    batching rule; a network that :meth:`~zoo.bnn.BayesianNetwork.check_forward` found ``vmap`` cannot
    batch is evaluated draw by draw, a Python loop that cannot go inside the compiled ``while_loop``.
    """
    recurrent = next((type(m).__name__ for m in bnn.net.modules() if isinstance(m, nn.RNNBase)), None)
    if recurrent is not None:
        return f"the network has a recurrent layer ({recurrent}), which torch.compile does not trace"
    if bnn.batched_draws is False:
        return f"the network is evaluated draw by draw (no vmap batching rule: {bnn.batching_error})"
    return None


def should_compile(eager_seconds: float, done: int, total: int, compile_seconds: float) -> bool:
    """The rule of :class:`LazyCompile`: after ``done`` of ``total`` iterations that took ``eager_seconds``
    eagerly, compile when (total − done)·(eager_seconds/done)·(1 − :data:`COMPILED_COST_FRACTION`) >
    ``compile_seconds``."""
    if done <= 0 or total <= done:
        return False
    return (total - done) * (eager_seconds / done) * (1 - COMPILED_COST_FRACTION) > compile_seconds


class LazyCompile:
    """A transition ``(state, *args) -> (state, info)`` that runs eagerly until compiling pays.

    Args:
        build: ``build(compile: bool) -> transition``, called once with ``False`` and at most once
            with ``True`` (when the rule says so).
        mode: ``"auto"`` (the rule of :func:`should_compile`), ``True`` (compiled from the first
            iteration) or ``False`` (never).
        total: the iterations the sampler will run (warm-up and sampling).
        key: names the compiled unit and its input shapes; compile times are remembered per key
            for later fits in this process.
        blocker: :func:`compile_blocker`'s reason, or ``None``; with a reason the transition stays
            eager (with a ``RuntimeWarning`` when ``mode`` is ``True``).
        progress, desc: a ``tqdm.auto`` bar while the first compiled call runs.

    After the run, :attr:`record` holds ``compile`` (the mode), ``compiled_from`` (the first
    compiled iteration or ``None``), ``compile_seconds`` (that call's wall time) and
    ``compile_skipped`` (the blocker, if any).
    """

    def __init__(self, build: Callable[[bool], Callable], mode, total: int, key: tuple, blocker: Optional[str] = None,
                 progress: bool = False, desc: str = "compiling"):
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile must be true, false or 'auto', got {mode!r}")
        if blocker is not None and mode is True:
            warnings.warn(f"compile=True, but {blocker}: running without compilation", RuntimeWarning, stacklevel=3)
        self.build, self.total, self.key, self.progress, self.desc = build, total, key, progress, desc
        self.enabled = mode is not False and blocker is None
        self.record = {"compile": mode, "compiled_from": None, "compile_seconds": None, "compile_skipped": blocker}
        self.eager = build(False)
        self.compiled = None
        self.done, self.eager_seconds = 0, 0.0
        if self.enabled and mode is True:
            self._switch()

    def _switch(self) -> None:
        self.compiled = self.build(True)
        self.record["compiled_from"] = self.done

    def __call__(self, state, *args):
        if self.compiled is not None and self.record["compile_seconds"] is None:
            bar = tqdm(total=1, desc=self.desc, disable=not self.progress, leave=False)
            started = time.perf_counter()
            out = self.compiled(state, *args)
            seconds = time.perf_counter() - started
            bar.update(1)
            bar.close()
            self.record["compile_seconds"] = _measured[self.key] = seconds
        elif self.compiled is not None:
            out = self.compiled(state, *args)
        else:
            started = time.perf_counter()
            out = self.eager(state, *args)
            self.eager_seconds += time.perf_counter() - started
        self.done += 1
        if self.enabled and self.compiled is None and should_compile(
            self.eager_seconds, self.done, self.total, _measured.get(self.key, COLD_COMPILE_SECONDS)
        ):
            self._switch()
        return out


def unit_key(kind: str, potential, num_chains: int, *extra) -> tuple:
    """The key :class:`LazyCompile` remembers compile times under: the unit, the network's class, the
    sizes and the dtype/device of ``potential``."""
    like = potential.bnn.target_scale
    return (kind, type(potential.bnn.net).__name__, potential.dim, num_chains, potential.num_data, like.dtype,
            str(like.device), *extra)
