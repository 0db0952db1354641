"""SG-MCMC backends (SGLD, pSGLD, SGHMC, cyclical) against the conjugate posterior, plus
schedules, non-finite detection and errors.

Full-batch gradients and small steps make each kernel's discretisation bias a few per
cent of the posterior sd (Langevin on a Gaussian inflates the variance by ≈ 1/(1 − ελ/4));
3000–4000 steps × 4 chains (10⁴ steps × 16 chains for the cyclical
schedules) give a Monte Carlo error well inside "mean within 0.1 sd, sd within
15 %", and R-hat must be below 1.01.
"""
from __future__ import annotations

import math

import arviz as az
import pytest
import torch

from tests.inference.conftest import flat_linear_draws, make_conjugate_regression
from inference import NonFiniteLossError, fit
from inference.sgmcmc.config import CyclicalConfig, SGLDConfig
from inference.sgmcmc.fit import CyclicalSampler, SGLDSampler
from inference.sgmcmc.updates import sghmc, sgld
from inference.sgmcmc.step_sizes import VARIANCE_INFLATION, sghmc_step_size, sgld_step_size, spectral_radius
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior

COMMON = {"batch_size": None, "init": "current", "time_budget": None}
CASES = {
    "sgld": {"num_chains": 4, "warmup_steps": 300, "num_samples": 4000, "thin": 1, "step_size": 2.5e-3, "step_decay": 0.0},
    "psgld": {"num_chains": 4, "warmup_steps": 300, "num_samples": 4000, "thin": 1, "step_size": 8e-4, "step_decay": 0.0},
    "sghmc": {"num_chains": 4, "warmup_steps": 300, "num_samples": 3000, "thin": 1, "step_size": 1e-3, "friction": 0.3},
    # cyclical: draws within a cycle are strongly correlated (the step size anneals to 0), so
    # R-hat < 1.01 needs many chains (vectorised, nearly free) and ~10^4 steps
    "csgmcmc-sgld": {
        "num_chains": 16, "num_samples": 2000, "num_cycles": 5, "thin": 6, "exploration": 0.2, "step_size": 2e-3,
    },
    "csgmcmc-sghmc": {
        "num_chains": 16, "num_samples": 2000, "num_cycles": 4, "thin": 5, "exploration": 0.2, "step_size": 2e-3,
        "kernel": "sghmc", "friction": 0.3,
    },
}  # fmt: skip


def linear_bnn(data):
    return BayesianNetwork(data.net(), "all", NormalPrior(data.prior_sd), GaussianLikelihood(data.noise_sd), output_dim=1)


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_recovers_conjugate_posterior(conjugate_regression, case):
    data = conjugate_regression
    backend = case.split("-")[0]
    post = fit(linear_bnn(data), data.x, data.y, backend=backend, seed=0, progress=False, **COMMON, **CASES[case])
    draws = flat_linear_draws(post.sample_params())
    sd = data.post_sd
    assert ((draws.mean(0) - data.post_mean).abs() / sd).max() < 0.1
    assert ((draws.std(0) / sd) - 1).abs().max() < 0.15
    rhat = az.rhat(az.convert_to_dataset({k: v.numpy() for k, v in post.draws.items()})).to_array().max()
    assert float(rhat) < 1.01
    shape = (CASES[case]["num_chains"], CASES[case]["num_samples"])
    assert post.sample_stats["lp"].shape == post.sample_stats["step_size"].shape == shape


# the default step sizes (inference.sgmcmc.step_sizes) on N = 500 rows in minibatches of 50 (r = 10):
# the rule keeps the stationary sd along the stiffest direction within 5 % (precision eigenvalues
# ≈ 1 700–2 300 here, so every direction within 5 %); ε λ_max ≈ 0.04 makes the slowest
# direction's autocorrelation time ≈ 130 steps, so 32 chains × 1 000 steps give an MC error of
# the mean ≈ 0.06 sd and of the sd ≈ 5 %.  Over seeds 0–2 the means were within 0.15 sd and the
# sds within 9 % (sgld, psgld, sghmc).
DEFAULT_STEP_RUN = {"batch_size": 50, "map_steps": 300, "num_chains": 32, "warmup_steps": 500, "num_samples": 250, "thin": 4,
                    "time_budget": None}


