"""Fidelity metrics (inference.evaluation.fidelity) against closed forms.

The regression metrics are checked on Bayesian linear regression written as a one-layer network
(``nn.Linear(2, 1)``, every weight random, known noise): its posterior is Gaussian in closed form
(``tests/inference/conftest.py``), so draws from it are an exact sampler, and its posterior predictive at ``x`` is
``N(φᵀμ, φᵀΣφ + σ²)``.  A posterior narrowed to ``N(μ, c²Σ)`` or shifted to ``N(μ + δ, Σ)`` then has the
predictive ``N(φᵀμ, c²φᵀΣφ + σ²)`` or ``N(φᵀ(μ + δ), φᵀΣφ + σ²)``, whose W2 to the exact one and whose
reference coverage are closed forms (two Gaussians).
"""
from __future__ import annotations

import math

import pytest
import torch

from inference.evaluation.fidelity import (
    W2_SAMPLES, agreement, classification_fidelity, gaussian_reference_coverage, gaussian_wasserstein2, mean_w2,
    predictive_samples, probability_coverage, quantised_mixture, reference_coverage, regression_fidelity,
    stratified_noise, total_variation, wasserstein2_empirical,
)
from inference.posterior import SamplePosterior
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior
from zoo.likelihoods import PredictiveMixture

from tests.inference.conftest import make_conjugate_regression


# ------------------------------------------------------------------ classification
def test_agreement_and_total_variation_by_hand():
    p = torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.5, 0.5], [0.2, 0.8]])
    q = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.5, 0.5], [0.1, 0.9]])
    assert agreement(p, q) == pytest.approx(3 / 4)  # the second point's top class differs; a tie picks class 0 in both
    assert total_variation(p, q) == pytest.approx((0.2 + 0.2 + 0.0 + 0.1) / 4)
    assert agreement(p, p) == 1.0 and total_variation(p, p) == 0.0
    three = torch.tensor([[0.2, 0.3, 0.5]])
    assert total_variation(three, torch.tensor([[0.5, 0.3, 0.2]])) == pytest.approx(0.3)


def test_probability_coverage_exact_sampler_and_point_mass():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 2, generator=g)

    def draws(num, seed):
        noise = torch.randn(num, 50, 2, generator=torch.Generator().manual_seed(seed))
        return torch.softmax(logits + noise, -1)

    exact = probability_coverage(draws(4000, 1), draws(4000, 2))
    assert exact == pytest.approx(0.9, abs=0.01)  # the same distribution: the interval holds 90 % of the other's draws
    point = probability_coverage(draws(1, 3), draws(4000, 2))
    assert point < 0.01  # a point estimate's interval has width 0
    record = classification_fidelity(draws(4000, 1), draws(4000, 2))
    assert record["agreement"] > 0.9 and record["total_variation"] < 0.02
    assert set(record) == {"agreement", "total_variation", "reference_coverage_90"}


@pytest.mark.parametrize("bad, message", [
    (torch.ones(3), "mean class probabilities"),
    (torch.tensor([[0.5, 0.6]]), "do not sum to 1"),
    (torch.tensor([[1.5, -0.5]]), "negative or non-finite"),
    (torch.tensor([[float("nan"), 1.0]]), "negative or non-finite"),
])
def test_classification_metrics_refuse_bad_probabilities(bad, message):
    with pytest.raises(ValueError, match=message):
        agreement(bad, torch.tensor([[0.5, 0.5]]))


def test_classification_metrics_refuse_mismatched_points():
    with pytest.raises(ValueError, match="same shape"):
        total_variation(torch.full((3, 2), 0.5), torch.full((4, 2), 0.5))
    with pytest.raises(ValueError, match=r"\[S, N, K\]"):
        probability_coverage(torch.rand(5, 3, 2), torch.rand(5, 4, 2))
    with pytest.raises(ValueError, match="level"):
        probability_coverage(torch.rand(5, 3, 2), torch.rand(5, 3, 2), level=1.0)


# ------------------------------------------------------------------ the W2 estimator
def test_w2_empirical_equal_sizes_is_the_sorted_pairing():
    a = torch.tensor([[3.0], [1.0], [2.0]])
    b = torch.tensor([[0.0], [5.0], [1.0]])
    expected = math.sqrt(((1 - 0) ** 2 + (2 - 1) ** 2 + (3 - 5) ** 2) / 3)
    assert float(wasserstein2_empirical(a, b)) == pytest.approx(expected)


