"""Honest predictive metrics from a :class:`~inference.posterior.Prediction`.

* Test log-likelihood: mean over test points of log( (1/S) Σ_s p(y_n | x_n, w_s) ),
  computed with log-sum-exp, in original target units (per test point).
* Coverage: fraction of test targets inside the central ``level`` interval of the
  posterior predictive *including observation noise*; computed exactly from the
  predictive mixture CDF (the PIT value u_n = (1/S) Σ_s F(y_n | w_s)): y_n is inside the
  central interval iff (1−level)/2 ≤ u_n ≤ (1+level)/2.
* Classification: accuracy, NLL (same log-mean-exp), Brier score and expected
  calibration error with 15 equal-width confidence bins (Guo et al. 2017).

The ``*_from_*`` functions and :func:`calibration_bins` take the stored per-point summaries
(PIT values, mean class probabilities), so reports compute the same numbers from files.
"""
from __future__ import annotations

import torch

from zoo.checks import as_tensor
from zoo.data import check_finite_array

from inference.evaluation.circular import circular_log_predictive_density, circular_rmse
from inference.prediction import Prediction

__all__ = [
    "rmse",
    "test_log_likelihood",
    "coverage",
    "accuracy",
    "brier_score",
    "expected_calibration_error",
    "ece_from_probs",
    "calibration_bins",
    "coverage_from_pit",
    "regression_metrics",
    "classification_metrics",
    "evaluate",
    "check_evaluation_targets",
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
    return coverage_from_pit(pred.pit, level)


def coverage_from_pit(pit, level: float) -> float:
    """Fraction of PIT values ``u`` (any shape) with (1−level)/2 ≤ u ≤ (1+level)/2.

    A target lies in the central ``level`` interval of its predictive distribution iff its
    PIT value does (Gneiting & Raftery 2007).
    """
    if not 0 < level < 1:
        raise ValueError(f"coverage level must be in (0, 1), got {level}")
    pit = torch.as_tensor(pit)
    lo, hi = (1 - level) / 2, (1 + level) / 2
    return float(((pit >= lo) & (pit <= hi)).float().mean())


def accuracy(pred, y: torch.Tensor) -> float:
    """Fraction of points whose most probable class (mean probabilities) is the label."""
    return float((pred.mean.argmax(-1) == y).float().mean())


def brier_score(pred, y: torch.Tensor) -> float:
    """Mean over points of Σ_k (p_k − 1[y = k])² with the mean predictive probabilities."""
    probs = pred.mean
    onehot = torch.nn.functional.one_hot(y.long(), probs.shape[-1]).to(probs.dtype)
    return float(((probs - onehot) ** 2).sum(-1).mean())


def expected_calibration_error(pred, y: torch.Tensor, num_bins: int = 15) -> float:
    """ECE of a prediction's mean class probabilities; see :func:`ece_from_probs`."""
    return ece_from_probs(pred.mean, y, num_bins)


def ece_from_probs(probs, labels, num_bins: int = 15) -> float:
    """ECE = Σ_b (n_b / N) |accuracy_b − confidence_b| over equal-width confidence bins (Guo et al. 2017)."""
    ece = torch.zeros(())
    for confidence, accuracy_b, share in zip(*calibration_bins(probs, labels, num_bins)):
        ece = ece + share * (accuracy_b - confidence).abs()
    return float(ece)


def calibration_bins(probs, labels, num_bins: int = 15) -> tuple:
    """Reliability-diagram bins of mean class probabilities ``probs [N, K]`` against labels ``[N]``.

    Confidence is the largest class probability; bins are ``num_bins`` equal-width intervals of
    [0, 1].  Returns ``(confidence, accuracy, share)``, each ``[B]`` over the ``B`` non-empty
    bins: mean confidence, accuracy and the fraction of the ``N`` points in the bin.
    """
    probs, labels = torch.as_tensor(probs), torch.as_tensor(labels)
    if probs.dim() != 2 or labels.shape != probs.shape[:1]:
        raise ValueError(f"need probs [N, K] and labels [N], got {tuple(probs.shape)} and {tuple(labels.shape)}")
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).float()
    bins = torch.bucketize(confidence, torch.linspace(0, 1, num_bins + 1)[1:-1], right=True)
    rows = [(confidence[bins == b].mean(), correct[bins == b].mean(), (bins == b).float().mean())
            for b in range(num_bins) if (bins == b).any()]
    return tuple(torch.stack(column) for column in zip(*rows))


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


def evaluate(pred, y: torch.Tensor, period=None) -> dict:
    """The task's metrics for a prediction made with targets ``y`` (a tensor or numpy array: regression
    ``[N, T]`` in original units, or class labels ``[N]``), checked first (:func:`check_evaluation_targets`).

    ``period`` (regression): per output its period when it is an angle (``None`` for a real-valued
    output), e.g. a dataset's ``target_period``; adds ``rmse_circular`` and ``test_ll_circular``, the RMSE
    and test log-likelihood with those outputs scored on the circle (:mod:`inference.evaluation.circular`).
    """
    y = check_evaluation_targets(pred, y)
    if pred.task != "regression":
        return classification_metrics(pred, y)
    out = regression_metrics(pred, y)
    if period is not None and any(p is not None for p in period):
        out["rmse_circular"] = circular_rmse(pred.mean, y, period)
        out["test_ll_circular"] = float(circular_log_predictive_density(pred, y, period).mean())
    return out


def check_evaluation_targets(pred, y) -> torch.Tensor:
    """``y`` checked against the :class:`~inference.prediction.Prediction` ``pred`` (made with targets):
    finite, one row per predicted point; returned ``[N, T]`` (regression) or int64 labels ``[N]`` in
    ``[0, K - 1]``, on the prediction's device."""
    if not isinstance(pred, Prediction):
        raise ValueError(f"pred must be a Prediction (from Posterior.predict), got {type(pred).__name__}")
    if pred.log_lik is None:
        raise ValueError("evaluate needs a prediction made with the targets: pred = posterior.predict(x, y=y)")
    y = as_tensor(y, "y")
    points, width = pred.f.shape[1], pred.f.shape[-1]
    if y.dim() == 0 or y.shape[0] != points:
        raise ValueError(f"y has {y.shape[0] if y.dim() else 'no'} rows but the prediction is at {points} points; "
                         f"pass the targets of the predicted inputs")
    check_finite_array(y, "y")
    if pred.task == "regression":
        if y.numel() != points * width:
            raise ValueError(f"y has shape {tuple(y.shape)}; the prediction has {width} target(s) per point: "
                             f"expected [N, T] = [{points}, {width}]")
        return y.reshape(points, width).to(pred.f)
    if y.dim() != 1 or (y.is_floating_point() and bool((y != y.round()).any())):
        raise ValueError(f"y must hold integer class labels [N], got shape {tuple(y.shape)} dtype {y.dtype}")
    y = y.long()
    if int(y.min()) < 0 or int(y.max()) >= width:
        raise ValueError(f"y holds labels in [{int(y.min())}, {int(y.max())}] but the prediction has {width} "
                         f"classes [0, {width - 1}]")
    return y.to(pred.f.device)

