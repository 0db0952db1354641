"""The ``mc-dropout`` backend (Gal & Ghahramani 2016) and the MLP's dropout-rate option."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference import load_posterior
from inference.backends import fit
from inference.backends.mc_dropout import DEFAULT_DROPOUT, dropout_layers
from zoo.architectures import build_architecture
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import GaussianLikelihood

OPTIONS = dict(epochs=20, batch_size=16, progress=False)


def _data(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, :1] * x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g)


def _bnn(stochastic="all", dropout=0.0):
    torch.manual_seed(0)
    net = build_architecture("mlp", 3, 1, hidden=[16], dropout=dropout)
    return BayesianNetwork(net, stochastic=stochastic, likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)


def test_draws_are_dropout_masks_of_the_fitted_weights():
    x, y = _data()
    posterior = fit(_bnn(), x, y, backend="mc-dropout", seed=0, dropout=0.3, num_samples=400, **OPTIONS)
    assert posterior.info["dropout_sites"] == ["fc1.weight", "out.weight"] and posterior.default_num_samples == 400
    for name, inputs in (("fc1.weight", 3), ("out.weight", 16)):
        draws = posterior.draws[name][0]  # [S, out, in]
        kept = draws.abs().sum(1) > 0  # [S, in]: which input columns survived
        rate = 1 - float(kept.float().mean())
        assert rate == pytest.approx(0.3, abs=4 * (0.3 * 0.7 / (400 * inputs)) ** 0.5)  # 4 binomial sds
        scaled = draws * 0.7  # a surviving column is the fitted column / q: the same in every draw
        fitted = (scaled * kept.unsqueeze(1)).sum(0) / kept.sum(0).clamp_min(1)
        assert torch.allclose(scaled, fitted * kept.unsqueeze(1), atol=1e-6)
    biases = posterior.draws["fc1.bias"][0]
    assert torch.equal(biases, biases[:1].expand_as(biases))  # not dropped: a point estimate


def test_reproducible_for_a_seed_and_different_across_seeds(tmp_path):
    x, y = _data()
    a = fit(_bnn(), x, y, backend="mc-dropout", seed=0, num_samples=50, **OPTIONS)
    b = fit(_bnn(), x, y, backend="mc-dropout", seed=0, num_samples=50, **OPTIONS)
    c = fit(_bnn(), x, y, backend="mc-dropout", seed=1, num_samples=50, **OPTIONS)
    pa, pb, pc = (p.predict(x, y=y, seed=0) for p in (a, b, c))
    assert torch.equal(pa.f, pb.f) and torch.equal(pa.log_lik, pb.log_lik)
    assert not torch.allclose(pa.f, pc.f)
    assert float(pa.epistemic_sd.mean()) > 0  # dropout at prediction: the draws disagree
    loaded = load_posterior(a.save(tmp_path / "mcd"))
    assert torch.equal(loaded.predict(x, y=y, seed=0).f, pa.f)


def test_rate_defaults_and_the_architecture_option():
    x, y = _data(16)
    assert fit(_bnn(), x, y, backend="mc-dropout", num_samples=2, **OPTIONS).info["dropout"] == DEFAULT_DROPOUT
    bnn = _bnn(dropout=0.2)
    posterior = fit(bnn, x, y, backend="mc-dropout", num_samples=2, **OPTIONS)
    assert posterior.info["dropout"] == 0.2 and not bnn.net.training  # its own dropout layers are off
    assert list(dropout_layers(_bnn("last"))) == ["out.weight"]


def test_mlp_dropout_option():
    x = torch.randn(64, 3)
    plain, dropped = (build_architecture("mlp", 3, 2, hidden=[8], dropout=p) for p in (0.0, 0.5))
    dropped.load_state_dict(plain.state_dict())
    assert not torch.equal(dropped(x), plain(x))  # training mode: dropout acts
    dropped.eval()
    assert torch.equal(dropped(x), plain(x))  # eval mode: the plain network
    dropped.train()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hidden = F.relu(F.linear(F.dropout(x, 0.5), plain.fc1.weight, plain.fc1.bias))
        expected = F.linear(F.dropout(hidden, 0.5), plain.out.weight, plain.out.bias)
        torch.manual_seed(0)
        got = dropped(x)
    assert torch.equal(got, expected)  # the inputs of fc1 and of out are dropped
    for rate in (-0.1, 1.0, float("nan"), True):
        with pytest.raises(ValueError, match=r"dropout rate must be a number in \[0, 1\)"):
            build_architecture("mlp", 3, 1, dropout=rate)


@pytest.mark.parametrize("options, message", [
    ({"dropout": 1.0}, r"dropout rate must lie in \[0, 1\)"),
    ({"dropout": -0.5}, r"dropout rate must lie in \[0, 1\)"),
    ({"num_samples": 0}, "num_samples must be at least 1"),
])
def test_bad_options(options, message):
    x, y = _data(8)
    with pytest.raises(ValueError, match=message):
        fit(_bnn(), x, y, backend="mc-dropout", progress=False, **options)


def test_needs_a_linear_weight():
    x, y = _data(8)
    with pytest.raises(ValueError, match="none of the chosen sites"):
        fit(_bnn("fc1.bias"), x, y, backend="mc-dropout", progress=False)
