"""zoo.parameter_swap: the lean functional_call behind BayesianNetwork.forward_single."""
import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

from zoo import BayesianNetwork
from zoo.architectures import build_architecture
from zoo.parameter_swap import ParameterSlots


class Tied(nn.Module):
    """An encoder and decoder sharing one weight (tied weights, as in an autoencoder)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 3, bias=False)
        self.dec = nn.Linear(3, 4, bias=False)
        self.dec.weight = self.enc.weight  # the same Parameter object, used transposed below

    def forward(self, x):
        return torch.tanh(self.enc(x)) @ self.dec.weight


def test_swapped_matches_functional_call_bitwise_and_restores():
    torch.manual_seed(0)
    net = build_architecture("mlp", 5, 2, hidden=[7, 6])
    originals = {n: p for n, p in net.named_parameters()}
    overrides = {"fc2.weight": torch.randn(6, 7), "out.bias": torch.randn(2)}
    x = torch.randn(9, 5)
    slots = ParameterSlots(net)
    with slots.swapped(overrides):
        out = net(x)
        assert net.fc2.weight is overrides["fc2.weight"]
    assert torch.equal(out, functional_call(net, overrides, (x,)))
    assert all(p is originals[n] for n, p in net.named_parameters())  # the network's own again
    with pytest.raises(RuntimeError, match="boom"), slots.swapped(overrides):
        raise RuntimeError("boom")
    assert net.fc2.weight is originals["fc2.weight"]  # restored after an error too
    with pytest.raises(KeyError, match="fc9.weight"), slots.swapped({"fc9.weight": torch.zeros(1)}):
        pass


def test_tied_weights_are_replaced_everywhere_like_functional_call():
    torch.manual_seed(0)
    net, x, w = Tied(), torch.randn(5, 4), torch.randn(3, 4)
    with ParameterSlots(net).swapped({"enc.weight": w}):
        out = net(x)
        assert net.dec.weight is w
    torch.testing.assert_close(out, functional_call(net, {"enc.weight": w}, (x,)), rtol=0, atol=0)
    torch.testing.assert_close(out, torch.tanh(x @ w.T) @ w, rtol=0, atol=0)


def test_a_replaced_parameter_is_noticed():
    net = nn.Linear(3, 2)
    slots = ParameterSlots(net)
    net.weight = nn.Parameter(torch.ones(2, 3))  # the user swaps a parameter after the slots were built
    w = torch.zeros(2, 3)
    with slots.swapped({"weight": w}):
        assert net.weight is w
    assert torch.equal(net.weight, torch.ones(2, 3))


def test_forward_single_under_vmap_and_grad_matches_functional_call():
    torch.manual_seed(0)
    bnn = BayesianNetwork(build_architecture("mlp", 3, 1, hidden=[4]), "all", output_dim=1)
    x = torch.randn(6, 3)
    draws = {s.name: torch.randn(5, *s.shape) for s in bnn.sites}
    batched = vmap(bnn.forward_single, in_dims=(0, None))(draws, x)
    reference = vmap(lambda d: functional_call(bnn.net, d, (x,)))(draws)
    torch.testing.assert_close(batched, reference, rtol=0, atol=0)
    one = {n: v[0].requires_grad_() for n, v in draws.items()}
    grads = torch.autograd.grad(bnn.forward_single(one, x).sum(), list(one.values()))
    expected = torch.autograd.grad(functional_call(bnn.net, one, (x,)).sum(), list(one.values()))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


class Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).T


def test_parametrized_weights_swap_their_original_like_functional_call():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    nn.utils.parametrize.register_parametrization(net[0], "weight", Symmetric())
    name = "0.parametrizations.weight.original"
    assert name in dict(net.named_parameters())
    x, w = torch.randn(4, 3), torch.randn(3, 3)
    with ParameterSlots(net).swapped({name: w}):
        out = net(x)
    torch.testing.assert_close(out, functional_call(net, {name: w}, (x,)), rtol=0, atol=0)
    assert not torch.equal(out, net(x))  # the network's own weight is back
