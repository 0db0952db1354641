"""The per-member metrics of :mod:`inference.evaluation.member_metrics` on fitted ensembles: Jensen's bound on the
mixture's test LL, the members' disagreement, and a prediction that does not hold every member refused."""
from __future__ import annotations

import pytest
import torch

from inference.fitting import fit
from inference.evaluation.member_metrics import member_metrics
from tests.inference.ensembles.test_ensemble import OPTIONS, _bnn, _data
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import CategoricalLikelihood


def test_member_metrics():
    x, y = _data()
    posterior = fit(_bnn(), x, y, backend="ensemble", seed=1, num_members=3, **OPTIONS)
    x_test, y_test = _data(20)
    mixture = posterior.predict(x_test, y=y_test, seed=0)
    record = member_metrics(posterior, x_test, y_test, mixture, seed=0)
    assert record["num_members"] == 3 and len(record["per_member"]) == 3
    # log of a mean density ≥ mean of log densities (Jensen): the mixture's test_ll is at least the members' mean
    assert record["mixture"]["test_ll"] >= record["member_mean"]["test_ll"] - 1e-6
    assert 0 < record["disagreement"] <= 1
    with pytest.raises(ValueError, match="all of them"):
        member_metrics(posterior, x_test, y_test, posterior.predict(x_test, num_samples=2, y=y_test), seed=0)


def test_member_metrics_classification_disagreement():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] > 0).long()
    net = torch.nn.Linear(2, 2)
    bnn = BayesianNetwork(net, likelihood=CategoricalLikelihood(), output_dim=2)
    posterior = fit(bnn, x, y, backend="ensemble", seed=0, num_members=2, **OPTIONS)
    record = member_metrics(posterior, x, y, posterior.predict(x, y=y), seed=0)
    assert record["disagreement"] >= 0 and set(record["mixture"]) >= {"accuracy", "nll", "ece"}
