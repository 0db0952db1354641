"""The ``mc-dropout`` backend (Gal & Ghahramani 2016) and the MLP's dropout-rate option."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference import load_posterior
from inference.fitting import fit
from inference.backends.mc_dropout import DEFAULT_DROPOUT, MCDropoutConfig
from inference.dropout import gal2016
from inference.dropout.gal2016 import GAL2016_DROPOUT_GRID
from inference.dropout.sampling import dropout_layers
from lab.runs.spec import RunSpec, resolve_backend_options
from torch.utils.data import DataLoader, TensorDataset
from zoo.data import load_dataset
from zoo.architectures import build_architecture
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import GaussianLikelihood

OPTIONS = dict(epochs=20, batch_size=16, progress=False)


def _data(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, :1] * x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g)


def _bnn(stochastic="all", dropout=0.0, learn_noise=True, scale=1.0):
    torch.manual_seed(0)
    net = build_architecture("mlp", 3, 1, hidden=[16], dropout=dropout)
    return BayesianNetwork(net, stochastic=stochastic, likelihood=GaussianLikelihood(learn_noise=learn_noise),
                           output_dim=1, target_loc=torch.tensor([0.5]), target_scale=torch.tensor([scale]))


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


def test_the_noise_precision_is_refitted_to_the_mc_predictive_on_the_training_rows():
    """Learned under dropout, τ absorbs the masks' spread; the stored draws carry the τ that maximises the
    mixture over the stored masks on the training rows plus its log prior, one
    value in every draw, and below the dropped-out fit's own τ the mixture would be counted twice."""
    x, y = _data()
    bnn = _bnn()
    posterior = fit(bnn, x, y, backend="mc-dropout", seed=0, dropout=0.3, num_samples=100, **OPTIONS)
    tau = posterior.draws["noise_precision"][0]  # [S, 1]
    assert torch.equal(tau, tau[:1].expand_as(tau))
    weights = {k: v[0] for k, v in posterior.draws.items() if k != "noise_precision"}
    with torch.no_grad():
        f = torch.stack([bnn.forward_single({k: v[s] for k, v in weights.items()}, x) for s in range(100)])
    prior = bnn.likelihood.latent_priors(1)["noise_precision"]

    def objective(precision):
        latents = {"noise_precision": torch.full((1, 1), precision)}
        log_lik = bnn.likelihood.log_prob(f, y, latents).logsumexp(0).sum()  # y: the fit's (standardised) targets
        return float(log_lik + prior.log_prob(latents["noise_precision"][0]))

    best = float(tau[0, 0])
    assert all(objective(best * factor) < objective(best) for factor in (0.8, 0.95, 1.05, 1.25))


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
    assert posterior.info["dropout"] == 0.2
    assert torch.equal(posterior.predict(x, seed=1).f, posterior.predict(x, seed=1).f)  # its own dropout is off
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
    ({"protocol": "gal2017"}, "unknown protocol 'gal2017'.*fixed, gal2016"),
    ({"tau_grid": [0.1]}, "tau_grid is searched by protocol='gal2016' only"),
    ({"protocol": "gal2016", "dropout": 0.1}, "drop dropout="),
    ({"protocol": "gal2016", "lr": 0.1}, "option lr does not apply"),
    ({"protocol": "gal2016", "batch_size": 32}, "option batch_size does not apply"),
    ({"protocol": "gal2016", "dropout_grid": []}, "dropout_grid must be a non-empty list"),
    ({"protocol": "gal2016", "dropout_grid": [0.1, 1.0]}, r"rates in \[0, 1\)"),
    ({"protocol": "gal2016", "tau_grid": [0.5, -1.0]}, "tau_grid must be a non-empty list of positive"),
    ({"protocol": "gal2016", "tau_grid": "0.5"}, "tau_grid"),
    ({"protocol": "gal2016", "validation_fraction": 1.0}, r"validation_fraction must lie in \(0, 1\)"),
    ({"protocol": "gal2016", "length_scale": 0.0}, "length_scale must be positive"),
    ({"protocol": "gal2016", "epochs": 0}, "epochs must be at least 1"),
])
def test_bad_options(options, message):
    x, y = _data(8)
    with pytest.raises(ValueError, match=message):
        fit(_bnn(), x, y, backend="mc-dropout", progress=False, **options)


def test_needs_a_linear_weight():
    x, y = _data(8)
    with pytest.raises(ValueError, match="none of the chosen sites"):
        fit(_bnn("fc1.bias"), x, y, backend="mc-dropout", progress=False)


GAL = dict(protocol="gal2016", epochs=3, num_samples=30, progress=False)


