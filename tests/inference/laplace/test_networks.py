"""Laplace on any network the other backends accept: eval mode for curvature and predictives (modes
restored, batch-normalisation statistics untouched), recurrent networks, the likelihood's latents at
their MAP for ``init="current"`` and a numeric prior precision."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from inference import fit, load_posterior
from inference.laplace.curvature import WeightLayout, ggn, jacobian_path
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior
from tests.zoo.test_user_networks import GRUNet  # a GRU (no vmap batching rule) and a linear read-out

QUICK = {"seed": 0, "progress": False, "map_steps": 200, "num_samples": 16}


def _data(n=32, shape=(3,), seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=generator)
    y = x.reshape(n, -1)[:, :1].sin() + 0.05 * torch.randn(n, 1, generator=generator)
    return x, y


class BatchNormDropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5))
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.body(x))


def _running_stats(net):
    return {k: v.clone() for k, v in net.state_dict().items() if "running" in k or "num_batches" in k}


@pytest.mark.parametrize("stochastic, predictive", [("all", "glm"), ("last", "glm"), ("all", "sample")])
def test_reload_with_a_fresh_train_mode_network_predicts_as_the_fit(tmp_path, stochastic, predictive):
    x, y = _data()
    torch.manual_seed(0)
    net = BatchNormDropoutNet()
    with torch.no_grad():  # running statistics away from their initial (0, 1), as after training
        net.body[1].running_mean.uniform_(-0.5, 0.5)
        net.body[1].running_var.uniform_(0.5, 2.0)
    bnn = BayesianNetwork(net, stochastic, NormalPrior(1.0), GaussianLikelihood(learn_noise=True), example_input=x)
    stats = _running_stats(net)
    net.train()
    post = fit(bnn, x, y, backend="laplace", predictive=predictive, hessian="full", **QUICK)
    assert net.training and all(m.training for m in net.modules())  # the fit gave the modes back
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in stats.items())
    expected = post.predict(x, y=y, seed=3)
    net.train()  # a user's net.train() after the fit changes nothing either
    again = post.predict(x, y=y, seed=3)
    assert torch.equal(again.f, expected.f) and torch.equal(again.log_lik, expected.log_lik)
    post.save(tmp_path / "post")
    fresh = BatchNormDropoutNet()  # a fresh module: train mode, other weights and statistics
    assert fresh.training
    loaded = load_posterior(tmp_path / "post", net=fresh)
    saved_stats = _running_stats(fresh)
    reloaded = loaded.predict(x, y=y, seed=3)
    torch.testing.assert_close(reloaded.f, expected.f, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(reloaded.log_lik, expected.log_lik, rtol=1e-6, atol=1e-6)
    mean, var = loaded.glm_moments(x)
    assert bool(torch.isfinite(var).all()) and bool((var > 0).all())
    assert fresh.training and all(m.training for m in fresh.modules())
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in saved_stats.items())
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in stats.items())


def test_curvature_is_the_eval_mode_networks():
    # Dropout off, BatchNorm on its running statistics: the GGN of a train-mode net equals the eval-mode one
    x, _ = _data()
    torch.manual_seed(0)
    net = BatchNormDropoutNet()
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), GaussianLikelihood(noise_sd=0.1), example_input=x)
    layout = WeightLayout(bnn)
    w = layout.flatten(bnn.initial_values())
    stats = _running_stats(net)
    net.train()
    in_train = ggn(layout, w, {}, x, "full")
    net.eval()
    in_eval = ggn(layout, w, {}, x, "full")
    assert torch.equal(in_train, in_eval) and not net.training
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in stats.items())


def test_gru_last_layer_laplace_fits_and_predicts():
    x, y = _data(n=24, shape=(5, 2))
    torch.manual_seed(0)
    bnn = BayesianNetwork(GRUNet(), "last", NormalPrior(1.0), GaussianLikelihood(learn_noise=True), example_input=x)
    layout = WeightLayout(bnn)
    assert jacobian_path(layout, layout.flatten(bnn.initial_values()), x) == "rows"  # no vmap over GRU inputs
    post = fit(bnn, x, y, backend="laplace", **QUICK)
    assert post.info["jacobian_path"] == "rows" and post.info["hessian_structure"] == "full"
    prediction = post.predict(x, y=y, seed=0)
    assert prediction.f.shape == (16, 24, 1) and bool(torch.isfinite(prediction.log_lik).all())
    # the rows path's GGN equals Σ_n J_nᵀ J_n / σ² from Jacobians taken one datum at a time
    latents = {k: v[0, 0] for k, v in post.draws.items() if k in bnn.latent_priors()}
    full = ggn(layout, post.mean, latents, x, "full")
    fn = layout.output_fn()
    jac = torch.stack([torch.autograd.functional.jacobian(lambda v: fn(v, xi[None])[0], post.mean) for xi in x])
    reference = torch.einsum("nop,nq->pq", jac.double(), jac[:, 0].double()) * float(latents["noise_precision"][0])
    torch.testing.assert_close(full, reference, rtol=1e-5, atol=1e-6 * float(reference.abs().max()))
    # KFAC needs no per-datum Jacobian: one forward pass per chunk, also through the GRU
    kfac_post = fit(bnn, x, y, backend="laplace", hessian="kfac", **QUICK)
    assert bool(torch.isfinite(kfac_post.predict(x, seed=0).f).all())


def test_init_current_sets_the_noise_to_its_map_for_the_given_network():
    x, y = _data(n=64)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(600):  # a network trained elsewhere
        optimizer.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        optimizer.step()
    bnn = BayesianNetwork(net, "last", NormalPrior(1.0), GaussianLikelihood(learn_noise=True), output_dim=1)
    post = fit(bnn, x, y, backend="laplace", init="current", progress=False, num_samples=8)
    precision = post.draws["noise_precision"][0, 0]
    # the MAP of the precision τ under its Gamma(a, b) prior, the residuals r fixed:
    # τ̂ = (a − 1 + N/2) / (b + Σ r²/2)
    with torch.no_grad():
        residuals = (net(x) - y).double()
    prior = bnn.latent_priors()["noise_precision"]
    base = prior.base_dist if isinstance(prior, torch.distributions.Independent) else prior
    a, b = float(base.concentration.reshape(-1)[0]), float(base.rate.reshape(-1)[0])
    expected = (a - 1 + len(x) / 2) / (b + float((residuals**2).sum()) / 2)
    assert float(precision[0]) == pytest.approx(expected, rel=1e-4)
    assert post.info["latents"] == "map given the weights"
    assert float(precision[0]) ** -0.5 < 0.1  # the residual scale (≈ 0.05), not the prior median


def test_numeric_prior_precision_is_an_isotropic_prior(conjugate_regression):
    c = conjugate_regression
    bnn = BayesianNetwork(c.net(), "all", NormalPrior(c.prior_sd), GaussianLikelihood(c.noise_sd), output_dim=1)
    post = fit(bnn, c.x, c.y, backend="laplace", prior_precision=4.0, map_steps=500, seed=0, progress=False,
               num_samples=4)
    phi = torch.cat([c.x, torch.ones(len(c.x), 1)], 1).double()
    precision = phi.T @ phi / c.noise_sd**2 + 4.0 * torch.eye(phi.shape[1], dtype=torch.float64)
    torch.testing.assert_close(post.covariance.double(), torch.linalg.inv(precision), rtol=1e-4, atol=1e-8)
    assert post.info["prior_precision_scale"] == 4.0


@pytest.mark.parametrize("value, message", [(-1.0, "positive finite number"), (0, "positive finite number"),
                                            ("evidence", "unknown prior_precision")])
def test_bad_prior_precision_is_a_clear_error(conjugate_regression, value, message):
    c = conjugate_regression
    bnn = BayesianNetwork(c.net(), "all", NormalPrior(1.0), GaussianLikelihood(c.noise_sd), output_dim=1)
    with pytest.raises(ValueError, match=message):
        fit(bnn, c.x, c.y, backend="laplace", prior_precision=value, progress=False)
