"""Is a fit better than knowing nothing?  The trivial predictor and the failed-fit flag.

A run's test metrics mean little on their own: an RMSE of 5 is good or hopeless depending on
the targets.  :func:`fit_check` compares a prediction that is already made (never predicting
again) with the **trivial predictor** of its task on the same test points:

* regression: ``Normal(ȳ_train, s_train²)`` per target, the training targets' mean and sd in
  original units (its RMSE is the test targets' root mean squared deviation from ȳ_train);
* classification: the training class frequencies ``p_k`` for every point (accuracy: the share
  of the most frequent training class; log-likelihood: mean log p_{y_n}).

A run is flagged ``failed_fit`` when it is worse than the trivial predictor in RMSE or test
log-likelihood (classification: accuracy or NLL; outputs that are angles: the log-likelihood on the
circle, :mod:`inference.evaluation.circular`), or when some test point's predictive scale
exceeds ``scale_limit`` times the training targets' range (a variance head extrapolating
exponentially).  The predictive scale of a point is ``sqrt(Var_s[loc_s] + mean_s scale_s²)`` of
its predictive mixture (the sd for Gaussian draws; finite for a Student-t with ν ≤ 2, whose sd
is not).  With the fit's own performance on (a subset of) its training points
(:func:`training_fit`), the reason also says whether the fit already fails there (it
underfits: optimisation or model) or only on the test points (it overfits or extrapolates).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from inference.evaluation.circular import circular_trivial_metrics

__all__ = ["trivial_predictor_metrics", "training_fit", "fit_check", "SCALE_LIMIT"]

#: a predictive scale above this many training-target ranges flags the run
SCALE_LIMIT = 10.0

_LOG_2PI = math.log(2 * math.pi)


def _regression_trivial(y_train: torch.Tensor, y: torch.Tensor) -> dict:
    """``trivial_rmse`` and ``trivial_test_ll`` (summed over targets, mean over points) at ``y`` ``[N, T]``."""
    y_train = y_train.reshape(y_train.shape[0], -1).double()
    y = y.reshape(y.shape[0], -1).double()
    loc, scale = y_train.mean(0), y_train.std(0, unbiased=False).clamp_min(1e-12)
    z = (y - loc) / scale
    log_density = (-0.5 * z ** 2 - scale.log() - 0.5 * _LOG_2PI).sum(-1)
    return {"rmse": float(((y - loc) ** 2).mean().sqrt()), "test_ll": float(log_density.mean())}


def _class_frequencies(y_train: torch.Tensor, num_classes: int) -> torch.Tensor:
    counts = torch.bincount(y_train.reshape(-1).long(), minlength=num_classes).double()
    return counts / counts.sum()


def _classification_trivial(y_train: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict:
    probs = _class_frequencies(y_train, num_classes)
    labels = y.reshape(-1).long()
    ll = float(probs[labels].clamp_min(1e-300).log().mean())  # an unseen class: log 1e-300, not -inf
    return {"accuracy": float((labels == int(probs.argmax())).double().mean()), "test_ll": ll, "nll": -ll}


def trivial_predictor_metrics(task: str, y_train: torch.Tensor, y: torch.Tensor,
                              num_classes: Optional[int] = None) -> dict:
    """The trivial predictor's metrics at targets ``y`` (original units / labels).

    Regression: ``{"rmse", "test_ll"}`` (``y_train`` ``[N_train, T]``, ``y`` ``[N, T]``);
    classification: ``{"accuracy", "test_ll", "nll"}`` (labels ``[N_train]``, ``[N]``; ``num_classes``
    defaults to the largest label + 1).
    """
    if task == "regression":
        return _regression_trivial(y_train, y)
    if task != "classification":
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
    num_classes = num_classes or int(max(int(y_train.max()), int(y.max()))) + 1
    return _classification_trivial(y_train, y, num_classes)


def training_fit(task: str, log_lik: torch.Tensor, y: torch.Tensor, y_train: torch.Tensor) -> dict:
    """The fit's own performance on training points, from the log densities already computed there.

    Args:
        log_lik: ``[S, n]`` log p(y_n | draw s) at ``n`` training points (original units).
        y: those points' targets ``[n, T]`` (original units) or labels ``[n]``.
        y_train: all training targets or labels (the trivial predictor's data).
    Returns:
        ``{"train_ll", "trivial_train_ll"}``: the mean over the ``n`` points of the fit's log predictive
        density (log-mean-exp over the draws, as ``test_ll``) and of the trivial predictor's.
    """
    log_lik = torch.as_tensor(log_lik).double()
    num_classes = int(max(int(y_train.max()), int(y.max()))) + 1 if task == "classification" else None
    return {"train_ll": float((torch.logsumexp(log_lik, 0) - math.log(log_lik.shape[0])).mean()),
            "trivial_train_ll": trivial_predictor_metrics(task, y_train, y, num_classes)["test_ll"]}


def _predictive_scale(pred) -> torch.Tensor:
    """``[N, T]`` sqrt(Var_s[loc] + mean_s scale²) of the predictive mixture (original units)."""
    mixture = pred.mixture
    if mixture is None:
        return pred.sd
    loc, scale = mixture.loc.double(), mixture.scale.double()
    return (loc.var(0, unbiased=False) + (scale ** 2).mean(0)).sqrt()


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def fit_check(pred, y: torch.Tensor, y_train: torch.Tensor, metrics: dict, train: Optional[dict] = None,
              scale_limit: float = SCALE_LIMIT, period=None) -> dict:
    """Compare a prediction with the trivial predictor; returns the entries ``metrics.json`` gains.

    Args:
        pred: the test-set :class:`~inference.prediction.Prediction` (original units), already made.
        y: its targets (original units ``[N, T]``) or labels ``[N]``.
        y_train: the training targets (original units) or labels: the trivial predictor's data.
        metrics: the run's metrics from :func:`inference.evaluation.metrics.evaluate` (``rmse`` / ``accuracy``,
            ``test_ll``).
        train: the fit's and the trivial predictor's log-likelihood on training points
            (:func:`training_fit`), when the run has them.
        scale_limit: flag a predictive scale above this many training-target ranges.
        period: regression outputs' periods (``None`` for a real-valued output; a dataset's
            ``target_period``): with a periodic output the test log-likelihoods are compared on the
            circle — ``metrics["rmse_circular"]`` and ``metrics["test_ll_circular"]`` against the
            trivial predictor scored there (``trivial_rmse_circular``, ``trivial_test_ll_circular``,
            ``test_ll_circular_gain``; ``rmse_ratio`` is then the circular one) — as an angle
            predicted at −1° for 359° is right, not 360° off.
    Returns:
        ``trivial_*`` metrics, the ratios (``rmse_ratio`` = rmse / trivial_rmse, or
        ``accuracy_ratio`` and ``nll_ratio``), ``test_ll_gain`` (test_ll − trivial_test_ll, nats per
        point), for regression ``max_scale_to_range`` (the largest predictive scale over the
        training targets' range); with ``train`` its entries (``train_ll``, ``trivial_train_ll``);
        ``failed_fit`` (bool) and ``failed_fit_reason`` (``""`` when not failed) naming the numbers.
    """
    task = pred.task
    num_classes = pred.f.shape[-1] if task == "classification" else None
    trivial = trivial_predictor_metrics(task, y_train, y, num_classes)
    out = {f"trivial_{k}": v for k, v in trivial.items()}
    out["test_ll_gain"] = metrics["test_ll"] - trivial["test_ll"]
    reasons = []
    reference, key, on = trivial, "", ""
    if task == "regression" and period is not None and any(p is not None for p in period):
        # angles: judged on the circle, against the trivial predictor scored there
        circular = circular_trivial_metrics(y_train, y, period)
        out.update({f"trivial_{k}": v for k, v in circular.items()})
        out["test_ll_circular_gain"] = metrics["test_ll_circular"] - circular["test_ll_circular"]
        reference, key, on = circular, "_circular", " on the circle"
    rmse_value, trivial_rmse = metrics.get(f"rmse{key}"), reference.get(f"rmse{key}")
    ll, trivial_ll = metrics[f"test_ll{key}"], reference[f"test_ll{key}"]
    if task == "regression":
        out["rmse_ratio"] = rmse_value / trivial_rmse if trivial_rmse > 0 else math.inf
        if not out["rmse_ratio"] <= 1:
            reasons.append(f"test RMSE{on} {_fmt(rmse_value)} is {_fmt(out['rmse_ratio'])}x the trivial predictor's "
                           f"{_fmt(trivial_rmse)} (training mean)")
        y_train_2d = y_train.reshape(y_train.shape[0], -1)
        spread = (y_train_2d.max(0).values - y_train_2d.min(0).values).double()
        scale = _predictive_scale(pred).double()
        out["max_scale_to_range"] = float((scale / spread.clamp_min(1e-12)).max())
        if not out["max_scale_to_range"] <= scale_limit:
            reasons.append(f"the largest predictive scale is {_fmt(out['max_scale_to_range'])}x the training targets' "
                           f"range (limit {_fmt(scale_limit)}x)")
    else:
        out["accuracy_ratio"] = metrics["accuracy"] / trivial["accuracy"] if trivial["accuracy"] > 0 else math.inf
        out["nll_ratio"] = -metrics["test_ll"] / trivial["nll"] if trivial["nll"] > 0 else math.inf
        if not out["accuracy_ratio"] >= 1:
            reasons.append(f"test accuracy {_fmt(metrics['accuracy'])} is below the trivial predictor's "
                           f"{_fmt(trivial['accuracy'])} (most frequent training class)")
    if not ll - trivial_ll >= 0:
        reasons.append(f"test LL{on} {_fmt(ll)} is below the trivial predictor's {_fmt(trivial_ll)}")
    if train:
        out.update(train)
        if reasons:
            reasons.append(_training_verdict(out))
    out["failed_fit"] = bool(reasons)
    out["failed_fit_reason"] = "; ".join(reasons)
    return out


def _training_verdict(out: dict) -> str:
    """Whether the fit already fails on its training points (underfit) or only on the test points."""
    where = ("it fails on its training data too (underfit)" if out["train_ll"] < out["trivial_train_ll"]
             else "it beats it on its training data")
    return f"{where}: training LL {_fmt(out['train_ll'])} vs {_fmt(out['trivial_train_ll'])}"
