"""Metrics under distribution shift and for out-of-distribution detection (classification).

A dataset's :class:`~zoo.data.ShiftSet` s (rotated test images, held-out classes; :mod:`zoo.data.digits_shift`)
are predicted with the same posterior and seed as the test set and scored here:

* a labelled set (``kind="rotation"``, Ovadia et al. 2019): accuracy, NLL, Brier score and ECE of the
  predictive — the Monte Carlo average of the class probabilities over the S posterior draws,
  ``p̄(k | x) = (1/S) Σ_s p(k | x, w_s)`` (:func:`~inference.evaluation.metrics.classification_metrics`) —
  and the mean predictive entropy and mutual information over its points;
* an unlabelled set (``kind="ood"``): how well an uncertainty score tells its points from the
  in-distribution test points, as the area under the ROC curve (AUROC; the OOD points are the
  positives, a higher score means "more likely OOD"; scikit-learn's ``roc_auc_score``, ties counted ½),
  for two scores per point:

  - the predictive entropy ``H[p̄] = −Σ_k p̄_k log p̄_k`` (total uncertainty), and
  - the mutual information between the label and the weights (the epistemic part; Houlsby et al.
    2011's BALD), ``I = H[p̄] − (1/S) Σ_s H[p(· | x, w_s)]`` ≥ 0 (Jensen).

  A posterior whose every draw predicts the same probabilities (MAP, a closed-form probit / bridge
  Laplace predictive) has ``I ≡ 0``: its MI-AUROC is undefined (``None``) and the record says
  ``mi_identically_zero`` instead of reporting a meaningless 0.5.

Entropies are in nats, computed in float64 from the draws' softmax (0 log 0 = 0).
:func:`evaluate_shift` returns a JSON-able record (kept whole in ``metrics.json["shift"]``);
:func:`shift_scalars` flattens it into the scalar columns of experiment tables.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from inference.evaluation.metrics import classification_metrics

__all__ = [
    "predictive_entropy",
    "expected_entropy",
    "mutual_information",
    "auroc",
    "score_labelled",
    "score_ood",
    "evaluate_shift",
    "shift_scalars",
    "MI_ZERO_TOLERANCE",
    "ENTROPY_BINS",
]

#: a mutual information below this (nats) at every point counts as identically zero (float rounding of equal draws)
MI_ZERO_TOLERANCE = 1e-9
#: bins of the stored entropy / MI histograms of an OOD record, over [0, ln K]
ENTROPY_BINS = 20


def _check_probs(probs: torch.Tensor) -> torch.Tensor:
    probs = torch.as_tensor(probs)
    if probs.dim() != 3:
        raise ValueError(f"need class-probability draws [S, N, K], got shape {tuple(probs.shape)}")
    return probs.double()


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    """``−Σ_k p_k log p_k`` over the last axis (0 log 0 = 0)."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def predictive_entropy(probs) -> torch.Tensor:
    """``H[p̄]`` ``[N]`` of the Monte Carlo predictive ``p̄ = mean_s p_s`` from draws ``probs [S, N, K]`` (nats)."""
    return _entropy(_check_probs(probs).mean(0))


def expected_entropy(probs) -> torch.Tensor:
    """``(1/S) Σ_s H[p_s]`` ``[N]`` from draws ``probs [S, N, K]`` (nats): the aleatoric part."""
    return _entropy(_check_probs(probs)).mean(0)


def mutual_information(probs) -> torch.Tensor:
    """``I[y; w | x] = H[p̄] − (1/S) Σ_s H[p_s]`` ``[N]`` (nats) from draws ``probs [S, N, K]``.

    Non-negative by Jensen's inequality; float rounding below 0 is clamped to 0.
    """
    probs = _check_probs(probs)
    return (_entropy(probs.mean(0)) - _entropy(probs).mean(0)).clamp_min(0.0)


def auroc(in_scores, out_scores) -> float:
    """Area under the ROC curve of ``out_scores`` (positives) against ``in_scores`` (negatives).

    The probability that a random OOD point scores higher than a random in-distribution point, ties
    counting ½ (scikit-learn's ``roc_auc_score``): 1 separates them perfectly, 0.5 is chance.
    """
    from sklearn.metrics import roc_auc_score

    in_scores = torch.as_tensor(in_scores, dtype=torch.float64).reshape(-1).cpu()
    out_scores = torch.as_tensor(out_scores, dtype=torch.float64).reshape(-1).cpu()
    if not len(in_scores) or not len(out_scores):
        raise ValueError(f"AUROC needs in- and out-of-distribution points, got {len(in_scores)} and {len(out_scores)}")
    scores = torch.cat([in_scores, out_scores])
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("AUROC scores must be finite")
    labels = torch.cat([torch.zeros(len(in_scores)), torch.ones(len(out_scores))])
    return float(roc_auc_score(labels.numpy(), scores.numpy()))


