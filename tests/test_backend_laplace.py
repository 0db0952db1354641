"""The ``laplace`` backend: exactness on Bayesian linear regression, last-layer Laplace against a
dense autograd Hessian, the GGN against independently built Jacobians, the evidence-tuned prior
precision, save/load, the CLI and bad input.

laplace-torch is not used as the reference: it needs torchvision, which does not install beside
this project's torch build; every reference here is a dense float64 autograd computation.
"""
from __future__ import annotations

import math

import arviz as az
import pytest
import torch
from torch import nn

from conftest import flat_linear_draws
from inference import fit, load_posterior
from inference.backends.laplace import LaplacePosterior, log_evidence
from inference.curvature import WeightLayout, ggn
from lab.cli import main
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood, LaplacePrior, NormalPrior


def linear_bnn(c, **kwargs):
    return BayesianNetwork(c.net(), "all", NormalPrior(c.prior_sd), GaussianLikelihood(c.noise_sd), output_dim=1, **kwargs)


def test_laplace_is_exact_for_bayesian_linear_regression(conjugate_regression):
    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend="laplace", seed=0, progress=False, prior_precision="model",
               map_steps=1000, num_samples=4000)
    assert isinstance(post, LaplacePosterior) and post.info["hessian_structure"] == "full"
    # the log posterior is quadratic: its mode is the posterior mean (Adam's cosine-decayed steps reach
    # it to float32 round-off, ~1e-7 here against sds ≈ 0.08) and −∇² log π⁻¹ its covariance (exact at any w)
    assert torch.allclose(post.mean, c.post_mean, atol=1e-5)
    assert torch.allclose(post.covariance, c.post_cov, rtol=1e-4, atol=1e-4 * float(c.post_cov.abs().max()))
    draws = flat_linear_draws(post.sample_params())
    # 4000 draws: Monte Carlo error of the mean ≈ 0.016 sd; of the sd ≈ 1.1 %
    assert ((draws.mean(0) - c.post_mean) / c.post_sd).abs().max() < 0.08
    assert ((draws.std(0) / c.post_sd) - 1).abs().max() < 0.06


def _evidence(h: torch.Tensor, w: torch.Tensor, log_lik: float, delta: float, prior_var: float) -> float:
    """Laplace log evidence with prior N(0, (δ/σ_p²)⁻¹ I) around the held mode (δ-dependent terms)."""
    p0 = 1.0 / prior_var
    precision = h + delta * p0 * torch.eye(h.shape[0], dtype=h.dtype)
    return log_lik - 0.5 * delta * p0 * float(w @ w) + 0.5 * w.numel() * math.log(delta * p0) - 0.5 * float(
        torch.linalg.slogdet(precision)[1])


def test_marginal_likelihood_picks_the_evidence_maximum(conjugate_regression):
    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend="laplace", seed=0, progress=False, map_steps=500)
    delta = post.info["prior_precision_scale"]
    phi = torch.cat([c.x, torch.ones(len(c.x), 1)], 1).double()
    h = phi.T @ phi / c.noise_sd**2  # the exact Hessian of −log p(y | w) of linear regression
    w = post.mean.double()
    log_lik = post.info["map_log_likelihood"]
    best = _evidence(h, w, log_lik, delta, c.prior_sd**2)
    for factor in (0.8, 0.95, 1.05, 1.25):  # the evidence is smooth in δ: a maximum beats its neighbours
        assert best > _evidence(h, w, log_lik, delta * factor, c.prior_sd**2)
    # the module's evidence differs from the independent one by a δ-free constant
    other = 2.0 * delta
    direct = _evidence(h, w, log_lik, other, c.prior_sd**2) - best
    eig = torch.linalg.eigvalsh(h * c.prior_sd**2)
    sq_norm = float(w @ w) / c.prior_sd**2
    module = log_evidence(log_lik, eig, sq_norm, other) - log_evidence(log_lik, eig, sq_norm, delta)
    assert module == pytest.approx(direct, rel=1e-6)


def _mlp_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-2, 2, 48).unsqueeze(-1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(x.shape, generator=g)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(1, 12), nn.Tanh(), nn.Linear(12, 1))
    return x, y, net