@pytest.mark.parametrize("backend", ["sgld", "psgld", "sghmc"])
def test_default_step_size_recovers_the_posterior_from_minibatches(backend):
    data = make_conjugate_regression(n=500)
    post = fit(linear_bnn(data), data.x, data.y, backend=backend, seed=0, progress=False, **DEFAULT_STEP_RUN)
    draws = flat_linear_draws(post.sample_params())
    assert ((draws.mean(0) - data.post_mean).abs() / data.post_sd).max() < 0.2
    ratio = draws.std(0) / data.post_sd
    assert 0.8 < ratio.min() and ratio.max() < 1.3
    rule = post.info["step_size_rule"]
    assert rule["batch_ratio"] == 10 and rule["curvature_rows"] == 500
    assert post.info["config"]["step_size"] == rule["step_size"]
    if backend != "psgld":  # the curvature of the N/n-scaled potential is the posterior precision's largest eigenvalue
        largest = float(torch.linalg.eigvalsh(torch.linalg.inv(data.post_cov.double())).max())
        assert math.isclose(rule["curvature"], largest, rel_tol=1e-3)


@pytest.mark.parametrize("batch_ratio", [1.0, 10.0])
@pytest.mark.parametrize("name", ["sgld", "sghmc-0.1", "sghmc-1.0"])
def test_step_rule_gives_the_stated_variance_on_a_gaussian(name, batch_ratio):
    """On N(0, 1/λ) with gradient noise of variance (r − 1)λ (a minibatch ratio r under the
    information equality), the kernel at the rule's step has stationary variance f/λ.  2048
    chains × 1 500 steps after 1 500 of burn-in (≥ 20 relaxation times): MC error ≈ 1 %."""
    lam, f = 50.0, VARIANCE_INFLATION
    noise = torch.Generator().manual_seed(1)

    def gaussian(z):
        extra = math.sqrt((batch_ratio - 1) * lam) * torch.randn(z.shape, generator=noise, dtype=z.dtype)
        return -0.5 * lam * (z * z).sum(-1), -lam * z + extra

    if name == "sgld":
        kernel = sgld(gaussian, sgld_step_size(lam, batch_ratio))
    else:
        friction = float(name.split("-")[1])
        kernel = sghmc(gaussian, sghmc_step_size(lam, batch_ratio, friction), friction)
    generator = torch.Generator().manual_seed(0)
    state = kernel.init(torch.zeros(2048, 1, dtype=torch.float64))
    total = 0.0
    for t in range(3000):
        state = kernel.update(state, generator)
        if t >= 1500:
            total += float((state.z * state.z).mean())
    assert abs(total / 1500 * lam / f - 1) < 0.04


def test_step_rule_refuses_a_flat_or_non_finite_curvature():
    with pytest.raises(ValueError, match="give step_size explicitly"):
        sgld_step_size(0.0, 1.0)
    with pytest.raises(ValueError, match="give step_size explicitly"):
        spectral_radius(lambda v: v * float("nan"), torch.ones(3))
    with pytest.raises(ValueError, match="batch_ratio"):
        sghmc_step_size(1.0, 0.5, 0.1)
    assert spectral_radius(torch.zeros_like, torch.ones(3)) == 0.0
    assert math.isclose(spectral_radius(lambda v: torch.tensor([-5.0, 2.0]) * v, torch.ones(2)), 5.0, rel_tol=1e-4)


