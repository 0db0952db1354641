"""The parts of tempered SMC (inference.smc): the conditional ESS and the bisection, systematic resampling, the
population metric and step-size rule, prior draws, and every bad-input path."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from inference.optim.potential import Potential
from inference.smc.mutation import num_leapfrog_steps
from inference.smc import (SMCConfig, adapt_step_size, build_smc, conditional_ess, effective_sample_size,
                           log_evidence_increment, next_temperature, population_metric, prior_particles,
                           systematic_resample)
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior


def test_conditional_ess_is_the_ess_of_equal_weights_and_weighs_by_current_weights():
    inc = torch.tensor([0.0, 1.0, 2.0, -1.0])
    w = inc.exp()
    assert float(conditional_ess(torch.zeros(4), inc)) == pytest.approx(float(w.sum() ** 2 / (w * w).sum()) / 4)
    log_weights = torch.tensor([0.0, -math.inf, 0.0, math.log(2.0)])  # W = (1, 0, 1, 2) / 4
    W = torch.tensor([0.25, 0.0, 0.25, 0.5])
    expected = 4 * float((W * w).sum() ** 2 / (W * w * w).sum()) / 4  # Zhou et al. 2016: N (Σ W w)² / Σ W w², over N
    assert float(conditional_ess(log_weights, inc)) == pytest.approx(expected)
    assert float(conditional_ess(log_weights, torch.zeros(4))) == pytest.approx(1.0)


def test_next_temperature_hits_the_target_or_ends_at_one():
    ll = torch.randn(500, generator=torch.Generator().manual_seed(0)) * 30 - 1e4  # an offset changes nothing
    beta = next_temperature(torch.zeros(500), ll, 0.2, 0.5)
    assert 0.2 < beta < 1
    assert float(conditional_ess(torch.zeros(500), (beta - 0.2) * ll)) == pytest.approx(0.5, abs=1e-5)  # ℓ in float32
    assert next_temperature(torch.zeros(500), ll * 1e-6, 0.2, 0.5) == 1.0  # a flat likelihood: straight to 1
    ll_dead = ll.clone()
    ll_dead[:10] = -math.inf  # particles of zero likelihood lose their weight at once
    ll_dead[10] = math.nan
    beta = next_temperature(torch.zeros(500), ll_dead, 0.0, 0.5)
    assert 0 < beta < 1
    assert float(log_evidence_increment(torch.zeros(3), torch.tensor([1.0, 1.0, 1.0]), 0.5)) == pytest.approx(0.5)
    assert float(log_evidence_increment(torch.zeros(2), torch.tensor([0.0, -math.inf]), 0.3)) == pytest.approx(math.log(0.5))


@pytest.mark.parametrize("call, message", [
    (lambda: next_temperature(torch.zeros(3), torch.zeros(3), 0.0, 1.0), "conditional ESS fraction must lie in"),
    (lambda: next_temperature(torch.zeros(3), torch.zeros(3), 0.0, 0.0), "conditional ESS fraction must lie in"),
    (lambda: next_temperature(torch.zeros(3), torch.zeros(3), 1.0, 0.5), "inverse temperature must lie in"),
    (lambda: next_temperature(torch.zeros(2), torch.tensor([-math.inf, math.nan]), 0.0, 0.5), "no particle has a finite"),
    (lambda: next_temperature(torch.zeros(2), torch.tensor([0.0, math.inf]), 0.0, 0.5), "log-likelihood \\+inf"),
    (lambda: SMCConfig(num_particles=1), "num_particles must be at least 2"),
    (lambda: SMCConfig(target_ess=1.0), "target_ess .* must lie in \\(0, 1\\)"),
    (lambda: SMCConfig(target_ess=-0.1), "target_ess .* must lie in \\(0, 1\\)"),
    (lambda: SMCConfig(num_moves=0), "num_moves .* at least 1"),
    (lambda: SMCConfig(num_leapfrog=0), "num_leapfrog .* at least 1"),
    (lambda: SMCConfig(target_accept=1.0), "target_accept must lie in"),
    (lambda: SMCConfig(step_size=0.0), "step_size must be positive"),
    (lambda: SMCConfig(step_jitter=1.0), "step_jitter must lie in"),
    (lambda: SMCConfig(max_stages=0), "max_stages must be at least 1"),
    (lambda: SMCConfig(trajectory_length=0.0), "trajectory_length must be positive"),
    (lambda: build_smc(lambda z: (z.sum(-1), z.sum(-1)), target_ess=1.5), "target_ess"),
])  # fmt: skip
def test_bad_input_raises_a_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_systematic_resampling_copies_each_particle_floor_or_ceil_of_n_w():
    g = torch.Generator().manual_seed(1)
    log_w = torch.randn(50, generator=g) * 2
    log_w[3] = -math.inf
    expected = 50 * torch.softmax(log_w.double(), 0)
    totals = torch.zeros(50, dtype=torch.float64)
    for _ in range(2000):
        idx = systematic_resample(log_w, g)
        assert idx.shape == (50,) and bool((idx[1:] >= idx[:-1]).all())  # sorted: copies adjacent
        counts = torch.bincount(idx, minlength=50).double()
        assert bool(((counts == expected.floor()) | (counts == expected.ceil())).all())
        totals += counts
    # unbiased: E N_j = N W_j; each count is Bernoulli around its floor, so its mean over 2000 has sd ≤ 0.5 / √2000
    assert float((totals / 2000 - expected).abs().max()) < 5 * 0.5 / math.sqrt(2000)
    assert effective_sample_size(torch.zeros(7)) == pytest.approx(7.0)
    assert effective_sample_size(torch.tensor([0.0, -math.inf])) == pytest.approx(1.0)


def test_population_metric_is_the_weighted_variance_and_the_step_size_rule():
    z = torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]])
    metric = population_metric(z, torch.log(torch.tensor([0.25, 0.5, 0.25])))
    assert metric.inv_mass.shape == (3, 2)
    assert metric.inv_mass[0, 0].item() == pytest.approx(2.0)  # mean 2, E(z − 2)² = 0.25·4 + 0.25·4
    assert 0 < metric.inv_mass[0, 1].item() < 1e-7  # a collapsed coordinate is floored, never zero
    assert adapt_step_size(0.1, 0.8, 0.8) == pytest.approx(0.1)
    assert adapt_step_size(0.1, 0.0, 0.8) == pytest.approx(0.1 * math.exp(-1.6))
    assert adapt_step_size(0.1, float("nan"), 0.8) == adapt_step_size(0.1, 0.0, 0.8)
    # L = min(L_max, ⌈τ / ε⌉): the integration time ε L stays τ until the cap
    assert [num_leapfrog_steps(eps, 1.0, 50) for eps in (0.3, 0.1, 0.01)] == [4, 10, 50]
    assert num_leapfrog_steps(2.0, 1.0, 50) == 1 and num_leapfrog_steps(0.01, None, 7) == 7


def _noise_bnn():
    torch.manual_seed(0)
    return BayesianNetwork(nn.Linear(2, 1), "all", NormalPrior(2.0), GaussianLikelihood(learn_noise=True), output_dim=1)


def test_prior_particles_are_seeded_prior_draws_in_unconstrained_coordinates():
    bnn = _noise_bnn()
    x, y = torch.randn(5, 2), torch.randn(5, 1)
    potential = Potential(bnn, x, y)
    state = torch.random.get_rng_state()
    z = prior_particles(potential, 4000, torch.Generator().manual_seed(3))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left as it was
    assert torch.equal(z, prior_particles(potential, 4000, torch.Generator().manual_seed(3)))
    assert z.shape == (4000, potential.dim)
    values, _ = potential.unpack(z)
    assert float(values["weight"].std()) == pytest.approx(2.0, rel=0.05)  # Normal(0, 2²) weights
    precision_prior = potential.priors["noise_precision"]
    assert float(values["noise_precision"].mean()) == pytest.approx(float(precision_prior.mean), rel=0.1)
    log_prior, log_lik = potential.prior_and_likelihood(z[:8])
    assert torch.allclose(log_prior + log_lik, potential.log_density(z[:8]))
    assert torch.allclose(log_lik, bnn.log_likelihood(potential.unpack(z[:8])[0], x, y).sum(-1))
