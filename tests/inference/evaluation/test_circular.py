"""Scoring angles on the circle (inference.evaluation.circular) against numerical sums and integrals, and its
use by evaluate / fit_check / Dataset.target_period."""
from __future__ import annotations

import math

import pytest
import torch

from inference.evaluation.circular import (
    circular_log_predictive_density, circular_trivial_metrics, periods_tensor, wrapped_component_log_density,
)  # fmt: skip
from inference.evaluation.metrics import evaluate
from inference.evaluation.sanity import fit_check
from inference.prediction import Prediction
from zoo.data import DataError
from zoo.data.dataset import regression_dataset
from zoo.likelihoods import PredictiveMixture

P = 360.0


def brute_force(loc, scale, df, y, terms=2000):
    """log Σ_{|k| ≤ terms} p(y + kP) with torch's own distributions, float64."""
    k = torch.arange(-terms, terms + 1, dtype=torch.float64)
    dist = torch.distributions.Normal(loc, scale) if df is None else torch.distributions.StudentT(df, loc, scale)
    return torch.logsumexp(dist.log_prob(y + k * P), 0)


@pytest.mark.parametrize("loc, scale, df, y", [(-1.8, 0.5, None, 359.8), (370.0, 20.0, None, 5.0),
                                               (180.0, 250.0, None, 10.0), (-1.8, 0.5, 3.0, 359.8),
                                               (100.0, 40.0, 1.5, 300.0)])
def test_wrapped_density_equals_the_sum_over_windings(loc, scale, df, y):
    t = lambda v: torch.tensor([[[v]]], dtype=torch.float64)  # noqa: E731  [S=1, N=1, T=1]
    got = wrapped_component_log_density(t(loc), t(scale), None if df is None else t(df), torch.tensor([[y]], dtype=torch.float64),
                                        torch.tensor([P], dtype=torch.float64))
    expected = brute_force(torch.tensor(loc, dtype=torch.float64), torch.tensor(scale, dtype=torch.float64),
                           None if df is None else torch.tensor(df, dtype=torch.float64), torch.tensor(y, dtype=torch.float64))
    tolerance = (1e-6 if df is None else 1e-4) + (0 if scale <= P else 2 * math.exp(-2 * math.pi ** 2 * (scale / P) ** 2))
    assert float(got) == pytest.approx(float(expected), abs=max(tolerance, 1e-9))


@pytest.mark.parametrize("scale, df", [(5.0, None), (100.0, None), (40.0, 2.5)])
def test_wrapped_density_integrates_to_one_over_a_period(scale, df):
    grid = torch.linspace(0, P, 72001, dtype=torch.float64)[:-1]
    loc = torch.full((1, grid.numel(), 1), 350.0, dtype=torch.float64)
    density = wrapped_component_log_density(loc, torch.tensor(scale, dtype=torch.float64).reshape(1, 1, 1),
                                            None if df is None else torch.tensor(df).reshape(1, 1, 1).double(),
                                            grid.unsqueeze(-1), torch.tensor([P], dtype=torch.float64)).exp()
    assert float(density.sum() * (P / grid.numel())) == pytest.approx(1.0, abs=1e-4)


def _prediction(loc, scale, y):
    """A regression Prediction of S draws at N points with T outputs (original units) and its mixture."""
    loc, scale, y = (torch.as_tensor(v, dtype=torch.float64) for v in (loc, scale, y))
    mixture = PredictiveMixture(loc, scale.expand_as(loc))
    log_lik = torch.distributions.Normal(loc, scale).log_prob(y).sum(-1)
    pit = torch.distributions.Normal(loc, scale).cdf(y).mean(0)
    return Prediction("regression", f=loc, y=loc, noise_var=scale.expand_as(loc) ** 2, log_lik=log_lik, pit=pit,
                      mixture=mixture)


