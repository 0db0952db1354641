"""Predictions and metrics against closed-form answers."""
import math

import pytest
import torch
from torch import nn

from inference import SamplePosterior
from inference.evaluation.metrics import (calibration_bins, coverage, coverage_from_pit, ece_from_probs, evaluate,
                               expected_calibration_error)
from inference.prediction import Prediction
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood


def point_mass_posterior(noise_sd=0.5, loc=10.0, scale=4.0, draws=1):
    """A Linear(1, 1) with weight 2, bias 0: a posterior with every draw identical."""
    bnn = BayesianNetwork(nn.Linear(1, 1), "all", likelihood=GaussianLikelihood(noise_sd), output_dim=1,
                          target_loc=torch.tensor([loc]), target_scale=torch.tensor([scale]))
    values = {"weight": torch.full((1, draws, 1, 1), 2.0), "bias": torch.zeros(1, draws, 1)}
    return SamplePosterior(bnn, values)


def test_log_density_and_coverage_are_exact_in_original_units():
    post = point_mass_posterior()
    x = torch.linspace(-1, 1, 2000).unsqueeze(-1)
    # targets drawn from the model itself, in original units (loc 10, scale 4 → noise sd 2)
    g = torch.Generator().manual_seed(0)
    y = 10 + 4 * (2 * x + 0.5 * torch.randn(x.shape, generator=g))
    pred = post.predict(x, y=y, seed=0)
    expected = torch.distributions.Normal(10 + 8 * x, 2.0).log_prob(y).squeeze(-1)
    assert torch.allclose(pred.log_predictive_density(), expected, atol=1e-5)
    assert torch.allclose(pred.mean, 10 + 8 * x, atol=1e-5)
    assert torch.allclose(pred.sd, torch.full_like(x, 2.0), atol=1e-5)
    # coverage of a correct model: binomial sd sqrt(.9*.1/2000) ≈ 0.0067 → 4 sd tolerance
    for level in (0.5, 0.9, 0.95):
        assert abs(coverage(pred, level) - level) < 4 * math.sqrt(level * (1 - level) / 2000)


def test_log_predictive_density_is_log_mean_exp():
    log_lik = torch.tensor([[-1.0, -2.0], [-3.0, -0.5], [-2.0, -2.0]])
    pred = Prediction("regression", f=torch.zeros(3, 2, 1), y=torch.zeros(3, 2, 1), log_lik=log_lik)
    manual = torch.log(torch.exp(log_lik).mean(0))
    assert torch.allclose(pred.log_predictive_density(), manual)


def test_predictions_are_chunked_and_seeded():
    torch.manual_seed(0)
    bnn = BayesianNetwork(nn.Linear(2, 3), "all", likelihood=CategoricalLikelihood(), output_dim=3)
    draws = {"weight": torch.randn(2, 25, 3, 2), "bias": torch.randn(2, 25, 3)}
    post = SamplePosterior(bnn, draws)
    x, y = torch.randn(11, 2), torch.randint(0, 3, (11,))
    a = post.predict(x, y=y, seed=4, chunk_size=7)
    b = post.predict(x, y=y, seed=4, chunk_size=50)
    assert a.f.shape == (50, 11, 3) and a.y.shape == (50, 11)
    assert torch.allclose(a.f, b.f, atol=1e-6) and torch.equal(a.y, b.y)
    loop = torch.stack([nn.functional.linear(x, w, c) for w, c in zip(draws["weight"].reshape(50, 3, 2), draws["bias"].reshape(50, 3))])
    assert torch.allclose(a.f, loop, atol=1e-5)
    metrics = evaluate(a, y)
    assert set(metrics) == {"accuracy", "test_ll", "nll", "brier", "ece"}


def test_ece_on_hand_built_probabilities():
    # two bins: 4 points at confidence 0.9 (3 correct), 2 points at 0.6 (both correct)
    probs = torch.tensor([[0.9, 0.1]] * 4 + [[0.6, 0.4]] * 2)
    pred = Prediction("classification", f=probs.log().unsqueeze(0), y=torch.zeros(1, 6))
    y = torch.tensor([0, 0, 0, 1, 0, 0])
    expected = 4 / 6 * abs(0.75 - 0.9) + 2 / 6 * abs(1.0 - 0.6)
    assert expected_calibration_error(pred, y) == pytest.approx(expected, abs=1e-6)


