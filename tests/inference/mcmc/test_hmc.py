"""HMC / NUTS backends against closed-form posteriors, plus export, persistence and errors.

Tolerances: with ~1000+ effective draws the Monte Carlo error of a posterior mean is
≲ 0.03 sd and of a posterior sd ≲ 3 %, so "mean within 0.1 sd, sd within 15 %" fails only
for a wrong sampler.  R-hat (rank-normalised split, ArviZ) must be below 1.01.
Eager mode (``compile=False``) keeps each test to seconds; one slow test checks the
compiled path.
"""
from __future__ import annotations

import time

import arviz as az
import pytest
import torch
from torch import nn

from tests.inference.conftest import flat_linear_draws, make_conjugate_regression
from tests.zoo.test_user_networks import GRUNet, _data
from inference import NonFiniteLossError, fit, load_posterior
from inference.mcmc.adaptation import adaptation_windows, shrink_correlations, welford_covariance
from inference.evaluation.diagnostics import convergence_metrics, convergence_warning
from inference.mcmc import compilation
from inference.mcmc.compilation import LazyCompile, compile_blocker, eager_budget, interruptible, should_compile
from inference.optim.potential import Potential, compiled
from inference.optim.start import initial_point
from lab.runs.spec import RunSpec
from lab.runs.execution import execute
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior

FAST = {"compile": False, "init": "current", "time_budget": None}  # tested for speed in tests/inference/mcmc/test_budget.py


def linear_bnn(data, bias=True, learn_noise=False):
    net = data.net() if bias else nn.Linear(data.x.shape[1], 1, bias=False)
    likelihood = GaussianLikelihood(learn_noise=True) if learn_noise else GaussianLikelihood(noise_sd=data.noise_sd)
    return BayesianNetwork(net, "all", NormalPrior(data.prior_sd), likelihood, output_dim=1)


def rhat_max(draws: dict) -> float:
    idata = az.convert_to_dataset({k: v.numpy() for k, v in draws.items()})
    return float(az.rhat(idata).to_array().max())


def assert_matches(draws_flat, mean, cov, rhat):
    sd = cov.diagonal().sqrt()
    assert ((draws_flat.mean(0) - mean).abs() / sd).max() < 0.1
    assert ((draws_flat.std(0) / sd) - 1).abs().max() < 0.15
    assert rhat < 1.01


@pytest.mark.parametrize("backend, options", [("nuts", {"num_samples": 600}), ("hmc", {"num_samples": 1000, "num_steps": 2})])
def test_sampler_recovers_conjugate_posterior(conjugate_regression, backend, options):
    data = conjugate_regression
    post = fit(linear_bnn(data), data.x, data.y, backend=backend, seed=0, progress=False,
               num_chains=4, warmup_steps=150, **FAST, **options)  # fmt: skip
    draws = options["num_samples"]
    assert post.num_chains == 4 and post.draws["weight"].shape == (4, draws, 1, 2)
    assert_matches(flat_linear_draws(post.sample_params()), data.post_mean, data.post_cov, rhat_max(post.draws))
    stats = post.sample_stats
    for key in ("diverging", "energy", "step_size", "acceptance_rate", "n_steps", "lp"):
        assert stats[key].shape == (4, draws)
    assert ("tree_depth" in stats) == (backend == "nuts")
    assert post.info["divergences"] == 0 and 0.6 < float(stats["acceptance_rate"].mean()) <= 1