def test_w2_empirical_unequal_sizes_equals_the_common_refinement():
    """Sa = 3, Sb = 4: replicating every point of a 4 times and of b 3 times gives two 12-point samples of the same
    empirical distributions, whose W2 is the sorted pairing."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 5, generator=g), torch.randn(4, 5, generator=g) + 1
    refined = wasserstein2_empirical(a.repeat_interleave(4, 0), b.repeat_interleave(3, 0))
    torch.testing.assert_close(wasserstein2_empirical(a, b), refined)
    assert float(wasserstein2_empirical(a[:1], a[:1]).abs().max()) == 0.0


def test_w2_empirical_refuses_bad_samples():
    with pytest.raises(ValueError, match="same trailing shape"):
        wasserstein2_empirical(torch.zeros(3, 2), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="finite"):
        wasserstein2_empirical(torch.tensor([[float("inf")]]), torch.zeros(2, 1))


def test_w2_of_two_gaussians_from_samples_matches_the_closed_form():
    """M samples of N(0, 1) against N(0.3, 1.5²), at 200 points: the mean estimate is within its Monte Carlo
    error (and its upward bias of order 1/M) of √(0.3² + 0.5²)."""
    g = torch.Generator().manual_seed(0)
    m, n = W2_SAMPLES, 200
    a = torch.randn(m, n, generator=g, dtype=torch.float64)
    b = 0.3 + 1.5 * torch.randn(m, n, generator=g, dtype=torch.float64)
    estimate = wasserstein2_empirical(a, b)
    exact = float(gaussian_wasserstein2(0.0, 1.0, 0.3, 1.5))
    assert float(estimate.mean()) == pytest.approx(exact, abs=4 * float(estimate.std()) / math.sqrt(n) + 0.01)
    same = wasserstein2_empirical(a, torch.randn(m, n, generator=g, dtype=torch.float64))
    assert 0 < float(same.mean()) < 0.1  # the estimator's floor for identical distributions: positive, small


def test_w2_of_two_gaussian_predictives_is_the_closed_form():
    """One component each (S = 1): the quantised mixtures of M stratified points score √((μa − μb)² + (σa − σb)²)."""
    mean_a, sd_a = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([1.0, 0.5, 2.0])
    mean_b, sd_b = torch.tensor([0.3, 1.0, -1.0]), torch.tensor([1.5, 0.1, 2.0])
    a = PredictiveMixture(mean_a.reshape(1, 3, 1), sd_a.reshape(1, 3, 1))
    b = PredictiveMixture(mean_b.reshape(1, 3, 1), sd_b.reshape(1, 3, 1))
    exact = gaussian_wasserstein2(mean_a, sd_a, mean_b, sd_b)
    per_point = wasserstein2_empirical(quantised_mixture(a), quantised_mixture(b))[:, 0]
    torch.testing.assert_close(per_point, exact, rtol=3e-3, atol=1e-3)
    assert mean_w2(a, b) == pytest.approx(float(exact.mean()), rel=3e-3)
    assert mean_w2(a, a) == 0.0


def test_stratified_noise_fills_every_stratum_once():
    eps = stratified_noise(8, 500)
    u = torch.special.ndtr(eps)  # [k, S]: stratum j of every component holds exactly one value
    assert bool(((u * 8).floor() == torch.arange(8.0, dtype=torch.float64).reshape(-1, 1)).all())
    assert float(u.mean()) == pytest.approx(0.5, abs=0.01)
    t = stratified_noise(4, 3, df=torch.full((3, 2, 1), 4.0))
    assert t.shape == (4, 3, 2, 1)
    assert torch.equal(t[..., 0, 0], t[..., 1, 0])  # one shift per component, the same at every point


def test_predictive_samples_take_every_component_in_turn():
    mixture = PredictiveMixture(torch.tensor([[[0.0]], [[10.0]]]), torch.full((2, 1, 1), 1e-6))
    draws = predictive_samples(mixture, 6, torch.Generator().manual_seed(0))
    torch.testing.assert_close(draws[:, 0, 0], torch.tensor([0.0, 10, 0, 10, 0, 10], dtype=torch.float64),
                               atol=1e-4, rtol=0)
    t = PredictiveMixture(torch.zeros(1, 1, 1), torch.ones(1, 1, 1), torch.full((1, 1, 1), 5.0))
    heavy = predictive_samples(t, 200_000, torch.Generator().manual_seed(0))
    assert float(heavy.var()) == pytest.approx(5 / 3, rel=0.05)  # Student-t(5): variance ν/(ν−2)
    assert float(quantised_mixture(t, 20_000).var()) == pytest.approx(5 / 3, rel=0.05)
    with pytest.raises(ValueError, match="at least 1"):
        predictive_samples(mixture, 0)


# ------------------------------------------------------------------ Bayesian linear regression as a network
@pytest.fixture(scope="module")
def blr():
    """The conjugate problem, a one-layer network on it, and test points reaching beyond the data (where the
    posterior's own spread is of the order of the noise)."""
    problem = make_conjugate_regression(n=40, d=2, noise_sd=0.5)
    net = torch.nn.Linear(2, 1)
    bnn = BayesianNetwork(net, stochastic="all", prior=NormalPrior(problem.prior_sd),
                          likelihood=GaussianLikelihood(noise_sd=problem.noise_sd), example_input=problem.x[:2])
    x_test = 4 * torch.randn(60, 2, generator=torch.Generator().manual_seed(5))
    phi = torch.cat([x_test, torch.ones(60, 1)], 1).double()
    mean = phi @ problem.post_mean.double()
    epistemic = ((phi @ problem.post_cov.double()) * phi).sum(1)
    return problem, bnn, x_test, phi, mean, epistemic


def _posterior_mixture(blr, seed, scale=1.0, shift=None, num=4000) -> PredictiveMixture:
    """The predictive mixture of ``num`` draws of N(μ + shift, scale² Σ) through the network's own predict."""
    problem, bnn, x_test, *_ = blr
    chol = torch.linalg.cholesky(problem.post_cov.double())
    z = torch.randn(num, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    w = problem.post_mean.double() + (0 if shift is None else shift) + scale * z @ chol.T
    draws = {"weight": w[:, :2].reshape(1, num, 1, 2).float(), "bias": w[:, 2].reshape(1, num, 1).float()}
    return SamplePosterior(bnn, draws).predict(x_test, seed=seed).mixture


def test_exact_sampler_against_itself_sits_at_the_noise_floor(blr):
    *_, mean, epistemic = blr
    reference, second, exact = (_posterior_mixture(blr, seed) for seed in (1, 2, 3))
    floor = mean_w2(second, reference)  # the noise floor: two independent exact references
    again = mean_w2(exact, reference)
    sd = (epistemic + 0.25).sqrt()
    assert floor < 0.03 * float(sd.mean())  # small beside the predictive spread
    assert 0.5 * floor < again < 2 * floor  # a third exact sampler scores the floor, not better, not worse
    assert reference_coverage(exact, reference) == pytest.approx(0.9, abs=0.005)


@pytest.mark.parametrize("scale, shift", [(0.3, None), (1.0, torch.tensor([0.15, -0.1, 0.2], dtype=torch.float64))])
def test_narrow_or_shifted_posterior_scores_the_closed_form(blr, scale, shift):
    problem, _, _, phi, mean, epistemic = blr
    reference = _posterior_mixture(blr, 1)
    approx = _posterior_mixture(blr, 4, scale=scale, shift=shift)
    sd, approx_sd = (epistemic + 0.25).sqrt(), (scale**2 * epistemic + 0.25).sqrt()
    approx_mean = mean + (0 if shift is None else phi @ shift)
    w2_exact = float(gaussian_wasserstein2(approx_mean, approx_sd, mean, sd).mean())
    floor = mean_w2(_posterior_mixture(blr, 2), reference)
    record = regression_fidelity(approx, reference)
    assert w2_exact > 5 * floor  # the defect is well above the estimator's floor ...
    assert record["w2"] == pytest.approx(w2_exact, abs=floor + 0.03 * w2_exact)  # ... and measured as the formula says
    coverage_exact = float(gaussian_reference_coverage(approx_mean, approx_sd, mean, sd).mean())
    assert coverage_exact < 0.88
    assert record["reference_coverage_90"] == pytest.approx(coverage_exact, abs=0.01)


def test_mean_w2_refuses_other_points(blr):
    a = _posterior_mixture(blr, 1, num=10)
    b = PredictiveMixture(a.loc[:, :5], a.scale)
    with pytest.raises(ValueError, match="cannot be compared"):
        mean_w2(a, b)