def test_gal2016_searches_the_grid_on_held_out_rows_then_refits(monkeypatch):
    x, y = _data(40)
    calls = []
    train_cells = gal2016.train_cells

    def spy(bnn, layers, xs, ys, cells, *args):
        calls.append((xs.shape[0], list(cells)))
        return train_cells(bnn, layers, xs, ys, cells, *args)

    monkeypatch.setattr(gal2016, "train_cells", spy)
    posterior = fit(_bnn(scale=2.0), x, y, backend="mc-dropout", seed=0, dropout_grid=[0.01, 0.2],
                    tau_grid=[0.5, 4.0], **GAL)
    rows = posterior.info["validation"]
    assert [(r["dropout"], r["tau"]) for r in rows] == [(0.01, 0.5), (0.01, 4.0), (0.2, 0.5), (0.2, 4.0)]
    best = max(rows, key=lambda r: r["validation_ll"])
    chosen = (posterior.info["dropout"], posterior.info["tau"])
    assert chosen == (best["dropout"], best["tau"]) and posterior.info["num_validation"] == 8
    assert calls == [(32, [(0.01, 0.5), (0.01, 4.0), (0.2, 0.5), (0.2, 4.0)]), (40, [chosen])]  # 80 %, then all
    precision = posterior.draws["noise_precision"]  # τ (original units) in the model's units: τ · scale²
    assert precision.shape == (1, 30, 1) and torch.allclose(precision, torch.tensor(chosen[1] * 4.0))
    assert posterior.info["config"]["epochs"] == 3 and posterior.info["config"]["lr"] == 1e-3


def test_gal2016_cells_follow_the_papers_objective():
    x, y = _data(40)
    bnn = _bnn()
    layers = dropout_layers(bnn)
    config = MCDropoutConfig(protocol="gal2016", epochs=800).resolved()  # one step per epoch (40 rows < 128)
    cells = [(0.0, 1e-9), (0.0, 1e3)]  # λ = l²/(2Nτ): huge for a tiny τ, negligible for a large one
    fitted = gal2016.train_cells(bnn, layers, x, y, cells, config, 0, False)
    norms = fitted["fc1.weight"].flatten(1).norm(dim=1)
    assert float(norms[0]) < 0.2 * float(norms[1])  # the weight decay shrinks the weights
    with torch.no_grad():
        errors = [float((bnn.forward_single({n: v[c] for n, v in fitted.items()}, x) - y).pow(2).mean()) for c in (0, 1)]
    assert errors[1] < 0.5 * float(y.var()) and errors[1] < errors[0]  # the other cell fits the data
    start = gal2016.glorot_start(bnn, layers, 0)
    bound = (6 / (3 + 16)) ** 0.5
    assert float(start["fc1.weight"].abs().max()) <= bound and float(start["fc1.weight"].abs().max()) > 0.5 * bound
    assert torch.equal(start["fc1.bias"], torch.zeros(16))


def test_gal2016_without_tau_grid_learns_the_noise_and_searches_the_rate(monkeypatch):
    x, y = _data(40)
    rates = []
    fit_rate = gal2016.fit_dropout_map

    def spy(bnn, xs, ys, config, layers, rate, *args):
        rates.append((xs.shape[0], rate))
        return fit_rate(bnn, xs, ys, config, layers, rate, *args)

    monkeypatch.setattr(gal2016, "fit_dropout_map", spy)
    posterior = fit(_bnn(), x, y, backend="mc-dropout", seed=0, **GAL)
    assert [r for _, r in rates[:-1]] == list(GAL2016_DROPOUT_GRID) and all(n == 32 for n, _ in rates[:-1])
    assert rates[-1] == (40, posterior.info["dropout"]) and posterior.info["tau"] is None
    assert len(posterior.info["validation"]) == len(GAL2016_DROPOUT_GRID)


def test_gal2016_budget_and_bad_models():
    assert MCDropoutConfig().resolved().epochs == 200 and MCDropoutConfig(protocol="gal2016").resolved().epochs == 4000
    data = load_dataset("uci:yacht", split=0)
    spec = RunSpec(data="uci:yacht", backend="mc-dropout", backend_options={"protocol": "gal2016"})
    assert "epochs" not in resolve_backend_options(spec, data)  # the protocol's 4000, not the run layer's default
    assert "epochs" in resolve_backend_options(RunSpec(data="uci:yacht", backend="mc-dropout"), data)
    x, y = _data(10)
    with pytest.raises(ValueError, match="learn_noise=True"):
        fit(_bnn(learn_noise=False), x, y, backend="mc-dropout", tau_grid=[1.0], **GAL)
    with pytest.raises(ValueError, match="stochastic='all'"):
        fit(_bnn("last"), x, y, backend="mc-dropout", tau_grid=[1.0], **GAL)
    with pytest.raises(ValueError, match="not a DataLoader"):
        fit(_bnn(), DataLoader(TensorDataset(x, y), batch_size=4), backend="mc-dropout", **GAL)
    with pytest.raises(ValueError, match="both need at least one row"):
        fit(_bnn(), x[:1], y[:1], backend="mc-dropout", **GAL)