def correlated_regression(n=30, rho=0.95, noise_sd=0.5, seed=3):
    """Regression through the origin on two features with correlation ρ: a correlated 2-D Gaussian posterior."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, generator=g)
    x2 = rho * x1 + (1 - rho**2) ** 0.5 * torch.randn(n, generator=g)
    x = torch.stack([x1, x2], 1)
    y = (x @ torch.tensor([0.5, -0.3]) + noise_sd * torch.randn(n, generator=g)).unsqueeze(-1)
    precision = x.double().T @ x.double() / noise_sd**2 + torch.eye(2, dtype=torch.float64)
    cov = torch.linalg.inv(precision)
    mean = cov @ x.double().T @ y.double().squeeze(-1) / noise_sd**2
    return x, y, noise_sd, mean.float(), cov.float()


@pytest.mark.parametrize("dense, draws", [(False, 1200), (True, 400)])
def test_nuts_on_correlated_gaussian(dense, draws):
    x, y, noise_sd, mean, cov = correlated_regression()
    assert cov[0, 1] / cov.diagonal().prod().sqrt() < -0.8  # strongly correlated target
    bnn = BayesianNetwork(nn.Linear(2, 1, bias=False), "all", NormalPrior(1.0), GaussianLikelihood(noise_sd), output_dim=1)
    post = fit(bnn, x, y, backend="nuts", seed=1, progress=False, num_chains=4, warmup_steps=150,
               num_samples=draws, dense_mass=dense, pool_adaptation=dense, **FAST)  # fmt: skip
    w = post.sample_params()["weight"].reshape(-1, 2)
    assert_matches(w, mean, cov, rhat_max(post.draws))
    corr = torch.corrcoef(w.T)[0, 1]
    assert abs(corr - cov[0, 1] / cov.diagonal().prod().sqrt()) < 0.05


def test_potential_layout_and_jacobian():
    data = make_conjugate_regression()
    bnn = linear_bnn(data, learn_noise=True)
    pot = Potential(bnn, data.x, data.y)
    assert pot.dim == 2 + 1 + 1 and [b.name for b in pot.blocks] == ["weight", "bias", "noise_precision"]
    z = torch.randn(5, pot.dim)
    values, log_det = pot.unpack(z)
    assert values["noise_precision"].shape == (5, 1) and bool((values["noise_precision"] > 0).all())
    assert torch.allclose(pot.pack(values), z, atol=1e-5)
    expected = bnn.log_joint(values, data.x, data.y) + z[:, -1]  # log|d exp(u)/du| = u
    assert torch.allclose(pot.log_density(z), expected, rtol=1e-5, atol=1e-3)
    index = torch.arange(10)
    minibatch = bnn.log_prior(values) + 4.0 * bnn.log_likelihood(values, data.x[:10], data.y[:10]).sum(-1) + z[:, -1]
    assert torch.allclose(pot.log_density(z, index), minibatch, rtol=1e-5, atol=1e-3)
    lp, grad = pot.value_and_grad(z)
    lp2, grad2 = pot.functional_value_and_grad(z)
    assert torch.allclose(lp, lp2) and torch.allclose(grad, grad2, atol=1e-4)


def test_map_init_reaches_the_posterior_mode(conjugate_regression):
    data = conjugate_regression
    pot = Potential(linear_bnn(data), data.x, data.y)
    z, record = initial_point(pot, "map", map_steps=600, map_lr=0.05)
    assert record["init"] == "map"
    assert ((z - data.post_mean).abs() / data.post_sd).max() < 0.05  # Gaussian: mode = mean


def test_map_start_sets_the_noise_precision_to_its_map_for_the_fitted_weights(conjugate_regression):
    """A short minibatch budget leaves a learned noise precision behind its optimum; the start sets it to
    the closed-form MAP for the fitted weights (Gamma(a, b) prior: (a − 1 + N/2) / (b + RSS/2))."""
    data = conjugate_regression
    torch.manual_seed(0)
    bnn = linear_bnn(data, learn_noise=True)
    likelihood = bnn.likelihood
    pot = Potential(bnn, data.x, data.y)
    z, _ = initial_point(pot, "map", map_steps=30, map_lr=0.01)
    values = pot.unpack(z.unsqueeze(0))[0]
    weights = {k: v[0] for k, v in values.items() if k != "noise_precision"}
    rss = float(((bnn.forward_single(weights, data.x) - data.y) ** 2).sum())
    prior = likelihood.latent_priors(1)["noise_precision"].base_dist
    exact = (float(prior.concentration) - 1 + len(data.y) / 2) / (float(prior.rate) + rss / 2)
    assert float(values["noise_precision"][0, 0]) == pytest.approx(exact, rel=1e-4)


def test_map_start_with_trained_deterministic_layers_fits_the_body():
    """Last-layer model (the body trained jointly): the MAP start writes the fitted body into the network,
    takes its budget of minibatch steps (a fixed noise: no held-out choice) and raises the log density."""
    data = make_conjugate_regression()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(data.x.shape[1], 8), nn.Tanh(), nn.Linear(8, 1))
    bnn = BayesianNetwork(net, "last", NormalPrior(1.0), GaussianLikelihood(noise_sd=data.noise_sd), output_dim=1)
    body = net[0].weight.detach().clone()
    pot = Potential(bnn, data.x, data.y)
    start = initial_point(pot, "current", 0, 0.01)[1]["init_log_density"]
    z, record = initial_point(pot, "map", map_steps=800, map_lr=0.05)
    assert 800 <= record["map_steps"] < 800 + len(data.x) / 64 + 1
    assert not torch.equal(net[0].weight, body) and not net.training  # the body was fitted; eval mode for π
    assert record["init_log_density"] > start


def busy(seconds: float) -> None:
    """Spend ``seconds`` of CPU (LazyCompile times eager iterations in CPU seconds: a sleep costs none)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_compile_rule_compiles_only_where_it_pays(monkeypatch):
    """Ski-rental rule: compile once the remaining eager time, less the compiled share, exceeds the compile time."""
    assert should_compile(eager_seconds=1.0, done=1, total=100, compile_seconds=10.0)  # 99 · 1 · 0.75 > 10
    assert not should_compile(eager_seconds=1.0, done=10, total=20, compile_seconds=10.0)  # 10 · 0.1 · 0.75 < 10
    assert not should_compile(eager_seconds=1.0, done=5, total=5, compile_seconds=0.0)  # nothing left to run
    monkeypatch.setattr(compilation, "COLD_COMPILE_SECONDS", 1.0)
    calls = []

    def build(compile):
        def transition(state):
            calls.append(compile)
            busy(0 if compile else 0.02)
            return state

        return transition

    long = LazyCompile(build, "auto", total=100, key=("test", "long"))  # 99 · 0.02 · 0.75 > 1 s after one call
    for _ in range(4):
        long(0)
    assert calls == [False, True, True, True] and long.record["compiled_from"] == 1
    assert long.record["compile_seconds"] is not None
    calls.clear()
    short = LazyCompile(build, "auto", total=3, key=("test", "short"))
    for _ in range(3):
        short(0)
    assert calls == [False] * 3 and short.record["compiled_from"] is None
    calls.clear()
    never = LazyCompile(build, False, total=100, key=("test", "never"))
    for _ in range(3):
        never(0)
    assert calls == [False] * 3


