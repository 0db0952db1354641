"""Tests of inference.evaluation.shift: entropies and mutual information against closed forms, AUROC, ECE and
Brier on hand-built cases, and the shift record of a fitted posterior."""

import math

import pytest
import torch

from inference.evaluation.shift import (
    MI_ZERO_TOLERANCE,
    auroc,
    evaluate_shift,
    expected_entropy,
    mutual_information,
    predictive_entropy,
    score_labelled,
    score_ood,
    shift_scalars,
)
from inference.prediction import Prediction


def _binary_entropy(p):
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def _prediction(probs, labels=None):
    """A classification Prediction whose draws have the class probabilities ``probs [S, N, K]``."""
    logits = torch.as_tensor(probs, dtype=torch.float64).log()
    log_lik = None
    if labels is not None:
        labels = torch.as_tensor(labels)
        log_lik = torch.log_softmax(logits, -1).gather(-1, labels.expand(logits.shape[0], -1).unsqueeze(-1)).squeeze(-1)
    return Prediction("classification", logits, torch.zeros(logits.shape[:2], dtype=torch.long), log_lik=log_lik)


def test_mutual_information_of_a_two_draw_bernoulli_mixture_is_the_closed_form():
    """Two equally weighted draws Bernoulli(a), Bernoulli(b): I = h((a+b)/2) − (h(a) + h(b))/2."""
    a, b = 0.9, 0.2
    probs = torch.tensor([[[a, 1 - a]], [[b, 1 - b]]])
    expected = _binary_entropy((a + b) / 2) - (_binary_entropy(a) + _binary_entropy(b)) / 2
    assert float(mutual_information(probs)) == pytest.approx(expected, rel=1e-6)
    assert float(predictive_entropy(probs)) == pytest.approx(_binary_entropy((a + b) / 2), rel=1e-6)
    assert float(expected_entropy(probs)) == pytest.approx((_binary_entropy(a) + _binary_entropy(b)) / 2, rel=1e-6)


def test_identical_draws_have_no_mutual_information_and_uniform_has_entropy_log_k():
    probs = torch.softmax(torch.randn(1, 5, 4), -1).expand(3, 5, 4)
    assert float(mutual_information(probs).max()) < MI_ZERO_TOLERANCE
    uniform = torch.full((2, 3, 7), 1 / 7)
    assert torch.allclose(predictive_entropy(uniform), torch.full((3,), math.log(7), dtype=torch.float64))
    onehot = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # 0 log 0 = 0: each draw sure, they disagree: I = ln 2
    assert float(mutual_information(onehot)) == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match=r"\[S, N, K\]"):
        mutual_information(torch.ones(3, 2))


def test_auroc_on_a_hand_counted_case():
    # pairs (out > in): 0.35 beats 0.1 not 0.4; 0.8 beats both -> 3 of 4
    assert auroc([0.1, 0.4], [0.35, 0.8]) == pytest.approx(0.75)
    assert auroc([0.1, 0.2], [0.3, 0.4]) == 1.0 and auroc([0.3, 0.4], [0.1, 0.2]) == 0.0
    assert auroc([0.5, 0.5], [0.5]) == 0.5  # ties count one half
    with pytest.raises(ValueError, match="in- and out-of-distribution"):
        auroc([], [0.1])


def test_labelled_scores_on_hand_built_probabilities():
    """Point 1: draws (0.85, 0.15), (0.95, 0.05) -> mean (0.9, 0.1), label 0: right at confidence 0.9;
    point 2: (0.2, 0.8), (0.4, 0.6) -> (0.3, 0.7), label 0: wrong at confidence 0.7."""
    probs = [[[0.85, 0.15], [0.2, 0.8]], [[0.95, 0.05], [0.4, 0.6]]]
    scores = score_labelled(_prediction(probs, [0, 0]), torch.tensor([0, 0]))
    assert scores["accuracy"] == 0.5
    assert scores["ece"] == pytest.approx(0.5 * (1 - 0.9) + 0.5 * 0.7, abs=1e-6)
    assert scores["brier"] == pytest.approx(((0.1 ** 2 + 0.1 ** 2) + (0.7 ** 2 + 0.7 ** 2)) / 2, abs=1e-6)
    assert scores["nll"] == pytest.approx(-(math.log(0.9) + math.log(0.3)) / 2, abs=1e-6)  # of the MC average
    mi = [_binary_entropy(0.9) - (_binary_entropy(0.85) + _binary_entropy(0.95)) / 2,
          _binary_entropy(0.3) - (_binary_entropy(0.2) + _binary_entropy(0.4)) / 2]
    assert scores["mi"] == pytest.approx(sum(mi) / 2, rel=1e-5)
    assert scores["entropy"] == pytest.approx((_binary_entropy(0.9) + _binary_entropy(0.3)) / 2, rel=1e-6)


def test_ood_scores_say_when_the_mutual_information_is_identically_zero():
    sure = torch.tensor([[[0.99, 0.01], [0.98, 0.02]]])
    unsure = torch.tensor([[[0.6, 0.4], [0.5, 0.5]]])
    record = score_ood(sure, unsure)  # one draw: a deterministic predictive
    assert record["auroc_entropy"] == 1.0 and record["auroc_mi"] is None and record["mi_identically_zero"]
    assert sum(record["entropy_out_histogram"]) == 2 and record["histogram_upper"] == pytest.approx(math.log(2))
    disagree = torch.tensor([[[0.9, 0.1], [0.5, 0.5]], [[0.1, 0.9], [0.5, 0.5]]])
    agree = torch.tensor([[[0.5, 0.5], [0.6, 0.4]], [[0.5, 0.5], [0.6, 0.4]]])
    record = score_ood(agree, disagree)
    assert record["auroc_mi"] == pytest.approx(0.75) and not record["mi_identically_zero"]
    assert record["mi_in"] == pytest.approx(0.0, abs=1e-12)
    flat = shift_scalars({"ood": [{"name": "x", **record}]})
    assert flat["ood_auroc_mi"] == record["auroc_mi"] and "ood_entropy_in_histogram" not in flat


def test_a_fitted_posterior_scores_every_shift_set():
    from inference import fit
    from zoo import BayesianNetwork, CategoricalLikelihood
    from zoo.architectures import MLP
    from zoo.data import load_dataset

    data = load_dataset("digits-rotated:90")
    bnn = BayesianNetwork(MLP(64, 10, hidden=(8,)), "last", likelihood=CategoricalLikelihood(),
                          example_input=data.x_train[:2])
    posterior = fit(bnn, data.x_train, data.y_train, backend="svi", epochs=3, pretrain_epochs=2, num_samples=20,
                    seed=0, progress=False)
    test = posterior.predict(data.x_test, y=data.y_test, seed=0)
    record = evaluate_shift(posterior, data.shift_sets, test, seed=0)
    assert [row["angle"] for row in record["rotation"]] == [0.0, 90.0, 180.0]
    same = score_labelled(test, data.y_test)
    assert record["rotation"][0] == {"name": "rotation 0°", "angle": 0.0, **same}  # angle 0 is the test set
    flat = shift_scalars(record)
    assert flat["rot90_accuracy"] == record["rotation"][1]["accuracy"] and flat["rot0_mi"] > 0
    ood = load_dataset("digits-ood")
    with pytest.raises(ValueError, match="regression shift is a test split"):
        evaluate_shift(posterior, ood.shift_sets, Prediction("regression", torch.zeros(1, 2, 1), torch.zeros(1, 2, 1)))