def _uncertainty(probs: torch.Tensor) -> dict:
    total = predictive_entropy(probs)
    return {"entropy": total, "mi": (total - expected_entropy(probs)).clamp_min(0.0)}


def score_labelled(prediction, y: torch.Tensor) -> dict:
    """Metrics of a labelled shift set's :class:`~inference.prediction.Prediction` made with its labels ``y``:
    accuracy, NLL, Brier, ECE (of the MC-averaged predictive), mean predictive entropy and mean MI."""
    metrics = classification_metrics(prediction, y)
    scores = _uncertainty(prediction.probs)
    return {key: metrics[key] for key in ("accuracy", "nll", "brier", "ece")} | {
        "entropy": float(scores["entropy"].mean()), "mi": float(scores["mi"].mean())}


def _histogram(values: torch.Tensor, upper: float) -> list:
    return torch.histc(values.double().cpu(), bins=ENTROPY_BINS, min=0.0, max=upper).long().tolist()


def score_ood(in_probs, out_probs) -> dict:
    """OOD detection from class-probability draws ``[S, N, K]`` at in-distribution and OOD points.

    Returns ``auroc_entropy``, ``auroc_mi`` (``None`` when the MI is identically zero: see the module),
    ``mi_identically_zero``, the mean entropy and MI of each set, and their histograms
    (:data:`ENTROPY_BINS` equal bins of [0, ln K]; counts) for plots.
    """
    inside, outside = _uncertainty(in_probs), _uncertainty(out_probs)
    zero_mi = bool(max(inside["mi"].max(), outside["mi"].max()) < MI_ZERO_TOLERANCE)
    upper = math.log(torch.as_tensor(in_probs).shape[-1])
    record = {"auroc_entropy": auroc(inside["entropy"], outside["entropy"]),
              "auroc_mi": None if zero_mi else auroc(inside["mi"], outside["mi"]),
              "mi_identically_zero": zero_mi, "n_in": int(len(inside["mi"])), "n_out": int(len(outside["mi"])),
              "histogram_upper": upper}
    for name, scores in (("in", inside), ("out", outside)):
        for score in ("entropy", "mi"):
            record[f"{score}_{name}"] = float(scores[score].mean())
            record[f"{score}_{name}_histogram"] = _histogram(scores[score], upper)
    return record


def evaluate_shift(posterior, shift_sets, test_prediction, seed: int = 0, device: Optional[torch.device] = None) -> dict:
    """Score every :class:`~zoo.data.ShiftSet` of a classification dataset with ``posterior``.

    Each set is predicted once with the test set's ``seed`` (so a variational posterior uses the same
    weight draws), on ``device`` (default: the test prediction's).  ``test_prediction`` is the
    in-distribution test set's prediction, the negatives of the OOD scores.  Returns
    ``{"rotation": [{"name", "angle", <score_labelled>}, ...], "ood": [{"name", <score_ood>}, ...]}``
    (a kind without sets is left out).
    """
    if test_prediction.task != "classification":
        raise ValueError("shift sets are scored for classification; a regression shift is a test split "
                         "(e.g. uci-gap:NAME), scored by the usual metrics")
    device = test_prediction.f.device if device is None else device
    record: dict = {}
    for shift in shift_sets:
        x = shift.x.to(device)
        if shift.kind == "ood":
            prediction = posterior.predict(x, seed=seed)
            row = {"name": shift.name, **score_ood(test_prediction.probs, prediction.probs)}
        else:
            y = shift.y.to(device)
            row = {"name": shift.name, "angle": float(shift.value),
                   **score_labelled(posterior.predict(x, y=y, seed=seed), y)}
        record.setdefault(shift.kind, []).append(row)
    return record


def shift_scalars(record: dict) -> dict:
    """Scalar columns of a :func:`evaluate_shift` record for result tables: ``rot<angle>_<metric>`` per
    rotation (e.g. ``rot45_accuracy``) and ``ood_<score>`` for the (first) OOD set (e.g.
    ``ood_auroc_entropy``; ``ood_auroc_mi`` is ``None`` where the MI is identically zero)."""
    flat = {}
    for row in record.get("rotation", ()):
        for key in ("accuracy", "nll", "brier", "ece", "entropy", "mi"):
            flat[f"rot{row['angle']:g}_{key}"] = row[key]
    for row in record.get("ood", ())[:1]:
        for key in ("auroc_entropy", "auroc_mi", "mi_identically_zero", "entropy_in", "entropy_out", "mi_in", "mi_out"):
            flat[f"ood_{key}"] = row[key]
    return flat