def test_last_layer_laplace_matches_a_dense_autograd_hessian():
    x, y, net = _mlp_problem()
    bnn = BayesianNetwork(net, "last", NormalPrior(1.0), GaussianLikelihood(noise_sd=0.1), output_dim=1)
    post = fit(bnn, x, y, backend="laplace", seed=0, progress=False, prior_precision="model", predictive="glm",
               map_steps=500)
    layout = WeightLayout(bnn)
    w_map = post.mean.double()
    net64 = nn.Sequential(nn.Linear(1, 12), nn.Tanh(), nn.Linear(12, 1)).double()
    net64.load_state_dict(net.state_dict())

    def out(w, inputs):
        weight, bias = w[:12].reshape(1, 12), w[12:]
        return torch.tanh(net64[0](inputs)) @ weight.T + bias

    def neg_log_joint(w):
        return 0.5 * ((out(w, x.double()) - y.double()) ** 2).sum() / 0.1**2 + 0.5 * (w * w).sum()

    cov = torch.linalg.inv(torch.autograd.functional.hessian(neg_log_joint, w_map))
    x_test = torch.linspace(-3, 3, 9).unsqueeze(-1)
    jac = torch.autograd.functional.jacobian(lambda w: out(w, x_test.double()).squeeze(-1), w_map)  # [9, 13]
    mean_ref, var_ref = out(w_map, x_test.double()).squeeze(-1), ((jac @ cov) * jac).sum(-1)
    mean, var = post.glm_moments(x_test)
    assert layout.dim == 13
    assert torch.allclose(mean.squeeze(-1).double(), mean_ref, rtol=1e-4, atol=1e-6)
    assert torch.allclose(var.squeeze(-1).double(), var_ref, rtol=1e-4)
    # the net is linear in its last layer: the linearised (GLM) and the network predictive agree draw by draw
    sampled = LaplacePosterior(bnn, post.draws, post.mean, post.scale, "sample")
    assert torch.allclose(post.predict(x_test, seed=1).f, sampled.predict(x_test, seed=1).f, atol=1e-5)


def test_diagonal_ggn_of_a_classifier_matches_independent_jacobians():
    torch.manual_seed(0)
    x = torch.randn(30, 3)
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4))
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), CategoricalLikelihood(), output_dim=4)
    layout = WeightLayout(bnn)
    w = layout.flatten(bnn.initial_values())
    full = ggn(layout, w, {}, x, "full")
    jac = torch.autograd.functional.jacobian(lambda v: layout.output_fn()(v, x), w).double()  # [N, O, P]
    p = torch.softmax(net(x), -1).double().detach()
    lam = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    reference = torch.einsum("nop,noq,nqr->pr", jac, lam, jac)
    # float32 Jacobians and products: agreement to a few float32 round-offs of the largest entry
    tol = 1e-5 * float(reference.abs().max())
    assert torch.allclose(full, reference, atol=tol)
    assert torch.allclose(ggn(layout, w, {}, x, "diag"), reference.diagonal(), atol=tol)
    y = torch.randint(0, 4, (30,))
    post = fit(bnn, x, y, backend="laplace", seed=0, progress=False, hessian="diag", map_steps=50, num_samples=20)
    assert post.info["hessian_structure"] == "diag" and post.scale.shape == (layout.dim,)


def test_save_load_round_trip_keeps_the_glm_predictive(tmp_path, conjugate_regression):
    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend="laplace", seed=0, progress=False, predictive="glm", map_steps=300,
               num_samples=50)
    post.save(tmp_path / "post")
    loaded = load_posterior(tmp_path / "post")
    assert isinstance(loaded, LaplacePosterior) and loaded.predictive == "glm"
    assert torch.equal(loaded.scale, post.scale) and torch.equal(loaded.mean, post.mean)
    assert torch.equal(loaded.predict(c.x, y=c.y, seed=3).log_lik, post.predict(c.x, y=c.y, seed=3).log_lik)


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
def test_cli_last_layer_laplace_writes_metrics_and_a_loo_readable_netcdf(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--data", "toy1d", "--hidden", "8", "--stochastic", "last", "--backend", "laplace", "--quiet",
                 "--num-samples", "30", "--option", "map_steps=200", "--out", str(out)])
    assert code == 0
    assert (out / "metrics.json").exists()
    assert math.isfinite(az.loo(az.from_netcdf(out / "posterior.nc")).elpd_loo)


@pytest.mark.parametrize("options, message", [
    ({"hessian": "kfac"}, "unknown hessian"),
    ({"prior_precision": "cv"}, "unknown prior_precision"),
    ({"num_samples": 0}, "num_samples must be at least 1"),
    ({"map_steps": -1}, "map_steps must be non-negative"),
])
def test_bad_options_are_clear_errors(conjugate_regression, options, message):
    c = conjugate_regression
    with pytest.raises(ValueError, match=message):
        fit(linear_bnn(c), c.x, c.y, backend="laplace", progress=False, **options)


def test_model_prior_precision_needs_a_normal_prior(conjugate_regression):
    c = conjugate_regression
    bnn = BayesianNetwork(c.net(), "all", LaplacePrior(1.0), GaussianLikelihood(c.noise_sd), output_dim=1)
    with pytest.raises(ValueError, match="needs a Normal prior"):
        fit(bnn, c.x, c.y, backend="laplace", progress=False, prior_precision="model", map_steps=10)


def test_no_random_weights_is_a_clear_error(conjugate_regression):
    c = conjugate_regression
    bnn = BayesianNetwork(c.net(), "none", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)
    with pytest.raises(ValueError, match="needs random weights"):
        fit(bnn, c.x, c.y, backend="laplace", progress=False, map_steps=10)