def test_an_eager_iteration_past_its_budget_gives_way_to_the_compiled_one_with_the_same_draws():
    """Once an eager iteration has run past :func:`eager_budget` (here 15 s · 1 / (0.75 · 99) ≈ 0.2 s of a 1 s
    iteration), its next interruptible unit raises, and the iteration runs compiled from the generator state
    it started with: the compiled call sees the draw the eager one saw, and the eager attempt never finishes."""
    calls = []

    def build(compile):
        unit = (lambda: None) if compile else interruptible(lambda: busy(0.02))

        def transition(state, generator):
            draw = float(torch.rand(1, generator=generator))
            for _ in range(50):
                unit()
            calls.append((compile, draw))
            return state + 1

        return transition

    assert eager_budget(0.0, 0, 100, 15.0) == pytest.approx(15.0 / (0.75 * 99))
    assert eager_budget(0.0, 99, 100, 15.0) is None  # the last iteration: nothing left for a compile to save
    generator = torch.Generator().manual_seed(0)
    first_draw = float(torch.rand(1, generator=torch.Generator().manual_seed(0)))
    lazy = LazyCompile(build, "auto", total=100, key=("test", "abandoned"))
    started = time.thread_time()
    assert lazy(0, generator) == 1
    assert time.thread_time() - started < 0.6  # not the eager iteration's 1 s of CPU
    assert calls == [(True, first_draw)]
    assert lazy.record["eager_abandoned"] == 0 and lazy.record["compiled_from"] == 0
    assert lazy(1, generator) == 2 and calls[-1][0] is True
    calls.clear()
    short = LazyCompile(build, "auto", total=3, key=("test", "short-abandon"))  # budget 15 / (0.75 · 2) = 10 s
    short(0, torch.Generator().manual_seed(0))
    assert calls == [(False, first_draw)] and short.record["eager_abandoned"] is None
    interruptible(lambda: None)()  # outside an eager LazyCompile iteration there is no deadline