def test_circular_density_is_the_plain_one_without_a_period_and_fixes_the_wrap():
    g = torch.Generator().manual_seed(0)
    loc = 180 + 10 * torch.randn(7, 5, 2, generator=g, dtype=torch.float64)
    y = 180 + 10 * torch.randn(5, 2, generator=g, dtype=torch.float64)
    pred = _prediction(loc, torch.full((1, 1, 2), 2.0), y)
    plain = pred.log_predictive_density()
    assert torch.allclose(circular_log_predictive_density(pred, y, [None, None]), plain, atol=1e-10)
    # far from the wrap, a period changes nothing
    assert torch.allclose(circular_log_predictive_density(pred, y, [P, None]), plain, atol=1e-10)
    # a target at 359.8° predicted at −1.8° = 358.2° (sd 0.5): on the circle 1.6° off, on the line 361.6° off
    pred = _prediction(torch.tensor([[[-1.8, 50.0]]]), torch.tensor([[[0.5, 1.0]]]), torch.tensor([[359.8, 50.0]]))
    y = torch.tensor([[359.8, 50.0]])
    on_circle = float(circular_log_predictive_density(pred, y, [P, None]))
    expected = float(torch.distributions.Normal(0.0, 0.5).log_prob(torch.tensor(1.6)) + torch.distributions.Normal(0.0, 1.0).log_prob(torch.tensor(0.0)))
    assert on_circle == pytest.approx(expected, abs=1e-3)  # float32 targets
    assert float(pred.log_predictive_density()) < -2.6e5
    metrics = evaluate(pred, y, period=[P, None])
    assert metrics["test_ll_circular"] == pytest.approx(on_circle) and metrics["test_ll"] < -2.6e5
    assert "test_ll_circular" not in evaluate(pred, y) and "test_ll_circular" not in evaluate(pred, y, [None, None])


def test_failed_fit_is_judged_on_the_circle_for_angles():
    g = torch.Generator().manual_seed(1)
    y_train = (360 * torch.rand(200, 1, generator=g)).double()
    y = torch.tensor([[359.8], [10.0], [200.0]], dtype=torch.float64)
    pred = _prediction(torch.tensor([[[-1.8], [10.5], [199.0]]]), torch.tensor([[[0.5]]]), y)
    metrics = evaluate(pred, y, period=[P])
    plain = fit_check(pred, y, y_train, metrics)
    assert plain["failed_fit"] and "test LL" in plain["failed_fit_reason"]
    circular = fit_check(pred, y, y_train, metrics, period=[P])
    assert not circular["failed_fit"], circular["failed_fit_reason"]
    trivial = circular_trivial_metrics(y_train, y, [P])["test_ll_circular"]
    assert circular["trivial_test_ll_circular"] == pytest.approx(trivial)
    assert metrics["rmse_circular"] == pytest.approx(math.sqrt((1.6 ** 2 + 0.5 ** 2 + 1.0) / 3), abs=1e-4)
    assert circular["rmse_ratio"] == pytest.approx(metrics["rmse_circular"] / circular["trivial_rmse_circular"])
    assert circular["test_ll_circular_gain"] == pytest.approx(metrics["test_ll_circular"] - trivial)
    # the trivial predictor, wrapped, is at least as likely as on the line
    line = torch.distributions.Normal(y_train.mean(), y_train.std(unbiased=False)).log_prob(y).mean()
    assert trivial >= float(line)


def test_periods_must_match_the_outputs():
    with pytest.raises(ValueError, match="one per output"):
        periods_tensor([P], 2)
    x = torch.randn(10, 2).numpy()
    y = torch.randn(10, 2).numpy()
    data = regression_dataset("angles", x, y, x, y, feature_names=["a", "b"], target_names=["phi1", "phi"],
                              info={}, target_period=[P, None])
    assert data.target_period == [P, None]
    with pytest.raises(DataError, match="one per output"):
        regression_dataset("angles", x, y, x, y, feature_names=["a", "b"], target_names=["phi1", "phi"], info={},
                           target_period=[P])
    with pytest.raises(DataError, match="output phi must be a positive number"):
        regression_dataset("angles", x, y, x, y, feature_names=["a", "b"], target_names=["phi1", "phi"], info={},
                           target_period=[P, -1.0])
