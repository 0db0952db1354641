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

from conftest import flat_linear_draws, make_conjugate_regression
from inference import NonFiniteLossError, fit
from inference.backends.sgmcmc import CyclicalConfig, CyclicalSGMCMCBackend, SGLDBackend, SGLDConfig
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior

COMMON = {"batch_size": None, "init": "current"}
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
    backend = SGLDBackend()
    kernel = backend.kernel(zero_gradient, config, num_data=1)
    a = 0.1 * 10**0.5  # ε_t = a (b + t)^−γ
    assert all(math.isclose(kernel.step_size(t), a * (10 + t) ** -0.5) for t in range(10))
    assert backend.num_iterations(config) == 4 + 3 * 2
    draw_index = backend.draw_index(config)
    assert [draw_index(t) for t in range(10)] == [None] * 5 + [0, None, 1, None, 2]  # after 6, 8 and 10 steps


def test_cyclical_schedule_follows_zhang_et_al():
    config = CyclicalConfig(num_samples=6, num_cycles=3, thin=2, exploration=0.5, step_size=0.4)
    backend = CyclicalSGMCMCBackend()
    kernel, length = backend.kernel(zero_gradient, config, num_data=1), config.length
    total = backend.num_iterations(config)
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
    draw_index = backend.draw_index(config)
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