def test_compiled_units_write_their_wrapper_in_cpp_on_a_cpu_only(monkeypatch):
    """``compiled(..., device=cpu)`` asks inductor for its C++ wrapper (a compiled while_loop loops in C++);
    another device, or none, keeps the Python wrapper."""
    seen = []

    def fake_compile(fn, **kwargs):
        seen.append(kwargs["options"]["cpp_wrapper"])
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    for device in ("cpu", torch.device("cpu"), "cuda", None):
        compiled(lambda a: a, True, device=device)
    assert seen == [True, True, False, False]


def test_a_compilable_transition_on_a_cpu_warms_the_compiler_before_the_start(monkeypatch):
    """An enabled transition on a CPU starts the vector-ISA detection (once per process); a disabled, blocked or
    non-CPU one does not; the detection fills torch's own cache, which the compile reads later."""
    started = []
    monkeypatch.setattr(compilation, "warm_cpu_compiler", lambda: started.append(True))

    def build(compile):
        return lambda state: state

    LazyCompile(build, "auto", total=10, key=("test", "warm"), device=torch.device("cpu"))
    assert started == [True]
    LazyCompile(build, False, total=10, key=("test", "off"), device="cpu")
    LazyCompile(build, "auto", total=10, key=("test", "blocked"), blocker="a GRU", device="cpu")
    LazyCompile(build, "auto", total=10, key=("test", "meta"), device="meta")
    assert started == [True]
    monkeypatch.undo()
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    thread = compilation.warm_cpu_compiler()
    assert compilation.warm_cpu_compiler() is thread  # once per process
    thread.join(timeout=120)
    assert not thread.is_alive() and valid_vec_isa_list.cache_info().currsize == 1


def test_small_fit_is_not_compiled():
    """The default ``compile="auto"`` leaves a fit of a few hundred cheap iterations eager."""
    data = make_conjugate_regression()
    post = fit(linear_bnn(data), data.x, data.y, backend="nuts", seed=0, progress=False, num_chains=2,
               warmup_steps=50, num_samples=50, init="current")  # fmt: skip
    assert post.info["compile"] == "auto" and post.info["compiled_from"] is None


def test_recurrent_network_is_not_compiled_and_says_why():
    """A GRU cannot be compiled: detected before any attempt, a warning when compile=True was asked for."""
    x, y = _data(n=12, shape=(5, 2))
    bnn = BayesianNetwork(GRUNet(), "all", example_input=x)  # "last": only the cached head runs (tests/inference/optim/test_output_head.py)
    assert "GRU" in compile_blocker(bnn)
    assert compile_blocker(linear_bnn(make_conjugate_regression())) is None
    with pytest.warns(RuntimeWarning, match="recurrent layer .GRU.*running without compilation"):
        post = fit(bnn, x, y, backend="nuts", seed=0, progress=False, num_chains=2, warmup_steps=5, num_samples=5,
                   init="current", max_tree_depth=3, compile=True)  # fmt: skip
    assert post.info["compiled_from"] is None and "GRU" in post.info["compile_skipped"]


