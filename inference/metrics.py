"""Honest predictive metrics from a :class:`~inference.posterior.Prediction`.

* Test log-likelihood: mean over test points of log( (1/S) Σ_s p(y_n | x_n, w_s) ),
  computed with log-sum-exp, in original target units (per test point).
* Coverage: fraction of test targets inside the central ``level`` interval of the
  posterior predictive *including observation noise*; computed exactly from the
  predictive mixture CDF (the PIT value u_n = (1/S) Σ_s F(y_n | w_s)): y_n is inside the
  central interval iff (1−level)/2 ≤ u_n ≤ (1+level)/2.
* Classification: accuracy, NLL (same log-mean-exp), Brier score and expected
  calibration error with 15 equal-width confidence bins (Guo et al. 2017).
"""
from __future__ import annotations

import torch

__all__ = [
    "rmse",
    "test_log_likelihood",
    "coverage",
    "accuracy",
    "brier_score",
    "expected_calibration_error",
    "regression_metrics",
    "classification_metrics",
    "evaluate",
    "COVERAGE_LEVELS",
]

COVERAGE_LEVELS = (0.5, 0.9, 0.95)


def rmse(pred, y: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean, over all points and outputs."""
    return float(((pred.mean - y.reshape(pred.mean.shape)) ** 2).mean().sqrt())


def test_log_likelihood(pred) -> float:
    """Mean over points of the log Monte Carlo average predictive density."""
    return float(pred.log_predictive_density().mean())


def coverage(pred, level: float) -> float:
    """Fraction of targets (all points and outputs) in the central ``level`` predictive interval."""
    if pred.pit is None:
        raise ValueError("coverage needs predictions made with targets: predict(x, y=y)")
    if not 0 < level < 1:
        raise ValueError(f"coverage level must be in (0, 1), got {level}")
    lo, hi = (1 - level) / 2, (1 + level) / 2
    return float(((pred.pit >= lo) & (pred.pit <= hi)).float().mean())


def accuracy(pred, y: torch.Tensor) -> float:
    """Fraction of points whose most probable class (mean probabilities) is the label."""
    return float((pred.mean.argmax(-1) == y).float().mean())


def brier_score(pred, y: torch.Tensor) -> float:
    """Mean over points of Σ_k (p_k − 1[y = k])² with the mean predictive probabilities."""
    probs = pred.mean
    onehot = torch.nn.functional.one_hot(y.long(), probs.shape[-1]).to(probs.dtype)
    return float(((probs - onehot) ** 2).sum(-1).mean())


def expected_calibration_error(pred, y: torch.Tensor, num_bins: int = 15) -> float:
    """ECE: Σ_b (n_b / N) |accuracy_b − confidence_b| over equal-width confidence bins."""
    probs = pred.mean
    confidence, predicted = probs.max(-1)
    correct = (predicted == y).float()
    edges = torch.linspace(0, 1, num_bins + 1)
    bins = torch.bucketize(confidence, edges[1:-1], right=True)
    ece = torch.zeros(())
    for b in range(num_bins):
        in_bin = bins == b
        if in_bin.any():
            ece = ece + in_bin.float().mean() * (correct[in_bin].mean() - confidence[in_bin].mean()).abs()
    return float(ece)


def regression_metrics(pred, y: torch.Tensor) -> dict:
    """``rmse``, ``test_ll`` and ``coverage_50/90/95`` for a prediction made with ``y`` (original units)."""
    out = {"rmse": rmse(pred, y), "test_ll": test_log_likelihood(pred)}
    for level in COVERAGE_LEVELS:
        out[f"coverage_{int(round(level * 100))}"] = coverage(pred, level)
    return out


def classification_metrics(pred, y: torch.Tensor) -> dict:
    """``accuracy``, ``test_ll`` (= −NLL), ``nll``, ``brier`` and ``ece`` (15 bins)."""
    ll = test_log_likelihood(pred)
    return {
        "accuracy": accuracy(pred, y),
        "test_ll": ll,
        "nll": -ll,
        "brier": brier_score(pred, y),
        "ece": expected_calibration_error(pred, y),
    }


def evaluate(pred, y: torch.Tensor) -> dict:
    """The task's metrics for a prediction made with targets ``y``."""
    return regression_metrics(pred, y) if pred.task == "regression" else classification_metrics(pred, y)

