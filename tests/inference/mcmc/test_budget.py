"""The samplers' time budget (inference/mcmc/budget.py): the projection, the stop, the advice, the backends."""
from __future__ import annotations

import pickle
import time

import pytest
import torch

from tests.inference.conftest import make_conjugate_regression
from tests.inference.mcmc.test_hmc import FAST as NO_BUDGET, busy, linear_bnn

FAST = {k: v for k, v in NO_BUDGET.items() if k != "time_budget"}
from inference import TimeBudgetExceeded, fit
from inference.mcmc.budget import (
    MIN_ITERATIONS, WINDOW, Forecast, Projection, duration, projected_seconds, sampler_advice, start_advice,
    start_budget, time_budget,
)  # fmt: skip
from inference.optim.start import StartRun
from inference.mcmc.compilation import COMPILED_COST_FRACTION, LazyCompile

INFO = {"n_steps": torch.tensor([1023.0, 1023.0]), "tree_depth": torch.tensor([10.0, 10.0])}


class Clock:
    """A wall clock that the test moves."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run(monitor, clock, seconds: list, info=INFO):
    """Feed ``seconds`` per iteration to ``monitor``, advancing ``clock``; the iterations done before it raised."""
    state = monitor.init()
    for k, s in enumerate(seconds):
        clock.now += s
        state = monitor.update(state, s, info)
    return state


def test_projection_is_elapsed_plus_pending_plus_the_remaining_iterations():
    assert projected_seconds(10.0, 100, Forecast(0.5, 3.0)) == 10.0 + 3.0 + 50.0
    assert projected_seconds(10.0, -5, Forecast(0.5)) == 10.0


@pytest.mark.parametrize("seconds, text", [(12.4, "12 s"), (720, "12 min"), (97 * 60, "1 h 37 min"), (-1, "0 s")])
def test_duration_reads_like_a_person_would_say_it(seconds, text):
    assert duration(seconds) == text


def test_the_budget_stops_a_run_projected_past_it_after_the_first_iterations():
    clock = Clock()
    clock.now = 20.0  # the start (MAP fit) took 20 s of the fit
    monitor = time_budget(120.0, 400, 0.0, name="nuts", advise=lambda p: ["fewer draws"], check_until=210, clock=clock)
    with pytest.raises(TimeBudgetExceeded) as caught:
        run(monitor, clock, [0.5] * 50)
    error = caught.value
    p = error.projection
    assert p.done == MIN_ITERATIONS  # 20 + 1.5 + 397 · 0.5 s > 120 s (but not twice that: no stop before 3)
    assert p.projected == pytest.approx(20.0 + 0.5 * MIN_ITERATIONS + (400 - MIN_ITERATIONS) * 0.5)
    assert p.setup == pytest.approx(20.0) and p.rate == 0.5 and p.info == {"n_steps": 1023.0, "tree_depth": 10.0}
    assert p.affordable == pytest.approx(200.0)
    message = str(error).splitlines()[0]  # the command line shows the first line only
    assert "nuts: stopped early after 3 of 400 iterations" in message and "4 min in all" in message
    assert "time_budget=120 s" in message and "fewer draws; or pass time_budget=None" in message
    assert pickle.loads(pickle.dumps(error)).projection == p  # crosses process boundaries intact


def test_a_run_within_its_budget_is_never_stopped_and_checks_end_after_check_until():
    clock = Clock()
    monitor = time_budget(100.0, 200, 0.0, name="hmc", advise=lambda p: [], check_until=20, clock=clock)
    state = run(monitor, clock, [0.1] * 100)  # 10 s projected at every check
    assert state.done == 100 and len(state.recent) == WINDOW and state.spent == pytest.approx(10.0)
    # slow iterations after the checks have ended do not stop it
    monitor = time_budget(100.0, 200, 0.0, name="hmc", advise=lambda p: [], check_until=20, clock=clock)
    run(monitor, clock, [0.1] * 20 + [10.0] * 30)


def test_a_first_iteration_clearly_over_the_budget_stops_the_fit_at_once():
    clock = Clock()
    monitor = time_budget(120.0, 400, 0.0, name="nuts", advise=lambda p: [], check_until=400, clock=clock)
    with pytest.raises(TimeBudgetExceeded, match="stopped early after 1 of 400"):
        run(monitor, clock, [15.0])  # 400 · 15 s: far past twice the budget
    monitor = time_budget(120.0, 400, 0.0, name="nuts", advise=lambda p: [], check_until=400, clock=clock)
    clock.now = 0.0
    with pytest.raises(TimeBudgetExceeded, match="stopped early after 3 of 400"):
        run(monitor, clock, [0.5] * 5)  # 200 s: past the budget, not twice it, so it waits for 3 iterations


def test_a_run_with_little_left_to_run_is_not_stopped_for_what_is_already_spent():
    clock = Clock()
    clock.now = 110.0  # a start slowed down by other jobs
    monitor = time_budget(120.0, 400, 0.0, name="hmc", advise=lambda p: [], check_until=400, clock=clock)
    run(monitor, clock, [0.05] * 400)  # 110 + 20 s > 120 s, but only 20 s < 30 s would be saved
    clock.now = 110.0
    monitor = time_budget(120.0, 400, 0.0, name="hmc", advise=lambda p: [], check_until=400, clock=clock)
    with pytest.raises(TimeBudgetExceeded):
        run(monitor, clock, [0.1] * 400)  # 40 s left: worth stopping


def test_the_median_of_the_recent_iterations_ignores_one_slow_compile():
    clock = Clock()
    monitor = time_budget(100.0, 400, 0.0, name="nuts", advise=lambda p: [], check_until=400, clock=clock)
    run(monitor, clock, [0.1, 30.0, 0.1, 0.1, 0.1])  # 30 s + 395 · 0.1 s < 100 s


def test_the_forecast_of_the_transition_replaces_the_measured_rate():
    clock = Clock()
    seen = []

    def forecast(measured):
        seen.append(measured)
        return None if len(seen) < 2 else Forecast(measured * 0.25, 15.0)  # none after the first iteration

    monitor = time_budget(100.0, 400, 0.0, name="nuts", advise=lambda p: [], check_until=400, forecast=forecast,
                          clock=clock)
    run(monitor, clock, [0.5] * 5)  # measured 0.5 s; compiled 0.125 s · 395 + 15 s + 2.5 s < 100 s
    assert seen == [0.5] * 5
    seen.clear()
    monitor = time_budget(50.0, 400, 0.0, name="nuts", advise=lambda p: [], check_until=400, forecast=forecast,
                          clock=clock)
    with pytest.raises(TimeBudgetExceeded, match="stopped early after 3 of 400"):
        run(monitor, clock, [0.5] * 5)


def projection(rate=1.0, budget=120.0, setup=20.0, total=400, **info):
    return Projection(setup + 3 * rate, setup + total * rate, budget, 3, total, rate, setup, info)


def test_advice_names_what_brings_the_fit_within_the_budget():
    p = projection(rate=0.2, total=800, n_steps=1023.0, tree_depth=10.0)  # 500 of 800 iterations fit; NUTS at its cap
    advice = sampler_advice(p, counts={"warmup_steps": 400, "num_samples": 400}, num_chains=4, dim=1154, last_dim=34,
                            max_tree_depth=10)
    assert advice[0] == "stochastic='last' (34 random values instead of 1154)"
    assert advice[1].startswith("num_chains=2 (now 4")
    assert advice[2].startswith("max_tree_depth=9 (now 10: the trees reach it, 1023 leapfrog steps per iteration")
    assert advice[3].startswith("warmup_steps=250, num_samples=250 (fewer iterations: about 500 fit")
    # nothing to suggest that is not already so: last layer, 2 chains, trees below the cap, too few iterations left
    few = projection(rate=10.0, n_steps=31.0, tree_depth=5.0)
    assert sampler_advice(few, counts={"warmup_steps": 200, "num_samples": 200}, num_chains=2, dim=34, last_dim=34,
                          max_tree_depth=10) == []
    hmc = sampler_advice(projection(rate=0.5), counts={"warmup_steps": 200, "num_samples": 200}, num_chains=2, dim=10,
                         last_dim=None, num_steps=16)
    assert hmc[0] == "num_steps=8 (now 16 leapfrog steps per iteration)"


def test_lazy_compile_forecasts_the_compiled_rate_and_the_compile_to_come():
    calls = []

    def build(compile):
        def transition(state):
            calls.append(compile)
            busy(0.002 if compile else 0.02)
            return state
        return transition

    lazy = LazyCompile(build, "auto", total=10**6, key=("test-forecast",))
    assert lazy.forecast() is None  # nothing timed yet
    lazy._switch = lambda: None  # stay eager: look at the forecast of the eager phase
    lazy(0)
    forecast = lazy.forecast()
    assert forecast.pending_seconds == 15.0  # COLD_COMPILE_SECONDS: compiling would pay for a million iterations
    assert forecast.seconds_per_iteration == pytest.approx(lazy._recent[0] * COMPILED_COST_FRACTION)
    eager_only = LazyCompile(build, False, total=10**6, key=("test-forecast",))
    eager_only(0)
    assert eager_only.forecast().pending_seconds == 0.0
    compiled = LazyCompile(build, True, total=10, key=("test-forecast",))
    compiled(0)  # the first compiled call compiles: not timed for the rate
    assert compiled.forecast() is None
    compiled(0)
    assert compiled.forecast() == Forecast(compiled._recent[0])


@pytest.mark.parametrize("backend, options", [
    ("nuts", {"warmup_steps": 5000, "num_samples": 5000, **FAST}),
    ("hmc", {"warmup_steps": 5000, "num_samples": 5000, "num_steps": 50, **FAST}),
    ("sgld", {"warmup_steps": 10**6, "num_samples": 100, "init": "current"}),
    ("csgmcmc", {"num_samples": 10**5, "num_cycles": 1, "init": "current"}),
])
def test_every_sampler_stops_early_past_its_budget_with_the_projection_and_advice(backend, options):
    data = make_conjugate_regression()
    started = time.perf_counter()
    with pytest.raises(TimeBudgetExceeded) as caught:
        fit(linear_bnn(data), data.x, data.y, backend=backend, seed=0, progress=False, num_chains=4, time_budget=0.5,
            **options)
    assert time.perf_counter() - started < 30
    error = caught.value
    assert error.backend == backend and error.projection.projected > 0.5 and error.projection.budget == 0.5
    assert "num_chains=2" in str(error) and "time_budget=None" in str(error)


def test_time_budget_none_runs_to_the_end_and_bad_budgets_are_refused():
    data = make_conjugate_regression()
    post = fit(linear_bnn(data), data.x, data.y, backend="hmc", seed=0, progress=False, num_chains=2, warmup_steps=60,
               num_samples=20, time_budget=None, **FAST)
    assert post.info["config"]["time_budget"] is None
    for backend in ("nuts", "sgld"):
        for bad in (0.0, -1.0):
            with pytest.raises(ValueError, match="time_budget must be a positive number of seconds or None"):
                fit(linear_bnn(data), data.x, data.y, backend=backend, progress=False, time_budget=bad)


def test_the_command_line_prints_the_projection_and_exits_1(tmp_path, capsys):
    from lab.cli import main

    code = main(["fit", "--data", "toy1d", "--hidden", "4", "--backend", "hmc", "--chains", "4", "--warmup", "5000",
                 "--samples", "5000", "--option", "time_budget=0.5", "--option", "compile=false", "--option",
                 "init=\"current\"", "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("error: hmc: stopped early after")
    assert "time_budget=None" in err[0] and not (tmp_path / "run").exists()  # nothing half-written


def test_the_advice_counts_what_stochastic_last_would_sample():
    from torch import nn

    from inference.mcmc.chains import last_layer_dim
    from zoo import BayesianNetwork, GaussianLikelihood

    x = torch.randn(5, 1)
    net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    bnn = BayesianNetwork(net, "all", likelihood=GaussianLikelihood(learn_noise=True), example_input=x[:2])
    assert bnn.num_random == 1154 and last_layer_dim(bnn, x) == 33 + 1  # the output layer and the noise precision
    assert last_layer_dim(bnn, None) == 34  # without an example input: the last parametrised module registered


# ---------------------------------------------------------------------- the MAP start inside the projection
def steps(on_step, clock, seconds: float, count: int) -> int:
    """``count`` Adam steps of ``seconds`` each through ``on_step``, advancing ``clock``; the steps taken."""
    for k in range(count):
        clock.now += seconds
        on_step()
    return count


def test_a_map_start_projected_past_the_budget_stops_within_its_first_steps_with_the_advice():
    # 5 s of set-up, then a start of 1 000 steps of 0.1 s (100 s) and a sampler of at least 400 gradients on the
    # start's rows (40 s): 145 s > 120 s, not twice it, so it stops at the third timed step (the first is set-up: it
    # pays one-off costs), the advice in the message
    clock = Clock()
    clock.now = 5.0
    advise = lambda p: start_advice(p, map_steps=2000, dim=1154, last_dim=34)  # noqa: E731
    watch = start_budget(120.0, 0.0, name="nuts", sampler_gradients=400, gradient_rows=64, advise=advise, clock=clock)
    on_step = watch(StartRun("MAP start", 1000, 0, 64))
    with pytest.raises(TimeBudgetExceeded) as caught:
        steps(on_step, clock, 0.1, 1000)
    p = caught.value.projection
    assert p.stage == "start" and p.done == MIN_ITERATIONS and p.total == 999 and p.rate == pytest.approx(0.1)
    assert p.pending == pytest.approx(40.0) and p.setup == pytest.approx(5.1)
    assert p.projected == pytest.approx(5.4 + 996 * 0.1 + 40.0)
    message = str(caught.value)
    assert message.startswith("nuts: stopped early in its MAP start, after 4 Adam steps (5 s): the fit would take at "
                              "least 2 min in all (about 2 min more for the start at 0.1 s per step, then at least "
                              "40 s for the sampler), past time_budget=120 s. To fit within it: map_steps=1499")
    # the start's 99.9 s after its first step scaled to the 74.9 s that the set-up and the sampler leave: 1 499 of
    # its 2 000 steps
    assert caught.value.advice == [
        "map_steps=1499 (now 2000; 0.1 s per Adam step of the MAP start)",
        "init='current' (no MAP start: the chains start from the network's weights as they are, e.g. a network you "
        "trained)",
        "stochastic='last' (34 random values instead of 1154: the sampler then runs the output layer on cached "
        "features)"]
    assert pickle.loads(pickle.dumps(caught.value)).projection == p
    # a start clearly over the budget (1 000 steps of 1 s) stops at its first timed step
    clock.now = 5.0
    with pytest.raises(TimeBudgetExceeded, match="after 2 Adam steps"):
        steps(watch(StartRun("MAP start", 1000, 0, 64)), clock, 1.0, 1000)


def test_a_map_start_within_the_budget_runs_to_its_end_and_stops_checking_after_its_steps():
    clock = Clock()
    clock.now = 5.0  # 5 + 100 s of start, the sampler's cost not estimated (cached features): 105 s < 120 s
    watch = start_budget(120.0, 0.0, name="nuts", sampler_gradients=0.0, gradient_rows=64, advise=lambda p: [],
                         clock=clock)
    on_step = watch(StartRun("MAP start", 1000, 0, 64))
    assert steps(on_step, clock, 0.1, 1000) == 1000 and on_step.state.done == 999
    steps(on_step, clock, 10.0, 5)  # past the steps it announced: no more checks (and no more timing)
    assert on_step.state.done == 999
    # a sampler on fewer rows than a step's counts a share of the step: SG-MCMC's 1 000 steps on 16 of 64 rows
    # are 250 steps' time, 25 s: 130 s, past the budget
    clock.now = 5.0
    watch = start_budget(120.0, 0.0, name="sgld", sampler_gradients=1000, gradient_rows=16, advise=lambda p: [],
                         clock=clock)
    with pytest.raises(TimeBudgetExceeded) as caught:
        steps(watch(StartRun("MAP start", 1000, 0, 64)), clock, 0.1, 1000)
    assert caught.value.projection.pending == pytest.approx(25.0)
    # a held-out trial counts the fewest steps it takes and the refit's least after it, at the same rate
    clock.now = 5.0
    trial = watch(StartRun("MAP start (held-out epochs)", 200, 10, 64))
    with pytest.raises(TimeBudgetExceeded) as caught:
        steps(trial, clock, 0.5, 200)
    assert caught.value.projection.total == 199 + 10 and caught.value.projection.done == MIN_ITERATIONS


def test_start_advice_leaves_out_what_would_not_help():
    # the sampler's least cost alone fills the budget: no map_steps; none estimated: no stochastic='last'
    over = Projection(10.0, 300.0, 120.0, 3, 1000, 0.1, 5.0, {}, 200.0, "start")
    assert [a.split(" ")[0] for a in start_advice(over, map_steps=2000, dim=100, last_dim=10)] == [
        "init='current'", "stochastic='last'"]
    cached = Projection(10.0, 300.0, 120.0, 3, 1000, 0.1, 5.0, {}, 0.0, "start")
    assert [a.split(" ")[0] for a in start_advice(cached, map_steps=2000, dim=100, last_dim=10)] == [
        "map_steps=779", "init='current'"]  # 2 000 · 115 / 295 = 779.7


@pytest.mark.parametrize("backend, options", [
    ("nuts", {"compile": False}),
    ("hmc", {"compile": False}),
    ("sgld", {}),
    ("csgmcmc", {"num_cycles": 1}),
])
def test_every_sampler_stops_in_a_map_start_projected_past_its_budget(backend, options):
    data = make_conjugate_regression()
    started = time.perf_counter()
    with pytest.raises(TimeBudgetExceeded) as caught:
        fit(linear_bnn(data), data.x, data.y, backend=backend, seed=0, progress=False, num_chains=2, time_budget=30,
            map_steps=10**7, **options)  # 10^7 steps of ~1 ms: hours, clearly over 30 s from the first step
    assert time.perf_counter() - started < 20
    error = caught.value
    assert error.backend == backend and error.projection.stage == "start" and error.projection.total == 10**7 - 1
    assert "stopped early in its MAP start" in str(error) and "map_steps=" in str(error)
    assert "init='current'" in str(error) and "time_budget=None" in str(error)


def test_a_default_nuts_fit_on_a_small_model_is_not_stopped_by_its_start():
    data = make_conjugate_regression()
    post = fit(linear_bnn(data), data.x, data.y, backend="nuts", seed=0, progress=False, num_chains=2, warmup_steps=50,
               num_samples=50, compile=False)
    assert post.info["init"] == "map" and post.info["map_steps"] > 0
