"""The sampled output module on cached features (inference/optim/output_head.py): found only where exact, and the
same density, gradient and outputs as the whole network."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.inference.mcmc.test_hmc import FAST
from tests.zoo.test_user_networks import GRUNet, _data, _dropout_batchnorm_net
from inference import fit
from inference.mcmc.compilation import compile_blocker
from inference.optim.output_head import head_module
from inference.optim.potential import Potential
from zoo import BayesianNetwork, ElementMasks, GaussianLikelihood


class Doubled(nn.Module):
    """A network that computes on after its last layer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return 2.0 * self.out(torch.tanh(self.fc(x)))


class Twice(nn.Module):
    """A network that runs its output module twice."""

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(3, 3)

    def forward(self, x):
        return self.out(self.out(x))[:, :1]


def _bnn(net, stochastic, x):
    torch.manual_seed(0)
    return BayesianNetwork(net, stochastic, likelihood=GaussianLikelihood(learn_noise=True), example_input=x[:2])


def _mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def test_the_head_is_found_only_where_the_network_returns_its_output():
    x, _ = _data()
    assert head_module(_bnn(_mlp(), "last", x), x) == ("2", None)
    assert head_module(_bnn(_dropout_batchnorm_net(), "last", x), x) == ("4", None)
    xs, _ = _data(shape=(5, 2))
    assert head_module(_bnn(GRUNet(), "out", xs), xs) == ("out", None)
    name, why = head_module(_bnn(_mlp(), "all", x), x)
    assert name is None and "belong to 2 modules" in why
    name, why = head_module(_bnn(Doubled(), "out", x), x)
    assert name is None and "computes on after out" in why
    name, why = head_module(_bnn(Twice(), "out", x), x)
    assert name is None and "runs 2 times" in why


@pytest.mark.parametrize("case", ["mlp", "batchnorm-dropout", "gru", "masked"])
def test_cached_features_give_the_same_density_gradient_and_outputs(case):
    x, y = _data(40, shape=(5, 2) if case == "gru" else (3,))
    if case == "gru":
        bnn = _bnn(GRUNet(), "out", x)
    elif case == "masked":
        mask = torch.zeros(1, 8, dtype=torch.bool)
        mask[0, ::2] = True
        bnn = _bnn(_mlp(), ElementMasks({"2.weight": mask}), x)
    else:
        bnn = _bnn(_dropout_batchnorm_net() if case == "batchnorm-dropout" else _mlp(), "last", x)
    name, _ = head_module(bnn, x)
    assert name is not None
    potential = Potential(bnn, x, y)
    z = 0.3 * torch.randn(3, potential.dim, generator=torch.Generator().manual_seed(0))
    rows = torch.arange(0, 40, 3)
    whole = [potential.value_and_grad(z), potential.value_and_grad(z, rows), potential.outputs(z, rows)]
    with potential.cached_head(name):
        assert potential.head is not None and potential.head.features.shape[0] == 40
        cached = [potential.value_and_grad(z), potential.value_and_grad(z, rows), potential.outputs(z, rows)]
    assert potential.head is None
    for (lp, grad), (lp_cached, grad_cached) in zip(whole[:2], cached[:2]):
        assert torch.allclose(lp, lp_cached, rtol=1e-5, atol=1e-4)
        assert torch.allclose(grad, grad_cached, rtol=1e-4, atol=1e-4)
    assert torch.allclose(whole[2], cached[2], atol=1e-5)


def test_a_recurrent_network_sampled_at_its_head_compiles_and_records_it():
    x, y = _data(30, shape=(5, 2))
    bnn = _bnn(GRUNet(), "out", x)
    assert compile_blocker(bnn) is not None and compile_blocker(bnn, "out") is None
    post = fit(bnn, x, y, backend="nuts", seed=0, progress=False, num_chains=2, warmup_steps=30, num_samples=30, **FAST)
    assert post.info["output_head"] == "out" and post.info["output_head_skipped"] is None
    whole = fit(_bnn(GRUNet(), "all", x), x, y, backend="sgld", seed=0, progress=False, num_chains=2, warmup_steps=10,
                num_samples=10, thin=1, init="current")
    assert whole.info["output_head"] is None
