"""When to ``torch.compile`` a sampler's transition: only where it pays.

A compiled NUTS subtree (or HMC leapfrog step) is several times cheaper per gradient than the
eager Python loop over the same step, but compiling it costs seconds to tens of seconds in a
fresh process (dynamo, AOT autograd, inductor and a C++ compile; docs/mcmc.md, "Start-up
cost").  A fit of a few thousand gradients is over before a compile would have paid back.

:class:`LazyCompile` decides while the chains run, as in the ski-rental problem: it starts
with the eager transition, times each iteration in CPU seconds of its thread (so that other jobs on a
shared machine, which slow the compile as much as the iterations, do not tip the rule: at load 24 on 2
cores, wall-clock timing compiled a 10-step-per-iteration last-layer fit for minutes that ran eagerly
in seconds), and switches to the compiled one once the
eager time the remaining iterations would still take, times the share compiling saves
(1 − :data:`COMPILED_COST_FRACTION`), exceeds the expected compile time — the time measured for
the same compiled unit earlier in this process, else :data:`COLD_COMPILE_SECONDS`.  Since each
iteration re-checks the forecast, a fit that needs the compile gets it after one or two eager
iterations, and one that does not never pays for it.  Once compiled it stays compiled.  The rule is also
applied *during* an eager iteration: the eager units (a NUTS subtree, a leapfrog step) are
:func:`interruptible`, and once the iteration has run so long that the rule would compile after it
whatever it still costs, it is abandoned and run again compiled, with the same random draws (the
generators among its arguments restored) — so a fit whose first iteration builds a deep eager tree
(the tiny benchmark model: 1 000 leapfrog steps, 1.5 s) loses 0.1 s, not the whole iteration.

:func:`compile_blocker` names what stops a network's potential from compiling at all (a
recurrent layer, or a network evaluated draw by draw without ``vmap``), so that such a model
runs eagerly from the start instead of paying for a failed attempt.

:func:`warm_cpu_compiler` takes the part of a CPU compile that does not depend on the model off the
critical path: inductor's first compile in a process detects the CPU's vector instruction sets by
building and loading a test library per set (three C++ compiles and three child processes: 5.8 s
with an empty inductor cache, 1.0 s with a filled one, on the development machine).  Started in a
background thread when a compilable sampler is built — before its MAP start — that work runs in
child processes on another core while the start and the first eager iterations go on (docs/mcmc.md,
"Cold start").
"""
from __future__ import annotations

import statistics
import threading
import time
import warnings
from collections import deque
from typing import Callable, Optional

import torch
from torch import nn
from zoo.progress import tqdm

from inference.mcmc.budget import WINDOW, Forecast

__all__ = ["COMPILE_MODES", "COLD_COMPILE_SECONDS", "COMPILED_COST_FRACTION", "EagerOverBudget", "LazyCompile",
           "compile_blocker", "eager_budget", "interruptible", "should_compile", "unit_key", "warm_cpu_compiler"]

#: ``compile`` options of the HMC / NUTS backends
COMPILE_MODES = (True, False, "auto")
#: first compile of a NUTS subtree / HMC leapfrog step in a fresh process with an empty inductor
#: cache, 2-core development machine (docs/mcmc.md): 8-14 s idle, 15-25 s under load
COLD_COMPILE_SECONDS = 15.0
#: compiled ÷ eager cost per iteration assumed by the forecast (measured 0.1-0.2 on the benchmark
#: models; the larger value makes the rule wait a little longer before compiling)
COMPILED_COST_FRACTION = 0.25

_measured: dict = {}  # compiled unit's key -> seconds its first compiled call took in this process
_warming: list = []  # the one background thread of warm_cpu_compiler, once started
_deadline = threading.local()  # .at: the thread CPU time past which the running eager iteration gives way
_ABANDONED = object()  # what LazyCompile._eager returns for an iteration it gave up


class EagerOverBudget(Exception):
    """An eager iteration ran past the time at which compiling pays (raised by an :func:`interruptible` unit)."""


def interruptible(unit: Callable) -> Callable:
    """``unit`` (an eager NUTS subtree or leapfrog step) that first checks the deadline :class:`LazyCompile` sets
    for an eager iteration, raising :class:`EagerOverBudget` past it; outside such an iteration it only calls
    ``unit``."""

    def call(*args):
        at = getattr(_deadline, "at", None)
        if at is not None and time.thread_time() > at:
            raise EagerOverBudget
        return unit(*args)

    return call