def test_progress_bars_name_every_phase(capsys):
    data = make_conjugate_regression()
    fit(linear_bnn(data), data.x, data.y, backend="nuts", seed=0, progress=True, num_chains=2, warmup_steps=20,
        num_samples=10, map_steps=200, compile=False)  # fmt: skip
    err = capsys.readouterr().err
    assert "MAP start" in err and "nuts (2 chains, 3 dims) warm-up" in err and "nuts (2 chains, 3 dims) sampling" in err


def test_save_load_arviz_and_loo(tmp_path):
    data = make_conjugate_regression()
    post = fit(linear_bnn(data, learn_noise=True), data.x, data.y, backend="nuts", seed=2, progress=False,
               num_chains=2, warmup_steps=60, num_samples=50, **FAST)  # fmt: skip
    assert bool((post.draws["noise_precision"] > 0).all())
    loaded = load_posterior(post.save(tmp_path / "nuts"))
    assert loaded.num_chains == 2
    for name, value in post.draws.items():
        assert torch.equal(loaded.draws[name], value)
    for name, value in post.sample_stats.items():
        assert torch.equal(loaded.sample_stats[name], value)
    assert loaded.info["backend"] == "nuts" and loaded.info["config"]["num_chains"] == 2
    assert torch.allclose(loaded.predict(data.x, seed=0).mean, post.predict(data.x, seed=0).mean)
    idata = loaded.to_arviz(data.x, data.y)
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 50
    assert {"diverging", "energy", "tree_depth", "step_size", "acceptance_rate"} <= set(idata.sample_stats.data_vars)
    assert idata.log_likelihood["obs"].shape == (2, 50, 40)
    assert az.loo(idata).elpd_loo < 0


def test_divergences_are_counted_and_warned():
    data = make_conjugate_regression()
    with pytest.warns(RuntimeWarning, match="diverged"):
        post = fit(linear_bnn(data), data.x, data.y, backend="hmc", seed=0, progress=False, num_chains=2,
                   warmup_steps=0, num_samples=20, step_size=1.0, num_steps=5, init_metric="identity", **FAST)  # fmt: skip
    assert post.info["divergences"] == int(post.sample_stats["diverging"].sum()) > 0


def test_tree_depth_saturation_is_counted_warned_and_exported():
    data = make_conjugate_regression()
    with pytest.warns(RuntimeWarning, match="100% of the post-warm-up transitions hit the maximum tree depth 1"):
        post = fit(linear_bnn(data), data.x, data.y, backend="nuts", seed=0, progress=False, num_chains=2,
                   warmup_steps=30, num_samples=40, max_tree_depth=1, **FAST)  # fmt: skip
    assert bool((post.sample_stats["tree_depth"] == 1).all())  # one doubling: always at the cap
    assert post.info["tree_depth_saturated"] == 1.0
    idata = post.to_arviz(data.x, data.y)
    assert idata.attrs["max_tree_depth"] == 1
    assert convergence_metrics(idata)["tree_depth_saturated"] == 1.0


def test_unmixed_chains_are_reported_and_warned(tmp_path):
    spec = RunSpec(data="toy1d", hidden=[8], backend="hmc", backend_options={
        "num_chains": 2, "warmup_steps": 0, "num_samples": 30, "num_steps": 1, "step_size": 1e-6,
        "init": "current", "init_jitter": 1.0, "compile": False})  # fmt: skip
    with pytest.warns(RuntimeWarning, match=r"rhat_max .* > 1.05: the chains disagree"):
        metrics = execute(spec, tmp_path, progress=False).metrics
    assert metrics["rhat_max"] > 1.05 and "tree_depth_saturated" not in metrics  # static HMC has no trees


@pytest.mark.parametrize(
    "metrics, expected",
    [
        ({"rhat_max": None}, None),
        ({"rhat_max": 1.04}, None),
        ({"rhat_max": 1.3}, "chains disagree"),
        ({"rhat_max": 1.3, "tree_depth_saturated": 0.9}, "90% of the NUTS trajectories hit the maximum tree depth"),
    ],
)
def test_convergence_warning_text(metrics, expected):
    text = convergence_warning(metrics)
    assert text is None if expected is None else expected in text