def test_a_given_step_size_is_used_as_given(conjugate_regression):
    data = conjugate_regression
    post = fit(linear_bnn(data), data.x, data.y, backend="sghmc", seed=0, progress=False, init="current",
               num_chains=2, warmup_steps=0, num_samples=5, thin=1, step_size=3e-4)  # fmt: skip
    assert "step_size_rule" not in post.info and post.info["config"]["step_size"] == 3e-4
    assert bool((post.sample_stats["step_size"] == 3e-4).all())


def test_cyclical_default_peak_follows_its_rule():
    """The peak α₀ keeps the sampling phase (from β on) within SGLD's rule and the exploration at
    half the SGD limit: with a full batch the exploration bound 1/λ is the smaller one."""
    data = make_conjugate_regression(n=500)
    largest = float(torch.linalg.eigvalsh(torch.linalg.inv(data.post_cov.double())).max())
    sampling_start = (math.cos(0.8 * math.pi) + 1) / 2  # the cosine schedule at β = 0.8, / α₀
    for batch_size, expected in ((None, 1 / largest), (50, sgld_step_size(largest, 10) / 2 / sampling_start)):
        post = fit(linear_bnn(data), data.x, data.y, backend="csgmcmc", seed=0, progress=False, init="current",
                   batch_size=batch_size, num_chains=2, num_samples=4, num_cycles=2, thin=1)  # fmt: skip
        assert math.isclose(post.info["config"]["step_size"], expected, rel_tol=1e-3)


@pytest.mark.parametrize("rows, batch, length, thin", [(200, 32, 350, 1), (691, 32, 1100, 4), (1347, 32, 2150, 8),
                                                        (40, None, 251, 1)])
def test_cyclical_cycles_last_the_papers_epochs_and_hold_their_draws(rows, batch, length, thin):
    """Zhang et al. 2020's 50 epochs per cycle (at least the 50 draws a cycle keeps, one step apart, in the last
    20 %); the sampling phase's steps shared among the draws."""
    steps_per_epoch = 1 if batch is None else math.ceil(rows / batch)
    config = CyclicalConfig().resolved(steps_per_epoch)
    assert (config.cycle_length, config.thin) == (length, thin)
    assert config.length - math.ceil(0.8 * config.length) >= config.sampling_steps
    given = CyclicalConfig(thin=10, cycle_epochs=1.0).resolved(7)  # too short for 50 draws 10 apart: lengthened
    assert given.cycle_length == 2501 and given.thin == 10  # 500 / (1 − 0.8) + 1
    assert given.length - math.ceil(0.8 * given.length) >= 500


def test_cyclical_fit_records_its_resolved_cycles():
    data = make_conjugate_regression(n=64)
    post = fit(linear_bnn(data), data.x, data.y, backend="csgmcmc", seed=0, progress=False, init="current",
               num_chains=2, num_samples=8, num_cycles=2, batch_size=16, time_budget=None)
    config = post.info["config"]
    assert (config["cycle_length"], config["thin"]) == (200, 10)  # 4 steps an epoch · 50 epochs; 40 sampling steps / 4 draws
    assert post.draws["weight"].shape[:2] == (2, 8)


def test_minibatch_sgld_is_close_to_the_posterior(conjugate_regression):
    data = conjugate_regression
    post = fit(linear_bnn(data), data.x, data.y, backend="sgld", seed=1, progress=False, batch_size=10,
               init="current", num_chains=4, warmup_steps=300, num_samples=3000, thin=1, step_size=1e-3,
               step_decay=0.0)  # fmt: skip
    draws = flat_linear_draws(post.sample_params())
    assert ((draws.mean(0) - data.post_mean).abs() / data.post_sd).max() < 0.2
    assert ((draws.std(0) / data.post_sd) - 1).abs().max() < 0.25  # minibatch noise adds O(ε) variance


def zero_gradient(z):
    """A flat log density: every move of an SG-MCMC kernel is then its injected noise."""
    return torch.zeros(z.shape[0]), torch.zeros_like(z)


