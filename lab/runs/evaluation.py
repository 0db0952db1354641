"""A fitted posterior checked and evaluated once: :class:`RunFailed`, :func:`check_draws`, :func:`evaluate_posterior`.

:func:`lab.runs.execution.execute` and the reports of an in-memory posterior (:mod:`lab.report.rundata`)
both evaluate through :func:`evaluate_posterior`, so they hold the same numbers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from zoo.data import Dataset

from inference.evaluation.arviz_export import loo_subset
from inference.evaluation.diagnostics import convergence_metrics
from inference.evaluation.member_metrics import member_metrics
from inference.evaluation.metrics import evaluate
from inference.evaluation.sanity import fit_check, training_fit
from inference.evaluation.shift import evaluate_shift, shift_scalars
from inference.posterior import SamplePosterior

__all__ = ["RunFailed", "check_draws", "Evaluation", "evaluate_posterior"]

#: runs with at most this many random parameters keep the weight draws in ``posterior.nc``
_MAX_EXPORTED_WEIGHTS = 20000


class RunFailed(RuntimeError):
    """The fit finished but its posterior is unusable (non-finite draws or predictions, or a
    sampler whose every post-warm-up transition diverged); nothing is written."""


def check_draws(posterior) -> None:
    """:class:`RunFailed` for non-finite stored draws or a sampler whose every transition diverged."""
    if not isinstance(posterior, SamplePosterior):
        return
    backend = posterior.info.get("backend", "the sampler")
    bad = [name for name, value in posterior.draws.items() if not bool(torch.isfinite(value).all())]
    if bad:
        raise RunFailed(f"{backend}: non-finite draws of {', '.join(bad)}; the posterior is unusable")
    diverging = posterior.sample_stats.get("diverging")
    if diverging is not None and diverging.numel() and bool(diverging.bool().all()):
        raise RunFailed(f"{backend}: every one of the {diverging.numel()} post-warm-up transitions diverged; "
                        f"the draws are not from the posterior (lower step_size, raise target_accept or "
                        f"warmup_steps)")


@dataclass
class Evaluation:
    """A posterior evaluated once on a dataset: the test-set prediction (original units), its
    metrics (with member and convergence metrics), the test-set and LOO training-subset
    InferenceData, and the prediction time in seconds."""

    prediction: Any
    metrics: dict
    idata: Any
    train_idata: Any
    predict_seconds: float


def evaluate_posterior(posterior, data: Dataset, seed: int) -> Evaluation:
    """Predict ``data``'s test set once (``seed``), evaluate it and export what reports read.

    ``metrics`` also compare the prediction with the trivial predictor and the fit's own training
    points (:func:`inference.evaluation.sanity.fit_check`: ``trivial_*``, ratios, ``failed_fit`` and
    ``failed_fit_reason``).  A dataset with shift sets (``digits-rotated``, ``digits-ood``) has each
    predicted with the same seed and scored (:func:`inference.evaluation.shift.evaluate_shift`): the whole
    record in ``metrics["shift"]``, its scalars (``rot45_accuracy``, ``ood_auroc_mi``, ...) beside the others.  Raises :class:`RunFailed` when the predictions are non-finite.
    Used by :func:`execute` and
    by reports of an in-memory posterior, so both hold the same numbers.
    """
    backend = posterior.info.get("backend", "the posterior")
    regression = data.task == "regression"
    y_test = data.y_test_original() if regression else data.y_test
    started = time.perf_counter()
    prediction = posterior.predict(data.x_test, y=y_test, seed=seed)
    predict_seconds = time.perf_counter() - started
    if not bool(torch.isfinite(prediction.f).all()):
        raise RunFailed(f"{backend}: the test-set predictions are non-finite; the posterior is unusable")
    period = data.target_period if regression else None
    metrics = evaluate(prediction, y_test, period=period)
    if isinstance(posterior, SamplePosterior) and posterior.num_chains > 1:  # a mixture of members (chains)
        metrics["members"] = member_metrics(posterior, data.x_test, y_test, prediction, seed=seed)
        metrics["member_disagreement"] = metrics["members"]["disagreement"]  # a scalar for results tables
    include_weights = posterior.bnn.num_random <= _MAX_EXPORTED_WEIGHTS
    idata = posterior.to_arviz(data.x_test, y_test, seed=seed, include_weights=include_weights, prediction=prediction)
    index = loo_subset(data.n_train, seed=seed)
    y_train = data.y_train_original() if regression else data.y_train
    train_idata = posterior.to_arviz(data.x_train[index], y_train[index], seed=seed, include_weights=False)
    metrics.update(convergence_metrics(idata))
    train_log_lik = torch.as_tensor(train_idata.log_likelihood["obs"].values)  # [chain, draw, n]
    train_fit = training_fit(data.task, train_log_lik.reshape(-1, train_log_lik.shape[-1]), y_train[index],
                             y_train)
    metrics.update(fit_check(prediction, y_test, y_train, metrics, train=train_fit, period=period))
    if data.shift_sets:
        metrics["shift"] = evaluate_shift(posterior, data.shift_sets, prediction, seed=seed)
        metrics.update(shift_scalars(metrics["shift"]))
    return Evaluation(prediction, metrics, idata, train_idata, predict_seconds)
