"""Setting a model up as the docs say (issue 38 item 5): the likelihood is explicit in Python, and a
mistaken one is named; ``example_input`` may be left to the first fit; integer regression targets
are noted; a bare ``Posterior`` says what it is."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood
from zoo.bnn import UnbuiltNetworkError
from zoo.checks import IntegerTargetsWarning, UnstandardisedTargetsWarning

from inference import Posterior, fit

QUICK_MAP = {"backend": "map", "progress": False, "epochs": 3}


def _sine(n: int = 40):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    return x, torch.sin(x) + 0.1 * torch.randn(n, 1, generator=g)


def _net(outputs: int = 1, inputs: int = 1) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inputs, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, outputs))


class HeadFirst(nn.Module):
    """Registers its output layer first: only a forward pass shows which layer is last."""

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(8, 1)
        self.body = nn.Linear(1, 8)

    def forward(self, x):
        return self.out(torch.tanh(self.body(x)))


# ---------------------------------------------------------------------- example_input from the first fit
def test_a_network_without_example_input_is_built_by_its_first_fit():
    x, y = _sine()
    later = BayesianNetwork(_net(), stochastic="last", likelihood=GaussianLikelihood(learn_noise=True))
    assert not later.is_built and "not built yet" in repr(later)
    now = BayesianNetwork(_net(), stochastic="last", likelihood=GaussianLikelihood(learn_noise=True),
                          example_input=x[:2])
    post_later, post_now = fit(later, x, y, seed=3, **QUICK_MAP), fit(now, x, y, seed=3, **QUICK_MAP)
    assert later.is_built and later.output_dim == 1 and [s.name for s in later.sites] == ["4.weight", "4.bias"]
    assert later.site_names == now.site_names
    assert torch.equal(post_later.predict(x[:5], seed=1).f, post_now.predict(x[:5], seed=1).f)


def test_the_first_fit_picks_the_last_layer_in_forward_order():
    x, y = _sine()
    bnn = BayesianNetwork(HeadFirst(), stochastic="last")
    fit(bnn, x, y, **QUICK_MAP)
    assert [s.name for s in bnn.sites] == ["out.weight", "out.bias"]


def test_an_unbuilt_network_names_what_it_lacks_and_how_to_build_it():
    bnn = BayesianNetwork(_net(), stochastic="last")
    with pytest.raises(UnbuiltNetworkError, match=r"sites is not known yet.*fit\(bnn, x, y.*bnn.build\(x\[:2\]\)"):
        bnn.sites
    with pytest.raises(AttributeError, match="num_random is not known yet"):  # a property built on the sites
        bnn.num_random
    assert getattr(bnn, "output_dim", None) is None  # still an AttributeError for getattr's default
    with pytest.raises(UnbuiltNetworkError):
        bnn.model()  # no inputs: nothing to build from
    bnn.double()  # conversions wait for the build too
    assert bnn.build(torch.zeros(2, 1)) is bnn and bnn.target_scale.dtype == torch.float64


def test_stock_pyro_use_builds_the_model_from_its_inputs():
    import pyro
    from pyro.infer.autoguide import AutoNormal

    x, y = _sine()
    bnn = BayesianNetwork(_net(), stochastic="last")
    svi = pyro.infer.SVI(bnn.model, AutoNormal(bnn.model), pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO())
    svi.step(x, y.squeeze(-1).unsqueeze(-1))
    assert bnn.is_built and bnn.site_names == ["4.weight", "4.bias"]


def test_an_unbuilt_network_refuses_bad_arguments_at_once():
    with pytest.raises(ValueError, match="stochastic"):
        BayesianNetwork(_net(), stochastic=3.5)
    with pytest.raises(ValueError, match="target_scale"):
        BayesianNetwork(_net(), target_scale=torch.tensor([float("nan")]))
    bnn = BayesianNetwork(_net(inputs=2))
    with pytest.raises(ValueError, match=r"^x has 1 features.*built for 2"):  # the data are named, not example_input
        fit(bnn, *_sine(), **QUICK_MAP)


def test_a_dataloader_builds_the_network_too():
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _sine()
    bnn = BayesianNetwork(_net(), stochastic="last")
    fit(bnn, DataLoader(TensorDataset(x, y), batch_size=16), **QUICK_MAP)
    assert bnn.is_built and bnn.output_dim == 1


# ---------------------------------------------------------------------- the likelihood is explicit
def test_integer_labels_for_a_regression_likelihood_name_the_categorical_one():
    x = torch.randn(30, 2)
    labels = (x[:, 0] > 0).long()
    bnn = BayesianNetwork(_net(outputs=2, inputs=2), stochastic="last", example_input=x[:2])
    with pytest.raises(ValueError, match=r"integer labels.*2 outputs.*GaussianLikelihood.*"
                                         r"likelihood=CategoricalLikelihood\(\)"):
        fit(bnn, x, labels, **QUICK_MAP)
    same = BayesianNetwork(_net(outputs=2, inputs=2), stochastic="last", likelihood=CategoricalLikelihood(),
                           example_input=x[:2])
    assert fit(same, x, labels, **QUICK_MAP).predict(x).probs.shape[1:] == (30, 2)


def test_integer_regression_targets_are_fitted_with_a_note():
    x = torch.randn(30, 1)
    counts = torch.poisson(torch.exp(x)).long()
    bnn = BayesianNetwork(_net(), stochastic="last", example_input=x[:2])
    with pytest.warns(IntegerTargetsWarning, match=r"integers \(torch.int64\).*real-valued.*CategoricalLikelihood.*"
                                                  r"y.float\(\)"):
        post = fit(bnn, x, counts, **QUICK_MAP)
    assert post.predict(x, y=counts.float()).log_lik.shape[1:] == (30,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # whole numbers as floats (UCI wine quality) pass silently
        fit(bnn, x, counts.float(), **QUICK_MAP)


def test_raw_regression_targets_warn_and_the_advice_works():
    """Targets of mean 29 and sd 5 under the identity target scaling: a note naming the column, its mean and sd, and
    ``set_target_scaling``; following it is silent and predicts in original units.  Standardised targets and a
    classifier's labels pass silently."""
    x, y = _sine()
    raw = 30 + 7 * y
    bnn = BayesianNetwork(_net(), stochastic="last", example_input=x[:2])
    with pytest.warns(UnstandardisedTargetsWarning, match=r"y is not standardised \(column 0: mean 29.16, sd 5.26\).*"
                                                          r"bnn.set_target_scaling\(loc, scale\)"):
        fit(bnn, x, raw, **QUICK_MAP)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(bnn, x, y, **QUICK_MAP)  # already standardised
        loc, scale = raw.mean(0), raw.std(0)
        bnn.set_target_scaling(loc, scale)
        post = fit(bnn, x, (raw - loc) / scale, backend="map", progress=False, epochs=300)
        labels = (x[:, 0] > 0).long()
        fit(BayesianNetwork(_net(outputs=2), "last", likelihood=CategoricalLikelihood(), example_input=x[:2]), x,
            labels, **QUICK_MAP)
    assert abs(float(post.predict(x, seed=0).mean.mean()) - float(loc)) < 1.0


# ---------------------------------------------------------------------- a posterior that was never fitted
def test_a_bare_posterior_says_how_to_get_a_fitted_one():
    x, _ = _sine()
    bnn = BayesianNetwork(_net(), stochastic="last", example_input=x[:2])
    bare = Posterior(bnn)
    for call in (lambda: bare.predict(x), lambda: bare.sample_params(4), lambda: bare.to_arviz(x, x),
                 lambda: bare.save("unused")):
        with pytest.raises(NotImplementedError, match=r"holds no parameter draws.*inference.fit\(bnn, x, y"):
            call()