def test_sgld_step_schedule_is_polynomial_decay():
    config = SGLDConfig(warmup_steps=4, num_samples=3, thin=2, step_size=0.1, step_decay=0.5, step_offset=10)
    sampler = SGLDSampler()
    kernel = sampler.kernel(zero_gradient, config, num_data=1)
    a = 0.1 * 10**0.5  # ε_t = a (b + t)^−γ
    assert all(math.isclose(kernel.step_size(t), a * (10 + t) ** -0.5) for t in range(10))
    assert sampler.num_iterations(config) == 4 + 3 * 2
    draw_index = sampler.draw_index(config)
    assert [draw_index(t) for t in range(10)] == [None] * 5 + [0, None, 1, None, 2]  # after 6, 8 and 10 steps


def test_cyclical_schedule_follows_zhang_et_al():
    config = CyclicalConfig(num_samples=6, num_cycles=3, thin=2, exploration=0.5, step_size=0.4).resolved(1)
    sampler = CyclicalSampler()
    kernel, length = sampler.kernel(zero_gradient, config, num_data=1), config.length
    total = sampler.num_iterations(config)
    assert total == 3 * length and length - math.ceil(0.5 * length) >= 2 * 2
    generator = torch.Generator().manual_seed(0)
    state = kernel.init(torch.zeros(2, 3))
    for k in range(total):  # SGLD kernel runs with ε = 2α_k
        r = k % length
        assert math.isclose(kernel.step_size(k) / 2, 0.4 / 2 * (math.cos(math.pi * r / length) + 1), rel_tol=1e-9)
        new = kernel.update(state, generator)
        moved = not torch.equal(new.z, state.z)  # zero gradient: only the noise moves z
        assert moved == (r / length >= 0.5) or kernel.step_size(k) == 0  # exploration = plain SGD
        state = new
    draw_index = sampler.draw_index(config)
    kept = [(k, draw_index(k)) for k in range(total) if draw_index(k) is not None]
    assert [d for _, d in kept] == list(range(6))
    assert [k % length for k, _ in kept] == [length - 3, length - 1] * 3  # end of every cycle


def test_non_finite_values_raise_with_draws_so_far():
    data = make_conjugate_regression()
    with pytest.raises(NonFiniteLossError) as info:
        fit(linear_bnn(data), data.x, data.y, backend="sgld", seed=0, progress=False, batch_size=None,
            init="current", num_chains=2, warmup_steps=0, num_samples=500, thin=1, step_size=0.2, step_decay=0.0)  # fmt: skip
    err = info.value
    assert 0 < err.step < 500
    post = err.posterior
    assert post.num_chains == 2 and post.draws["weight"].shape[1] == err.step - 1  # draws after steps 1 .. step − 1
    assert all(bool(torch.isfinite(v).all()) for v in post.draws.values())


@pytest.mark.parametrize(
    "backend, options, message",
    [
        ("sgld", {"step_size": 0.0}, "step_size must be a positive"),
        ("sghmc", {"step_size": -1.0}, "step_size must be a positive"),
        ("psgld", {"num_samples": 0}, "num_samples must be at least 1"),
        ("sgld", {"batch_size": 0}, "batch_size must be at least 1"),
        ("sghmc", {"friction": 0.0}, "friction"),
        ("csgmcmc", {"num_samples": 10, "num_cycles": 4}, "multiple of num_cycles"),
        ("csgmcmc", {"num_samples": 8, "num_cycles": 4, "thin": 5, "cycle_length": 12}, "cycle_length"),
        ("csgmcmc", {"kernel": "hmc"}, "unknown cyclical kernel"),
        ("csgmcmc", {"warmup_steps": 10}, "unknown option"),
    ],
)
def test_bad_options_raise(backend, options, message):
    data = make_conjugate_regression()
    with pytest.raises(ValueError, match=message):
        fit(linear_bnn(data), data.x, data.y, backend=backend, progress=False, **options)