def _detect_vector_isa(valid_vec_isa_list: Callable) -> None:
    try:
        valid_vec_isa_list()  # functools.cache: the compile that needs it later reads the result
    except Exception:  # noqa: BLE001 - a warm-up only: the compile itself detects again and reports
        pass


def warm_cpu_compiler() -> Optional[threading.Thread]:
    """Start inductor's detection of the CPU's vector instruction sets in a daemon thread, once per process.

    The detection is what torch's own first CPU compile runs (``torch._inductor.cpu_vec_isa.valid_vec_isa_list``,
    cached for the process), with the same configuration: nothing is set or changed, the work only starts
    earlier, and it is mostly child processes (the C++ compiler and a loader per instruction set), which the
    GIL does not hold back.  Returns the thread (already started, or started earlier in this process), or
    ``None`` where torch's inductor cannot be imported (the compile then fails and the sampler runs eagerly).
    """
    if not _warming:
        # every module the detection imports, imported here in the calling thread: an import in the thread
        # racing the caller's own imports of torch._dynamo would meet a partially initialised module
        try:
            import torch._inductor.codecache  # noqa: F401
            import torch._inductor.cpp_builder  # noqa: F401
            import torch.utils.cpp_extension  # noqa: F401
            import torch.utils.file_baton  # noqa: F401
            from torch._inductor.cpu_vec_isa import valid_vec_isa_list
        except Exception:  # noqa: BLE001 - a torch without them: no warm-up; compiled() reports a failed compile
            return None

        thread = threading.Thread(target=_detect_vector_isa, args=(valid_vec_isa_list,), name="inductor-isa-detection",
                                  daemon=True)
        thread.start()
        _warming.append(thread)
    return _warming[0]


def compile_blocker(bnn, head: Optional[str] = None) -> Optional[str]:
    """Why ``torch.compile`` cannot compile the potential of ``bnn``, or ``None``.

    Recurrent modules (``nn.RNNBase``: GRU, LSTM, RNN) are not traced by dynamo and have no ``vmap``
    batching rule; a network that :meth:`~zoo.bnn.BayesianNetwork.check_forward` found ``vmap`` cannot
    batch is evaluated draw by draw, a Python loop that cannot go inside the compiled ``while_loop``.
    With ``head`` (the sampled output module evaluated on cached features, :mod:`inference.optim.output_head`)
    only that module is compiled, and the body does not matter.
    """
    if head is not None:
        return None
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


def eager_budget(eager_seconds: float, done: int, total: int, compile_seconds: float) -> Optional[float]:
    """The eager seconds the next iteration may take before :func:`should_compile` holds after it, whatever
    it costs beyond them: ``compile_seconds·(done + 1) / ((1 − f)·(total − done − 1)) − eager_seconds`` (at
    least 0), or ``None`` when no iteration would remain to profit."""
    remaining = total - done - 1
    if remaining <= 0:
        return None
    return max(0.0, compile_seconds * (done + 1) / ((1 - COMPILED_COST_FRACTION) * remaining) - eager_seconds)


