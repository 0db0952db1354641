"""Any user network: prediction in eval mode, draw-by-draw fallback for layers without vmap
batching rules, and clear refusals of networks whose forward does not return one tensor."""
import pytest
import torch
from torch import nn

from inference.fitting import fit
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import GaussianLikelihood

SVI = {"epochs": 3, "batch_size": None, "num_samples": 8, "progress": False}


def _data(n=16, shape=(3,), seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=generator)
    y = x.reshape(n, -1)[:, :1].sin() + 0.1 * torch.randn(n, 1, generator=generator)
    return x, y


def _dropout_batchnorm_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1))


class GRUNet(nn.Module):
    """Sequence regression: a GRU (no vmap batching rule in PyTorch) and a linear read-out."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(2, 4, batch_first=True)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        h, _ = self.gru(x)
        return self.out(h[:, -1])


class TupleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        out = self.fc(x)
        return out, out.detach()


@pytest.mark.parametrize("stochastic", ["all", "last"])
def test_dropout_batchnorm_net_predicts_in_eval_mode(stochastic):
    x, y = _data()
    net = _dropout_batchnorm_net()
    bnn = BayesianNetwork(net, stochastic, likelihood=GaussianLikelihood(learn_noise=True), example_input=x)
    assert bnn.batched_draws is True
    posterior = fit(bnn, x, y, **SVI)
    assert net.training  # fitting ran the network in its own (training) mode
    stats = {k: v.clone() for k, v in net.state_dict().items() if "running" in k}
    first = posterior.predict(x, y=y, seed=3)
    second = posterior.predict(x, y=y, seed=3)
    assert torch.equal(first.f, second.f) and torch.equal(first.y, second.y)
    assert torch.isfinite(first.log_lik).all()
    # the prediction at a point does not depend on the rest of the batch; one row works
    single = posterior.predict(x[:1], seed=3)
    torch.testing.assert_close(single.f[:, 0], first.f[:, 0])
    # prediction neither updates the running statistics nor leaves the network in eval mode
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in stats.items())
    assert net.training and all(m.training for m in net.modules())


def test_active_at_prediction_keeps_chosen_modules_in_training_mode():
    x, _ = _data()
    bnn = BayesianNetwork(_dropout_batchnorm_net(), "last", example_input=x)
    repeated = {k: v.expand(6, *v.shape) for k, v in bnn.initial_values().items()}
    with torch.no_grad():
        off = bnn.forward_draws(repeated, x)
        bnn.active_at_prediction = ("3",)  # the Dropout module: kept on, an MC-dropout predictive
        on = bnn.forward_draws(repeated, x)
    assert torch.equal(off[0], off[5])  # identical draws, identical outputs in eval mode
    assert not torch.equal(on[0], on[5])  # fresh dropout masks per draw
    assert bnn.net[1].training  # BatchNorm's mode is restored after the call


def test_gru_with_random_weights_fits_and_predicts_draw_by_draw():
    x, y = _data(n=12, shape=(5, 2))
    bnn = BayesianNetwork(GRUNet(), "all", example_input=x)
    assert bnn.batched_draws is False and "gru" in bnn.batching_error.lower()
    assert "one at a time" in repr(bnn)
    posterior = fit(bnn, x, y, **SVI)
    prediction = posterior.predict(x, y=y, seed=1)
    assert prediction.f.shape == (8, 12, 1) and torch.isfinite(prediction.log_lik).all()
    # the loop gives each draw's own network output
    draws = posterior.sample_params(3, seed=2)
    with torch.no_grad():
        looped = bnn.forward_draws(draws, x)
        direct = bnn.forward_single({n: v[1] for n, v in draws.items() if n in bnn._site_by_name}, x)
    torch.testing.assert_close(looped[1], direct)


def test_gru_without_example_input_is_checked_at_fit_start():
    x, y = _data(n=10, shape=(4, 2))
    bnn = BayesianNetwork(GRUNet(), "all", output_dim=1)
    assert bnn.batched_draws is None
    posterior = fit(bnn, x, y, backend="sgld", num_samples=4, warmup_steps=2, progress=False)
    assert bnn.batched_draws is False
    assert posterior.predict(x, seed=0).f.shape[1:] == (10, 1)


def test_network_returning_a_tuple_is_refused_at_construction():
    x, y = _data()
    with pytest.raises(ValueError, match="returned a tuple"):
        BayesianNetwork(TupleNet(), "all", example_input=x)
    bnn = BayesianNetwork(TupleNet(), "all", output_dim=1)  # nothing to check yet ...
    with pytest.raises(ValueError, match="returned a tuple"):  # ... so fit refuses it before any work
        fit(bnn, x, y, **SVI)


def test_network_with_a_flat_output_is_refused():
    with pytest.raises(ValueError, match=r"expected \[n, O\]"):
        BayesianNetwork(nn.Sequential(nn.Linear(3, 1), nn.Flatten(0)), "all", example_input=torch.randn(4, 3))


def test_laplace_refuses_a_network_vmap_cannot_batch_before_fitting():
    x, y = _data(n=10, shape=(4, 2))
    bnn = BayesianNetwork(GRUNet(), "all", example_input=x)
    with pytest.raises(ValueError, match="laplace backend needs a network that torch.func.vmap can batch"):
        fit(bnn, x, y, backend="laplace", progress=False)
