"""A sampler's time budget: project the whole fit's wall time from its first iterations, stop early past it.

A sampler's cost is set by the problem (dimension, data size, the posterior's conditioning: a NUTS
trajectory takes up to 2^max_tree_depth − 1 gradients), so a default run can take seconds or hours.
:func:`time_budget` is a monitor of :func:`inference.mcmc.driver.run_chains`: after every iteration
it projects the fit's total wall time,

    T̂ = elapsed + pending + (remaining iterations) · (seconds per iteration),

from the recent iterations, and raises :class:`TimeBudgetExceeded` — with the projection and what to
change — as soon as T̂ exceeds the budget, instead of letting the fit run on; unless what is left,
T̂ − elapsed, is under :data:`MIN_SAVING` of the budget: stopping then would save little of what
is already spent (a start or a compile slowed down by other jobs, say).  ``elapsed`` counts from
the fit's start (its MAP start included); the rate is the median of the last :data:`WINDOW`
iterations timed in one mode, or a :class:`Forecast` that the transition gives (a sampler that is still
eager but will compile: the compiled rate and the compile still to pay, see
:meth:`inference.mcmc.compilation.LazyCompile.forecast`).  The projection stops a fit from
:data:`MIN_ITERATIONS` iterations on (from the first when it is :data:`CLEARLY_OVER` the budget: a fit
whose first iteration already takes tens of seconds), and only while the cost per iteration may
still change (during warm-up, where the step size and metric adapt, and the first :data:`WINDOW`
iterations after it); a fit that passes those checks runs to its end.

The MAP start (:func:`inference.optim.start.initial_point`) comes before the first iteration and can
itself take minutes on a large network (a 64-2048-2048-10 tanh MLP on digits' 1 347 rows: 0.23 s per step,
2 000 steps), so it is projected too (:func:`start_budget`): each of its MAP runs is a run of
:func:`time_budget` over its Adam steps, every step after the first (which pays one-off costs) checked,

    T̂ = elapsed + (the start's remaining steps) · (seconds per step) + (the sampler's least cost),

the sampler's least cost (``pending``) estimated from the same step time: its fewest gradient
evaluations (NUTS one per iteration, HMC ``num_steps``, SG-MCMC one per step) each costing at least a
MAP step's time scaled by min(1, its rows / the step's rows) — a gradient's cost grows with its rows,
affinely — and by :data:`~inference.mcmc.compilation.COMPILED_COST_FRACTION` where the transition may be
compiled; zero when the sampler's gradients run the output module on cached features (a MAP step runs
the whole network; on the small regressions tried, the sampler took 2.3–400 times this bound).  A held-out choice of the start's epochs counts its trial for the fewest epochs it
can run and the refit for one epoch (:func:`inference.optim.start.held_out_trial`); the refit is then
projected exactly.  So T̂ is a lower bound up to the timing, and the stop (the same rule:
:data:`CLEARLY_OVER`, :data:`MIN_SAVING`) raises :class:`TimeBudgetExceeded` with ``stage="start"`` and
:func:`start_advice` (fewer ``map_steps``, ``init='current'``, ``stochastic='last'``).

* :class:`Forecast` — seconds per remaining iteration and seconds still to pay once;
* :func:`projected_seconds` — the projection T̂ (a pure function);
* :func:`time_budget` — ``Monitor(init, update)`` over :class:`BudgetState`;
* :class:`TimeBudgetExceeded` — the exception, carrying the projection and the advice;
* :func:`sampler_advice` — the options that would bring such a fit within the budget;
* :func:`start_budget` / :func:`start_advice` — the same over the MAP start's steps, and what to change;
* :func:`duration` — seconds as ``"1 h 37 min"``.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, NamedTuple, Optional

__all__ = ["DEFAULT_TIME_BUDGET", "MIN_ITERATIONS", "CLEARLY_OVER", "WINDOW", "MIN_SAVING", "Forecast", "Projection", "BudgetState", "Monitor",
           "TimeBudgetExceeded", "projected_seconds", "time_budget", "duration", "sampler_advice", "StartClock",
           "start_budget", "start_advice"]

#: seconds a sampler's default fit may take (``time_budget``): the ``fit(bnn, x, y, backend=B)`` of a
#: new user should answer in about a minute on 2 CPU cores; a fit projected past this stops early
DEFAULT_TIME_BUDGET = 120.0
#: iterations before a projection stops a fit, unless it is :data:`CLEARLY_OVER` the budget sooner
MIN_ITERATIONS = 3
#: a projection this many times the budget stops a fit from its first timed iteration on
CLEARLY_OVER = 2.0
#: recent iterations whose median time is the rate
WINDOW = 10
#: a fit past its budget is stopped only when what is left to run is at least this share of the budget
MIN_SAVING = 0.25


class Forecast(NamedTuple):
    """The cost of the iterations still to run: ``seconds_per_iteration`` and ``pending_seconds``
    paid once (e.g. a compile that has not happened yet)."""

    seconds_per_iteration: float
    pending_seconds: float = 0.0


class Projection(NamedTuple):
    """What a projection saw: the fit's ``elapsed`` and ``projected`` seconds (T̂), the ``budget``, the
    iterations ``done`` of ``total``, the ``rate`` used (seconds per iteration), ``setup`` (the elapsed
    seconds outside the iterations: the start, the set-up), ``info``, the means over the recent
    iterations of the transition's statistics (e.g. ``n_steps``, ``tree_depth``), ``pending`` (the
    forecast's seconds still to pay once: a compile; the sampler's least cost after a MAP start) and
    ``stage`` (``"sampler"``, or ``"start"``: the iterations are the MAP start's Adam steps after the first of
    its run, which is not timed, :class:`StartClock`)."""

    elapsed: float
    projected: float
    budget: float
    done: int
    total: int
    rate: float
    setup: float
    info: dict
    pending: float = 0.0
    stage: str = "sampler"

    @property
    def affordable(self) -> float:
        """Iterations a fit of the same set-up could run within the budget at this rate:
        (budget − setup) / rate (0 when the set-up alone is past the budget)."""
        return max(0.0, (self.budget - self.setup) / self.rate) if self.rate > 0 else float("inf")


class BudgetState(NamedTuple):
    """Iterations ``done``, their wall seconds ``spent``, the ``recent`` iteration seconds and the means of
    their statistics."""

    done: int
    spent: float
    recent: tuple
    recent_info: tuple


class Monitor(NamedTuple):
    """``init() -> state``; ``update(state, seconds, info) -> state`` after each iteration (may raise)."""

    init: Callable
    update: Callable


def duration(seconds: float) -> str:
    """``seconds`` for a person: ``"45 s"``, ``"12 min"``, ``"1 h 37 min"``."""
    seconds = max(0.0, float(seconds))
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def projected_seconds(elapsed: float, remaining: int, forecast: Forecast) -> float:
    """T̂ = ``elapsed`` + pending + ``remaining`` · seconds per iteration."""
    return float(elapsed) + forecast.pending_seconds + max(0, int(remaining)) * forecast.seconds_per_iteration


class TimeBudgetExceeded(RuntimeError):
    """A sampler stopped early: its projected wall time is past ``time_budget``.

    Raised by every chain-based backend (``hmc``, ``nuts``, ``sgld``, ``psgld``, ``sghmc``, ``csgmcmc``)
    within its MAP start's first steps or its first iterations (docs/mcmc.md, "Time budget"); nothing is returned.  The first line of
    the message holds the projection and what to change.

    Attributes:
        backend: the backend's name.
        projection: the :class:`Projection` that stopped it (``projected``, ``elapsed``, ``budget``,
            ``done``, ``total`` …).
        advice: the options that would bring the fit within the budget, each as a short phrase.
    """

    def __init__(self, backend: str, projection: Projection, advice: list):
        self.backend, self.projection, self.advice = backend, projection, list(advice)
        p = projection
        changes = "; ".join([*self.advice, "or pass time_budget=None to run it anyway"])
        if p.stage == "start":
            sampler = (f"at least {duration(p.pending)} for the sampler" if p.pending > 0
                       else "the sampler's time after it")
            steps = f"{p.done + 1} Adam steps"  # the run's first step, untimed (StartClock), and those timed
            head = (f"{backend}: stopped early in its MAP start, after {steps} ({duration(p.elapsed)}): the "
                    f"fit would take at least {duration(p.projected)} in all (about "
                    f"{duration(p.projected - p.elapsed - p.pending)} more for the start at {p.rate:.3g} s per step, "
                    f"then {sampler})")
        else:
            head = (f"{backend}: stopped early after {p.done} of {p.total} iterations ({duration(p.elapsed)}): the fit "
                    f"would take about {duration(p.projected)} in all ({p.rate:.3g} s per iteration)")
        super().__init__(f"{head}, past time_budget={p.budget:g} s. To fit within it: {changes}")

    def __reduce__(self):  # picklable across worker processes
        return type(self), (self.backend, self.projection, self.advice)


def time_budget(
    budget: float,
    total: int,
    started: float,
    *,
    name: str,
    advise: Callable[[Projection], list],
    check_until: int,
    forecast: Optional[Callable[[Optional[float]], Optional[Forecast]]] = None,
    clock: Callable[[], float] = time.perf_counter,
    stage: str = "sampler",
) -> Monitor:
    """The monitor that stops a run of ``total`` iterations projected past ``budget`` seconds.

    Args:
        budget: seconds the whole fit may take (from ``started``, a ``clock()`` time).
        total: the run's iterations.
        name: the backend, for the message.
        advise: ``advise(projection) -> [phrase, ...]``, the options that would fit the budget.
        check_until: iterations after which no projection is made (the cost per iteration no longer
            changes).
        forecast: ``forecast(measured) -> Forecast`` or ``None`` (no iteration timed in the current mode
            yet), where ``measured`` is the median of the recent iteration seconds (before
            :data:`MIN_ITERATIONS`, the shortest); without it the forecast is ``Forecast(measured)``.
        clock: the wall clock (seconds).
        stage: what the iterations are, for the :class:`Projection` (``"start"``: a MAP start's steps,
            :func:`start_budget`).

    ``update(state, seconds, info)`` takes the iteration's wall ``seconds`` and the transition's ``info``
    (``{name: [C] tensor}``; the means of ``n_steps`` and ``tree_depth`` are kept for the advice) and
    raises :class:`TimeBudgetExceeded` when T̂ > ``budget`` (from :data:`MIN_ITERATIONS` iterations on; before,
    when T̂ > :data:`CLEARLY_OVER` · ``budget``) and T̂ − elapsed ≥ :data:`MIN_SAVING` · ``budget``.
    """
    budget = float(budget)

    def init() -> BudgetState:
        return BudgetState(0, 0.0, (), ())

    def update(state: BudgetState, seconds: float, info: dict) -> BudgetState:
        done = state.done + 1
        summary = {key: float(info[key].float().mean()) for key in ("n_steps", "tree_depth") if key in info}
        state = BudgetState(done, state.spent + float(seconds), (*state.recent, float(seconds))[-WINDOW:],
                            (*state.recent_info, summary)[-WINDOW:])
        if done > check_until or done >= total:
            return state
        early = done < MIN_ITERATIONS  # few iterations: the fastest of them, so one slow start does not stop a fit
        measured = min(state.recent) if early else statistics.median(state.recent)
        expected = forecast(measured) if forecast is not None else Forecast(measured)
        if expected is None:
            return state
        elapsed = clock() - started
        projected = projected_seconds(elapsed, total - done, expected)
        limit = CLEARLY_OVER * budget if early else budget
        if projected > limit and projected - elapsed >= MIN_SAVING * budget:
            keys = {key for summary in state.recent_info for key in summary}
            means = {key: statistics.fmean(s[key] for s in state.recent_info if key in s) for key in keys}
            projection = Projection(elapsed, projected, budget, done, total, expected.seconds_per_iteration,
                                    max(0.0, elapsed - state.spent), means, expected.pending_seconds, stage)
            raise TimeBudgetExceeded(name, projection, advise(projection))
        return state

    return Monitor(init, update)


def sampler_advice(projection: Projection, *, counts: dict, num_chains: int, dim: int, last_dim: Optional[int],
                   max_tree_depth: Optional[int] = None, num_steps: Optional[int] = None, minimum: int = 100) -> list:
    """What to change so that a fit like this one fits its budget, as option phrases.

    Args:
        projection: the projection that stopped it; ``projection.affordable`` iterations fit the budget.
        counts: the options that set the number of iterations and are scaled down together
            (``{"warmup_steps": 200, "num_samples": 200}``); suggested when the scaled run keeps at least
            ``minimum`` iterations (fewer would not be worth drawing).
        num_chains: the chains (on a CPU the cost per iteration grows about linearly with them).
        dim / last_dim: the random values sampled now, and with ``stochastic="last"`` (``None``: not known).
        max_tree_depth: NUTS's cap, suggested lower when the recent trees reach it (``info["tree_depth"]``).
        num_steps: static HMC's leapfrog steps, suggested lower in proportion.
    """
    share = projection.affordable / max(projection.total, 1)  # of the iterations that fit
    advice = []
    if last_dim is not None and last_dim < dim:
        advice.append(f"stochastic='last' ({last_dim} random values instead of {dim})")
    if num_chains > 2:
        advice.append(f"num_chains=2 (now {num_chains}; about {2 / num_chains:.0%} of the cost per iteration on a CPU)")
    depth, steps = projection.info.get("tree_depth"), projection.info.get("n_steps")
    if max_tree_depth is not None and depth is not None and steps is not None and depth >= max_tree_depth - 0.5:
        fitting = int(math.log2(max(steps * share, 1.0) + 1))
        lower = max(3, min(max_tree_depth - 1, fitting))
        advice.append(f"max_tree_depth={lower} (now {max_tree_depth}: the trees reach it, {steps:.0f} leapfrog steps per "
                      f"iteration; at most {2 ** lower - 1} then, so each draw moves less far)")
    if num_steps is not None and num_steps > 1 and share < 1:
        advice.append(f"num_steps={max(1, int(num_steps * share))} (now {num_steps} leapfrog steps per iteration)")
    if 0 < share < 1 and sum(counts.values()) * share >= minimum:
        scaled = ", ".join(f"{key}={max(1, int(value * share))}" for key, value in counts.items())
        advice.append(f"{scaled} (fewer iterations: about {projection.affordable:.0f} fit at this rate)")
    return advice


class StartClock:
    """The ``on_step`` of one MAP run of a start (:func:`start_budget`): times each Adam step on ``clock`` and feeds
    it to its :attr:`monitor` (a :func:`time_budget` whose clock is :meth:`reading`, the time of the last step)
    until ``check_until`` steps; after them it does nothing.  The run's first step is set-up, not a rate: it pays
    one-off costs (in a fresh process the first step of the first fit took 2 s, the next ones 6 ms), so it is not
    fed to the monitor, whose ``check_until`` and ``total`` are the steps after it."""

    def __init__(self, clock: Callable[[], float], check_until: int):
        self.clock, self.check_until, self.now = clock, check_until, clock()
        self.monitor: Optional[Monitor] = None
        self.state: Optional[BudgetState] = None
        self.first = True

    def reading(self) -> float:
        """The clock's time at the end of the last step (the run's start before the first)."""
        return self.now

    def watching(self, monitor: Monitor) -> "StartClock":
        """This clock feeding ``monitor``."""
        self.monitor, self.state = monitor, monitor.init()
        return self

    def __call__(self) -> None:
        if self.state.done >= self.check_until:
            return
        now = self.clock()
        seconds, self.now = now - self.now, now
        if self.first:
            self.first = False
            return
        self.state = self.monitor.update(self.state, seconds, {})


def start_budget(
    budget: float,
    started: float,
    *,
    name: str,
    sampler_gradients: float,
    gradient_rows: Optional[int],
    advise: Callable[[Projection], list],
    clock: Callable[[], float] = time.perf_counter,
) -> Callable:
    """The ``watch`` of :func:`inference.optim.start.initial_point` that stops a MAP start projected past ``budget``.

    Args:
        budget, started, name, advise, clock: as for :func:`time_budget` (``started``: the fit's start).
        sampler_gradients: the sampler's fewest gradient evaluations, each counted at a MAP step's time (already
            scaled by the compiled fraction where it may compile; 0: not estimated — gradients on cached
            features).
        gradient_rows: rows per sampler gradient (``None``: as many as a MAP step's); a gradient on fewer rows
            than a MAP step's is counted at min(1, rows / step rows) of its time.

    ``watch(run) -> on_step`` for each MAP run (a :class:`~inference.optim.start.StartRun`: ``steps``,
    ``later_steps``, ``batch_rows``) is a :class:`StartClock` over a :func:`time_budget` of the run's steps after
    its first and ``run.later_steps``, checked over the run's, whose forecast adds the sampler's least cost as
    ``pending``: T̂ = elapsed + (remaining steps) · rate + sampler_gradients · scale · rate (module docstring).
    """

    def watch(run) -> StartClock:
        scale = 1.0
        if gradient_rows is not None and run.batch_rows is not None:
            scale = min(1.0, gradient_rows / run.batch_rows)
        least = sampler_gradients * scale  # the sampler's least cost in MAP steps
        timed = max(run.steps - 1, 0)  # the steps after the first (StartClock)
        steps = StartClock(clock, timed)
        return steps.watching(time_budget(
            budget, timed + run.later_steps, started, name=name, advise=advise, check_until=timed,
            forecast=lambda rate: Forecast(rate, least * rate), clock=steps.reading, stage="start"))

    return watch


def start_advice(projection: Projection, *, map_steps: int, dim: int, last_dim: Optional[int]) -> list:
    """What to change so that a fit whose MAP start was projected past its budget fits it, as option phrases:
    ``map_steps`` scaled to the share of the start's projected cost that fits (what is left of the budget after
    the set-up and the sampler's least cost), ``init='current'`` (no MAP start) and, when the sampler's least
    cost counts, ``stochastic='last'`` (``last_dim`` random values instead of ``dim``)."""
    p = projection
    start = p.projected - p.setup - p.pending  # this run's steps and the start's after it
    room = p.budget - p.setup - p.pending
    advice = []
    if 0 < room < start and int(map_steps * room / start) >= 1:
        advice.append(f"map_steps={int(map_steps * room / start)} (now {map_steps}; {p.rate:.3g} s per Adam step of "
                      f"the MAP start)")
    advice.append("init='current' (no MAP start: the chains start from the network's weights as they are, e.g. a "
                  "network you trained)")
    if p.pending > 0 and last_dim is not None and last_dim < dim:
        advice.append(f"stochastic='last' ({last_dim} random values instead of {dim}: the sampler then runs the output "
                      f"layer on cached features)")
    return advice