class LazyCompile:
    """A transition ``(state, *args) -> (state, info)`` that runs eagerly until compiling pays.

    Args:
        build: ``build(compile: bool) -> transition``, called once with ``False`` and at most once
            with ``True`` (when the rule says so); the eager transition's units should be
            :func:`interruptible`, so that an eager iteration past its :func:`eager_budget` gives way.
        mode: ``"auto"`` (the rule of :func:`should_compile`), ``True`` (compiled from the first
            iteration) or ``False`` (never).
        total: the iterations the sampler will run (warm-up and sampling).
        key: names the compiled unit and its input shapes; compile times are remembered per key
            for later fits in this process.
        blocker: :func:`compile_blocker`'s reason, or ``None``; with a reason the transition stays
            eager (with a ``RuntimeWarning`` when ``mode`` is ``True``).
        progress, desc: a ``zoo.progress.tqdm`` bar while the first compiled call runs.
        device: the device the transition runs on; on a CPU an enabled transition starts
            :func:`warm_cpu_compiler` (build the transition before the sampler's start to gain most).

    After the run, :attr:`record` holds ``compile`` (the mode), ``compiled_from`` (the first
    compiled iteration or ``None``), ``compile_seconds`` (that call's wall time),
    ``compile_skipped`` (the blocker, if any) and ``eager_abandoned`` (the iteration whose eager run was
    abandoned for the compiled one, or ``None``).  :meth:`forecast` gives the cost of the remaining
    iterations (for :func:`inference.mcmc.budget.time_budget`).
    """

    def __init__(self, build: Callable[[bool], Callable], mode, total: int, key: tuple, blocker: Optional[str] = None,
                 progress: bool = False, desc: str = "compiling", device=None):
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile must be true, false or 'auto', got {mode!r}")
        if blocker is not None and mode is True:
            warnings.warn(f"compile=True, but {blocker}: running without compilation", RuntimeWarning, stacklevel=3)
        self.build, self.total, self.key, self.progress, self.desc = build, total, key, progress, desc
        self.enabled = mode is not False and blocker is None
        self.record = {"compile": mode, "compiled_from": None, "compile_seconds": None, "compile_skipped": blocker,
                       "eager_abandoned": None}
        self.eager = build(False)
        self.compiled = None
        if self.enabled and device is not None and torch.device(device).type == "cpu":
            warm_cpu_compiler()
        self.done, self.eager_seconds = 0, 0.0
        self._recent = deque(maxlen=WINDOW)  # seconds of the recent calls in the current mode (no compile call)
        if self.enabled and mode is True:
            self._switch()

    def _switch(self) -> None:
        self.compiled = self.build(True)
        self.record["compiled_from"] = self.done
        self._recent.clear()

    def forecast(self, measured: Optional[float] = None) -> Optional[Forecast]:
        """The cost of the iterations still to run (``measured``, the caller's own rate, is not used: the
        calls are timed here, per mode), or ``None`` before a call has been timed in the current mode.

        Compiled: the median of the recent compiled calls (the first, which compiled, left out).  Eager
        with compilation possible: what :func:`should_compile` would choose for the remaining iterations —
        the compiled rate (:data:`COMPILED_COST_FRACTION` of the eager median) and the expected compile
        time when compiling pays, else the eager median.  Eager only: the eager median."""
        if not self._recent:
            return None
        rate = statistics.median(self._recent)
        remaining = self.total - self.done
        if self.compiled is None and self.enabled and remaining * rate * (1 - COMPILED_COST_FRACTION) > self._compile_seconds():
            return Forecast(rate * COMPILED_COST_FRACTION, self._compile_seconds())
        return Forecast(rate)

    def __call__(self, state, *args):
        if self.compiled is None:
            began = time.perf_counter()
            out = self._eager(state, args)
            if out is not _ABANDONED:
                self._recent.append(time.perf_counter() - began)
                self.done += 1
                if self.enabled and should_compile(self.eager_seconds, self.done, self.total, self._compile_seconds()):
                    self._switch()
                return out
        if self.record["compile_seconds"] is None:
            bar = tqdm(total=1, desc=self.desc, disable=not self.progress, leave=False)
            started = time.perf_counter()
            out = self.compiled(state, *args)
            self.record["compile_seconds"] = _measured[self.key] = time.perf_counter() - started
            bar.update(1)
            bar.close()
        else:
            began = time.perf_counter()
            out = self.compiled(state, *args)
            self._recent.append(time.perf_counter() - began)
        self.done += 1
        return out

    def _compile_seconds(self) -> float:
        return _measured.get(self.key, COLD_COMPILE_SECONDS)

    def _eager(self, state, args: tuple):
        """The eager iteration's output, or ``_ABANDONED`` when it was abandoned past its :func:`eager_budget` (the
        transition then compiled and the generators among ``args`` back at their states before it)."""
        budget = eager_budget(self.eager_seconds, self.done, self.total, self._compile_seconds()) if self.enabled else None
        generators = [arg for arg in args if isinstance(arg, torch.Generator)]
        saved = [generator.get_state() for generator in generators]
        started = time.thread_time()  # CPU seconds: other jobs on the machine do not make an iteration look costly
        _deadline.at = None if budget is None else started + budget
        try:
            out = self.eager(state, *args)
        except EagerOverBudget:
            for generator, generator_state in zip(generators, saved):
                generator.set_state(generator_state)
            self.record["eager_abandoned"] = self.done
            self._switch()
            return _ABANDONED
        finally:
            _deadline.at = None
            self.eager_seconds += time.thread_time() - started
        return out


def unit_key(kind: str, potential, num_chains: int, *extra) -> tuple:
    """The key :class:`LazyCompile` remembers compile times under: the unit, the network's class, the
    sizes and the dtype/device of ``potential``."""
    like = potential.bnn.target_scale
    return (kind, type(potential.bnn.net).__name__, potential.dim, num_chains, potential.num_data, like.dtype,
            str(like.device), *extra)
