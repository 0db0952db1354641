"""Every run against the trivial predictor (issue 29): the numbers and the failed-fit flag of fit_check."""
import math

import pytest
import torch
from scipy import stats

from inference.prediction import Prediction
from inference.evaluation.sanity import SCALE_LIMIT, fit_check, trivial_predictor_metrics
from zoo.likelihoods import PredictiveMixture


def _gaussian_prediction(loc, sd, y):
    """A regression Prediction with S Gaussian draws of the mean ``loc`` [S, N, 1] and noise sd ``sd``."""
    scale = torch.full_like(loc, sd)
    log_lik = torch.distributions.Normal(loc, scale).log_prob(y.unsqueeze(0)).sum(-1)
    mixture = PredictiveMixture(loc, scale)
    return Prediction("regression", loc, loc, scale ** 2, log_lik, mixture.cdf(y), mixture)


def test_trivial_predictor_matches_closed_forms():
    y_train = torch.tensor([[1.0], [2.0], [4.0], [5.0]])
    y = torch.tensor([[0.0], [3.0], [7.0]])
    out = trivial_predictor_metrics("regression", y_train, y)
    mean, sd = 3.0, math.sqrt(2.5)  # training mean and (population) sd
    assert out["rmse"] == pytest.approx(math.sqrt((9 + 0 + 16) / 3))
    assert out["test_ll"] == pytest.approx(stats.norm(mean, sd).logpdf([0.0, 3.0, 7.0]).mean())
    labels = trivial_predictor_metrics("classification", torch.tensor([0, 1, 1, 2]), torch.tensor([1, 2, 0]),
                                       num_classes=3)
    assert labels["accuracy"] == pytest.approx(1 / 3)  # always class 1, the most frequent
    assert labels["nll"] == pytest.approx(-(math.log(0.5) + 2 * math.log(0.25)) / 3)


def test_fit_check_flags_worse_than_trivial_and_exploding_scale_only():
    generator = torch.Generator().manual_seed(0)
    y_train = torch.randn(200, 1, generator=generator) * 2 + 10
    y = torch.randn(50, 1, generator=generator) * 2 + 10
    good = _gaussian_prediction(y.unsqueeze(0) + 0.1 * torch.randn(20, 50, 1, generator=generator), 0.5, y)
    metrics = {"rmse": float(((good.mean - y) ** 2).mean().sqrt()), "test_ll": float(good.log_predictive_density().mean())}
    check = fit_check(good, y, y_train, metrics)
    assert not check["failed_fit"] and check["failed_fit_reason"] == ""
    assert check["rmse_ratio"] == pytest.approx(metrics["rmse"] / check["trivial_rmse"]) and check["rmse_ratio"] < 0.2
    assert check["test_ll_gain"] == pytest.approx(metrics["test_ll"] - check["trivial_test_ll"])
    # the mean 3 target-sds off: worse than the training mean in RMSE and LL
    shifted = _gaussian_prediction(good.f + 6.0, 0.5, y)
    metrics = {"rmse": float(((shifted.mean - y) ** 2).mean().sqrt()),
               "test_ll": float(shifted.log_predictive_density().mean())}
    check = fit_check(shifted, y, y_train, metrics, train={"train_ll": -0.5, "trivial_train_ll": -2.1})
    assert check["failed_fit"] and "test RMSE" in check["failed_fit_reason"] and "test LL" in check["failed_fit_reason"]
    assert f"{metrics['rmse']:.4g}" in check["failed_fit_reason"]  # it names the numbers
    assert "beats it on its training data" in check["failed_fit_reason"]
    # one test point's predictive sd beyond SCALE_LIMIT target ranges, everything else good
    wide = torch.full_like(good.f, 0.5)
    spread = float(y_train.max() - y_train.min())
    wide[:, 0] = 2 * SCALE_LIMIT * spread
    mixture = PredictiveMixture(good.f, wide)
    exploding = Prediction("regression", good.f, good.f, wide ** 2, good.log_lik, mixture.cdf(y), mixture)
    check = fit_check(exploding, y, y_train, {"rmse": 0.1, "test_ll": 10.0})
    assert check["failed_fit"] and check["max_scale_to_range"] == pytest.approx(2 * SCALE_LIMIT, rel=1e-3)
    assert "range" in check["failed_fit_reason"] and "RMSE" not in check["failed_fit_reason"]


def test_classification_worse_than_class_frequencies_is_flagged():
    y_train = torch.tensor([0] * 8 + [1] * 2)
    y = torch.tensor([0, 0, 0, 1])
    logits = torch.tensor([[-3.0, 3.0]]).expand(5, 4, 2)  # always class 1, confidently
    log_lik = torch.log_softmax(logits, -1)[:, torch.arange(4), y]
    pred = Prediction("classification", logits, torch.ones(5, 4, dtype=torch.long), log_lik=log_lik)
    metrics = {"accuracy": 0.25, "test_ll": float(pred.log_predictive_density().mean())}
    check = fit_check(pred, y, y_train, metrics)
    assert check["trivial_accuracy"] == 0.75 and check["accuracy_ratio"] == pytest.approx(1 / 3)
    assert check["failed_fit"] and "accuracy 0.25" in check["failed_fit_reason"]
