"""The ``map`` backend: the MAP of a conjugate model, the learned noise's stationarity, save/load, bad input."""
from __future__ import annotations

import pytest
import torch

from tests.inference.conftest import flat_linear_draws, make_conjugate_regression
from inference import load_posterior
from inference.fitting import fit
from inference.posterior import SamplePosterior
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import GaussianLikelihood
from zoo.priors import NormalPrior

FULL_BATCH = dict(epochs=600, batch_size=None, lr=0.05, progress=False)


def test_map_is_the_conjugate_posterior_mode():
    """Bayesian linear regression: the MAP is the posterior mean (prior = weight decay), to optimiser accuracy."""
    data = make_conjugate_regression(prior_sd=0.2)  # a prior strong enough to move the fit
    bnn = BayesianNetwork(data.net(), prior=NormalPrior(data.prior_sd), output_dim=1,
                          likelihood=GaussianLikelihood(noise_sd=data.noise_sd))
    posterior = fit(bnn, data.x, data.y, backend="map", seed=0, **FULL_BATCH)
    assert isinstance(posterior, SamplePosterior) and posterior.num_chains == 1 and posterior.default_num_samples == 1
    point = flat_linear_draws(posterior.draws).squeeze(0)
    # the prior shrinks the fit: an unpenalised least-squares fit is measurably elsewhere
    assert torch.allclose(point, data.post_mean, atol=2e-3)
    phi = torch.cat([data.x, torch.ones(data.x.shape[0], 1)], dim=1)
    least_squares = torch.linalg.lstsq(phi, data.y).solution.squeeze(-1)
    assert (least_squares - data.post_mean).abs().max() > 0.1


def test_learned_noise_is_its_conditional_mode(conjugate_regression):
    """With τ ~ Gamma(a, b) learned, the MAP satisfies τ̂ = (N/2 + a − 1) / (b + RSS/2) at the fitted weights."""
    data = conjugate_regression
    likelihood = GaussianLikelihood(learn_noise=True, precision_concentration=2.0, precision_rate=0.5)
    bnn = BayesianNetwork(data.net(), prior=NormalPrior(data.prior_sd), output_dim=1, likelihood=likelihood)
    posterior = fit(bnn, data.x, data.y, backend="map", seed=0, **FULL_BATCH)
    values = {k: v[0] for k, v in posterior.draws.items()}
    residuals = data.y - bnn.forward_draws(values, data.x)[0]
    rss, n = float((residuals**2).sum()), data.x.shape[0]
    expected = (n / 2 + 2.0 - 1) / (0.5 + rss / 2)
    assert float(values["noise_precision"]) == pytest.approx(expected, rel=1e-2)
    prediction = posterior.predict(data.x, y=data.y)
    assert torch.allclose(prediction.noise_var, 1 / values["noise_precision"].expand_as(prediction.noise_var))


def test_map_trains_deterministic_parameters_and_round_trips(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(32, 2)
    y = x.sum(1, keepdim=True) ** 2
    net = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    before = net[0].weight.detach().clone()
    bnn = BayesianNetwork(net, stochastic="last", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)
    posterior = fit(bnn, x, y, backend="map", seed=3, epochs=20, batch_size=8, progress=False)
    assert not torch.equal(net[0].weight, before)  # the deterministic layer was fitted jointly
    assert set(posterior.draws) == {"2.weight", "2.bias", "noise_precision"}
    assert len(posterior.info["history"]["loss"]) == 20
    loaded = load_posterior(posterior.save(tmp_path / "map"))
    a, b = posterior.predict(x, y=y, seed=1), loaded.predict(x, y=y, seed=1)
    assert torch.equal(a.f, b.f) and torch.equal(a.log_lik, b.log_lik)


@pytest.mark.parametrize("options, message", [
    ({"epochs": 0}, "epochs must be at least 1"),
    ({"lr": -1.0}, "lr must be positive"),
    ({"num_samples": 10}, "unknown option"),
    ({"lr_schedule": "linear"}, "unknown lr_schedule"),
])
def test_bad_options(conjugate_regression, options, message):
    data = conjugate_regression
    bnn = BayesianNetwork(data.net(), output_dim=1)
    with pytest.raises(ValueError, match=message):
        fit(bnn, data.x, data.y, backend="map", progress=False, **options)


def test_a_short_minibatch_budget_still_ends_with_the_noise_at_its_map(conjugate_regression):
    """Minibatch Adam on log τ trails its optimum while the weights move; the fit's last step sets τ to its MAP
    for the final weights, τ̂ = (N/2 + a − 1) / (b + RSS/2), whatever the budget (here 3 epochs)."""
    data = conjugate_regression
    likelihood = GaussianLikelihood(learn_noise=True, precision_concentration=2.0, precision_rate=0.5)
    bnn = BayesianNetwork(data.net(), prior=NormalPrior(data.prior_sd), output_dim=1, likelihood=likelihood)
    posterior = fit(bnn, data.x, data.y, backend="map", seed=0, epochs=3, batch_size=16, progress=False)
    values = {k: v[0] for k, v in posterior.draws.items()}
    rss = float(((data.y - bnn.forward_draws(values, data.x)[0]) ** 2).sum())
    expected = (data.x.shape[0] / 2 + 2.0 - 1) / (0.5 + rss / 2)
    assert float(values["noise_precision"]) == pytest.approx(expected, rel=1e-4)