@pytest.mark.parametrize("dense", [False, True])
def test_welford_inverse_mass_per_chain_and_pooled(dense):
    points = torch.randn(3, 50, 4) * torch.tensor([1.0, 2.0, 0.5, 3.0]) + torch.arange(3.0).view(3, 1, 1)
    welford = welford_covariance(dense)
    state = welford.init(3, 4)
    for t in range(50):
        state = welford.update(state, points[:, t])
    n = 50

    def regularised(cov, n):
        shrink = 1e-3 * 5 / (n + 5)
        if dense:  # the correlations shrunk towards the diagonal first (shrink_correlations)
            cov = shrink_correlations(cov, n)[0]
        return n / (n + 5) * cov + (shrink * torch.eye(4) if dense else shrink)

    def cov(x):
        return torch.cov(x.T) if dense else x.var(0)

    per_chain = welford.final(state, pooled=False)
    for c in range(3):
        assert torch.allclose(per_chain[c], regularised(cov(points[c]), n), atol=1e-5)
    pooled = welford.final(state, pooled=True)
    assert torch.allclose(pooled[1], regularised(cov(points.reshape(-1, 4)), 150), atol=1e-5)


def test_adaptation_windows_follow_stan():
    assert adaptation_windows(10) == []
    assert adaptation_windows(1000) == [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    assert adaptation_windows(200) == [(75, 100), (100, 150)]
    assert adaptation_windows(100) == [(15, 90)]  # short warm-up: 15 % / 75 % / 10 %


@pytest.mark.parametrize(
    "options, message",
    [
        ({"step_size": 0.0}, "step_size must be a positive"),
        ({"step_size": -1e-3}, "step_size must be a positive"),
        ({"num_samples": 0}, "num_samples must be at least 1"),
        ({"num_chains": 0}, "num_chains must be at least 1"),
        ({"target_accept": 1.0}, "target_accept"),
        ({"max_tree_depth": 0}, "max_tree_depth"),
        ({"init": "prior"}, "unknown init"),
        ({"compile": "yes"}, "compile.* must be true or false or 'auto'"),
        ({"map_tol": 1e-3}, "unknown option"),
        ({"num_steps": 10}, "unknown option"),
    ],
)
def test_bad_options_raise(options, message):
    data = make_conjugate_regression()
    with pytest.raises(ValueError, match=message):
        fit(linear_bnn(data), data.x, data.y, backend="nuts", progress=False, **options)


@pytest.mark.parametrize("backend", ["nuts", "hmc", "sgld"])
def test_model_without_stochastic_sites_is_rejected(backend):
    data = make_conjugate_regression()
    bnn = BayesianNetwork(data.net(), "none", likelihood=GaussianLikelihood(0.5), output_dim=1)
    with pytest.raises(ValueError, match="no stochastic sites"):
        fit(bnn, data.x, data.y, backend=backend, progress=False, num_samples=5, **({} if backend == "sgld" else FAST))


def test_non_finite_start_is_reported():
    data = make_conjugate_regression()
    bnn = linear_bnn(data)
    with torch.no_grad():
        bnn.net.weight.fill_(float("nan"))
    with pytest.raises((ValueError, NonFiniteLossError), match="not finite|non-finite"):
        fit(bnn, data.x, data.y, backend="nuts", progress=False, num_samples=5, **FAST)


@pytest.mark.slow
def test_compiled_nuts_recovers_conjugate_posterior(conjugate_regression):
    data = conjugate_regression
    post = fit(linear_bnn(data), data.x, data.y, backend="nuts", seed=0, progress=False, num_chains=4,
               warmup_steps=150, num_samples=400, init="map", compile=True)  # fmt: skip
    assert_matches(flat_linear_draws(post.sample_params()), data.post_mean, data.post_cov, rhat_max(post.draws))