def test_predict_rejects_bad_inputs():
    post = point_mass_posterior()
    x = torch.randn(5, 1)
    x_bad = x.clone()
    x_bad[2, 0] = float("inf")
    with pytest.raises(ValueError, match="row"):
        post.predict(x_bad)
    with pytest.raises(ValueError, match="rows"):
        post.predict(x, y=torch.randn(4, 1))
    with pytest.raises(ValueError, match="at least 1"):
        post.predict(x, num_samples=0)
    with pytest.raises(ValueError, match="holds 1"):
        post.predict(x, num_samples=5)
    with pytest.raises(ValueError, match="y=..."):
        post.predict(x).log_predictive_density()


def test_stored_summaries_give_the_prediction_metrics():
    """Coverage from stored PIT values and ECE from stored class probabilities equal the Prediction's."""
    post = point_mass_posterior(draws=3)
    x = torch.linspace(-1, 1, 50).unsqueeze(-1)
    y = 10 + 4 * (2 * x + 0.5 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2)))
    pred = post.predict(x, y=y, seed=0)
    for level in (0.5, 0.9):
        assert coverage_from_pit(pred.summaries()["pit"], level) == coverage(pred, level)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        coverage_from_pit(pred.pit, 1.0)
    probs = torch.tensor([[0.9, 0.1]] * 4 + [[0.6, 0.4]] * 2)
    labels = torch.tensor([0, 0, 0, 1, 0, 0])
    confidence, accuracy, share = calibration_bins(probs, labels, num_bins=15)
    assert torch.allclose(confidence, torch.tensor([0.6, 0.9])) and torch.allclose(accuracy, torch.tensor([1.0, 0.75]))
    assert torch.allclose(share, torch.tensor([2 / 6, 4 / 6]))
    pred = Prediction("classification", f=probs.log().unsqueeze(0), y=torch.zeros(1, 6))
    assert ece_from_probs(probs, labels) == expected_calibration_error(pred, labels)
    with pytest.raises(ValueError, match=r"probs \[N, K\] and labels \[N\]"):
        calibration_bins(probs, labels[:5])


def test_summaries_hold_intervals_and_pit_for_regression():
    post = point_mass_posterior(draws=1)
    x = torch.zeros(4, 1)
    pred = post.predict(x, y=torch.full((4, 1), 10.0), seed=0)
    summaries = pred.summaries(levels=(0.5,))
    assert set(summaries) == {"mean", "sd", "epistemic_sd", "lower_50", "upper_50", "pit", "log_predictive_density"}
    assert torch.allclose(summaries["pit"], torch.full((4, 1), 0.5))  # the target is the predictive median
    assert set(post.predict(x).summaries()) == {"mean", "sd", "epistemic_sd", "lower_50", "upper_50", "lower_90",
                                                "upper_90"}


def test_one_draw_gaussian_interval_is_f_plus_minus_z_sigma():
    """S = 1: the central interval of Normal(f, σ) in original units (loc 10, scale 4 → σ = 2)."""
    from scipy.stats import norm

    post = point_mass_posterior()
    x = torch.linspace(-1, 1, 7).unsqueeze(-1)
    pred = post.predict(x)
    for level in (0.5, 0.9, 0.99):
        lo, hi = pred.interval(level)
        z = float(norm.ppf((1 + level) / 2))
        torch.testing.assert_close(lo, 10 + 8 * x - z * 2.0, rtol=0, atol=1e-5)
        torch.testing.assert_close(hi, 10 + 8 * x + z * 2.0, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"interval level must be in \(0, 1\)"):
        pred.interval(0.0)
    with pytest.raises(ValueError, match="no predictive mixture"):
        Prediction("regression", f=pred.f, y=pred.y, noise_var=pred.noise_var).interval(0.9)


def test_map_posterior_band_has_the_width_of_its_noise():
    """A MAP fit is one draw: its 90 % band is f ± 1.645 σ̂ (learned noise, original units), not zero width."""
    from inference.fitting import fit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, generator=g)
    y = 3 + 2 * x + 0.3 * torch.randn(x.shape, generator=g)
    bnn = BayesianNetwork(nn.Linear(1, 1), "all", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)
    post = fit(bnn, x, y, backend="map", seed=0, epochs=3, batch_size=None, progress=False)
    pred = post.predict(x, y=y)
    assert pred.num_samples == 1
    summaries = pred.summaries()
    width = summaries["upper_90"] - summaries["lower_90"]
    torch.testing.assert_close(width, 2 * 1.6448536 * pred.noise_var[0].sqrt().expand_as(width), rtol=1e-5, atol=0)
    assert float(width.min()) > 0
    assert coverage_from_pit(pred.pit, 0.9) == float(((y >= summaries["lower_90"]) & (y <= summaries["upper_90"]))
                                                     .float().mean())
