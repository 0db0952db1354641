"""The ``laplace`` backend: exactness on Bayesian linear regression, last-layer Laplace against a
dense autograd Hessian, the GGN against independently built Jacobians, the evidence-tuned prior
precision, the classification predictives, save/load, the CLI and bad input.

Every reference here is a dense float64 autograd computation or a closed form; the comparison with
laplace-torch is tests/inference/laplace/test_laplace_torch_peer.py (skipped where that optional peer is not installed).
"""
from __future__ import annotations

import copy
import math

import arviz as az
import pytest
import torch
from torch import nn

from tests.inference.conftest import flat_linear_draws
from inference import fit, load_posterior
from inference.laplace.evidence import VALIDATION_GRID, held_out_folds, held_out_steps, log_evidence
from inference.laplace.laplace_posterior import KronRoot, LaplacePosterior, bridge_log_alpha, probit_logits, validation_nll
from inference.laplace.curvature import WeightLayout, ggn, kfac
from inference.evaluation.metrics import evaluate
from lab.cli import main
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood, LaplacePrior, NormalPrior
from zoo.likelihoods import HeteroscedasticGaussianLikelihood, make_likelihood


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


@pytest.mark.parametrize("likelihood, outputs", [(GaussianLikelihood(noise_sd=0.3), 2), (CategoricalLikelihood(), 3),
                                                 (HeteroscedasticGaussianLikelihood(), 2)])
def test_kfac_blocks_are_the_exact_ggn_blocks_for_one_datum(likelihood, outputs):
    # one datum: Σ_o (g_o ⊗ a)(g_o ⊗ a)ᵀ = (a aᵀ) ⊗ Σ_o g_o g_oᵀ, so KFAC is exact (Martens & Grosse 2015)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, outputs))
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), likelihood, output_dim=outputs)
    layout = WeightLayout(bnn)
    w = layout.flatten(bnn.initial_values())
    x = torch.randn(1, 3)
    exact = ggn(layout, w, {}, x, "full")
    blocks = kfac(layout, w, {}, x)
    assert [b.module for b in blocks] == ["0", "2", "4"]
    covered = torch.cat([b.positions.reshape(-1) for b in blocks])
    assert torch.equal(covered.sort().values, torch.arange(layout.dim))  # every weight and bias, once
    tol = 1e-5 * float(exact.abs().max())
    for block in blocks:
        pos = block.positions.reshape(-1)
        assert torch.allclose(block.dense(), exact[pos[:, None], pos[None, :]], atol=tol)
    # with several data the factors' product is an approximation: the first layer's block differs
    more = torch.randn(6, 3)
    pos = blocks[0].positions.reshape(-1)
    assert not torch.allclose(kfac(layout, w, {}, more)[0].dense(), ggn(layout, w, {}, more, "full")[pos][:, pos],
                              atol=tol)


def test_kfac_laplace_is_exact_for_bayesian_linear_regression(conjugate_regression):
    # one linear layer, one output, Gaussian noise: g = 1/σ for every datum, so A ⊗ B = ΦᵀΦ/σ² exactly
    c = conjugate_regression
    kwargs = dict(seed=0, progress=False, prior_precision="model", map_steps=1000, num_samples=4000)
    post = fit(linear_bnn(c), c.x, c.y, backend="laplace", hessian="kfac", **kwargs)
    full = fit(linear_bnn(c), c.x, c.y, backend="laplace", hessian="full", **kwargs)
    assert isinstance(post.scale, KronRoot) and post.info["hessian_structure"] == "kfac"
    assert torch.allclose(post.covariance, c.post_cov, rtol=1e-4, atol=1e-4 * float(c.post_cov.abs().max()))
    x_test = torch.linspace(-3, 3, 7).unsqueeze(-1).expand(7, 2)
    (m_k, v_k), (m_f, v_f) = post.glm_moments(x_test), full.glm_moments(x_test)
    assert torch.allclose(m_k, m_f, atol=1e-5) and torch.allclose(v_k, v_f, rtol=1e-4)
    draws = flat_linear_draws(post.sample_params())  # 4000 draws: MC error of the sd ≈ 1.1 %
    assert ((draws.std(0) / c.post_sd) - 1).abs().max() < 0.06
    # the evidence-tuned δ is the same (at the same MAP): the eigenvalues of the whitened GGN agree
    tuned = [fit(linear_bnn(c), c.x, c.y, backend="laplace", hessian=h, seed=0, progress=False, map_steps=50,
                 num_samples=2).info["prior_precision_scale"] for h in ("kfac", "full")]
    assert tuned[0] == pytest.approx(tuned[1], rel=1e-4)


def test_kfac_laplace_on_an_mlp_predicts_and_round_trips(tmp_path):
    x, y, net = _mlp_problem()
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), GaussianLikelihood(learn_noise=True), output_dim=1)
    post = fit(bnn, x, y, backend="laplace", max_full_dim=10, seed=0, progress=False, map_steps=300, num_samples=100)
    assert post.info["hessian_structure"] == "kfac"  # "auto" above max_full_dim, every site in an nn.Linear
    layout = WeightLayout(bnn)
    cov = post.covariance
    assert cov.shape == (layout.dim, layout.dim) and torch.allclose(cov, cov.T, atol=1e-6)
    assert float(torch.linalg.eigvalsh(cov.double()).min()) > 0
    x_test = torch.linspace(-3, 3, 9).unsqueeze(-1)
    # the closed-form GLM variance J Σ Jᵀ equals the dense computation with the materialised Σ
    mean, var = post.glm_moments(x_test)
    jac = torch.autograd.functional.jacobian(lambda v: layout.output_fn()(v, x_test).squeeze(-1), post.mean)
    assert torch.allclose(var.squeeze(-1), ((jac @ cov) * jac).sum(-1), rtol=1e-4)
    prediction = post.predict(x_test, seed=0)
    assert bool(torch.isfinite(prediction.mean).all()) and post.info["effective_dim"] > 0
    post.save(tmp_path / "post")
    loaded = load_posterior(tmp_path / "post")
    assert isinstance(loaded.scale, KronRoot) and torch.allclose(loaded.covariance, cov)
    assert torch.equal(loaded.predict(x_test, seed=0).mean, prediction.mean)


def test_kfac_outside_linear_layers_is_a_clear_error():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(8, 1))
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), GaussianLikelihood(noise_sd=0.1), output_dim=1)
    x, y = torch.randn(8, 1, 6), torch.randn(8, 1)
    with pytest.raises(ValueError, match="nn.Linear layers; the random site '0.weight'"):
        fit(bnn, x, y, backend="laplace", hessian="kfac", progress=False)
    post = fit(bnn, x, y, backend="laplace", max_full_dim=1, progress=False, map_steps=5, num_samples=4)
    assert post.info["hessian_structure"] == "diag"  # "auto" falls back to the diagonal


@pytest.mark.parametrize("name, options", [("heteroscedastic", {"beta": 0.5}),
                                           ("studentt", {"learn_scale": True, "learn_dof": True})])
@pytest.mark.parametrize("hessian", ["full", "kfac"])
def test_laplace_with_the_heteroscedastic_and_student_t_likelihoods(name, options, hessian):
    x, y, _ = _mlp_problem()
    likelihood = make_likelihood(name, **options)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, likelihood.heads))
    bnn = BayesianNetwork(net, "all", NormalPrior(1.0), likelihood, output_dim=likelihood.heads)
    post = fit(bnn, x, y, backend="laplace", hessian=hessian, seed=0, progress=False, map_steps=200, num_samples=30)
    x_test = torch.linspace(-2.5, 2.5, 20).unsqueeze(-1)
    metrics = evaluate(post.predict(x_test, y=torch.sin(2 * x_test), seed=0), torch.sin(2 * x_test))
    assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float)), metrics
    assert post.info["effective_dim"] > 0 and math.isfinite(post.info["log_evidence"])
    # the GGN uses the likelihood's output Fisher: Σ_n J_nᵀ F_n J_n with independently built Jacobians
    layout = WeightLayout(bnn)
    latents = {k: v[0, 0] for k, v in post.draws.items() if k in bnn.latent_priors()}
    full = ggn(layout, post.mean, latents, x, "full")
    jac = torch.autograd.functional.jacobian(lambda v: layout.output_fn()(v, x), post.mean).double()  # [N, O, P]
    fisher = likelihood.output_fisher(layout.output_fn()(post.mean, x).detach(), latents).double()
    reference = torch.einsum("nop,noq,nqr->pr", jac, fisher, jac)
    assert torch.allclose(full, reference, atol=1e-5 * float(reference.abs().max()))


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
    ({"hessian": "kron"}, "unknown hessian"),
    ({"prior_precision": "cv"}, "unknown prior_precision"),
    ({"num_samples": 0}, "num_samples must be at least 1"),
    ({"map_steps": -1}, "map_steps must be non-negative"),
    ({"prior_precision_grid": []}, "prior_precision_grid must be a non-empty list of positive numbers"),
    ({"prior_precision_grid": [1.0, -2.0]}, "prior_precision_grid must be a non-empty list of positive numbers"),
    ({"validation_fraction": 1.5}, "validation_fraction must lie in"),
    ({"prior_precision": "marglik", "prior_precision_grid": [1.0]}, "apply to prior_precision='validation' only"),
    ({"prior_precision": "marglik", "validation_folds": 5}, "apply to prior_precision='validation' only"),
    ({"validation_folds": 0}, "validation_folds must be a whole number"),
    ({"validation_folds": 2.5}, "option 'validation_folds' of backend 'laplace' must be an integer"),
    ({"validation_folds": 5, "validation_fraction": 0.3}, "validation_fraction applies to one held-out split"),
    ({"validation_folds": 5}, "prior_precision='auto' is 'marglik' here"),
    ({"prior_precision_grid": [1.0]}, "prior_precision='auto' is 'marglik' here"),  # regression: auto is marglik
    ({"prior_precision": "validation"}, "scores a classifier's held-out NLL; this model's GaussianLikelihood is for "
                                         "regression: use prior_precision='marglik'"),
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


def _classifier_problem(num_rows: int = 48):
    generator = torch.Generator().manual_seed(0)
    y = torch.arange(3).repeat_interleave(-(-num_rows // 3))[:num_rows]
    x = torch.tensor([[0.0, 1.5], [-1.3, -0.8], [1.3, -0.8]])[y] + 0.7 * torch.randn(num_rows, 2, generator=generator)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 3))
    return BayesianNetwork(net, "all", NormalPrior(1.0), CategoricalLikelihood(), output_dim=3), x, y


def test_probit_is_the_default_classification_predictive_and_is_closed_form():
    bnn, x, y = _classifier_problem()
    post = fit(bnn, x, y, backend="laplace", seed=0, progress=False, map_steps=300, num_samples=12)
    assert post.predictive == "probit" and post.info["predictive"] == "probit"
    x_test = torch.cat([x[::6], 4 * torch.randn(6, 2, generator=torch.Generator().manual_seed(1))])
    mean, var = post.glm_moments(x_test)
    expected = torch.softmax(mean / torch.sqrt(1 + math.pi / 8 * var), -1)  # MacKay 1992
    prediction = post.predict(x_test, y=torch.zeros(len(x_test), dtype=torch.long), seed=0)
    torch.testing.assert_close(prediction.mean, expected)
    torch.testing.assert_close(prediction.log_predictive_density(), expected[:, 0].log())
    assert bool((var > 0).all())
    assert torch.equal(post.predict(x_test, seed=0, chunk_size=5).f, prediction.f)  # chunks share one closed form
    x_test.mul_(2.0)  # the same tensor changed in place: predicted anew
    torch.testing.assert_close(post.predict(x_test).mean, torch.softmax(probit_logits(*post.glm_moments(x_test)), -1))
    # a prior precision so large that Σ ≈ 0: the predictive is the MAP's softmax
    tight = fit(bnn, x, y, backend="laplace", init="current", prior_precision=1e9, seed=0, progress=False,
                num_samples=4)
    torch.testing.assert_close(tight.predict(x_test).mean, torch.softmax(bnn.net(x_test), -1), atol=1e-5, rtol=0)


def test_laplace_bridge_matches_its_formula_and_its_dirichlet_mean():
    # Hobbhahn et al. 2022: condition on a zero logit sum, then
    # α_k = (1 − 2/K + e^{μ_k}/K² Σ_l e^{−μ_l}) / σ_kk
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 4, generator=generator, dtype=torch.float64)
    root = torch.randn(5, 4, 4, generator=generator, dtype=torch.float64)
    cov = root @ root.transpose(-1, -2) + 0.1 * torch.eye(4, dtype=torch.float64)
    ones = torch.ones(4, 1, dtype=torch.float64)
    for n in range(5):
        s = cov[n] @ ones
        mu = mean[n] - (s * (ones.T @ mean[n, :, None]) / (ones.T @ s)).squeeze(-1)
        var = torch.diagonal(cov[n] - s @ s.T / (ones.T @ s))
        alpha = (1 - 2 / 4 + mu.exp() / 16 * (-mu).exp().sum()) / var
        torch.testing.assert_close(bridge_log_alpha(mean[n:n + 1], cov[n:n + 1])[0], alpha.log())
    bnn, x, y = _classifier_problem()
    post = fit(bnn, x, y, backend="laplace", predictive="bridge", seed=0, progress=False, map_steps=300,
               num_samples=6)
    mu, full = post.glm_moments(x[:5], joint=True)
    torch.testing.assert_close(post.predict(x[:5]).mean, torch.softmax(bridge_log_alpha(mu, full), -1))


def test_glm_monte_carlo_predictive_converges_to_the_gaussian_over_logits():
    bnn, x, y = _classifier_problem()
    post = fit(bnn, x, y, backend="laplace", predictive="glm", seed=0, progress=False, map_steps=300,
               num_samples=4000, prior_precision=3.0)
    mean, cov = post.glm_moments(x[:4], joint=True)
    probs = post.predict(x[:4]).probs  # [S, N, K]: softmax of the linearised logits at the 4000 weight draws
    reference = torch.softmax(mean + (torch.linalg.cholesky(cov) @ torch.randn(
        4, 3, 200_000, generator=torch.Generator().manual_seed(0))).permute(2, 0, 1), -1).mean(0)
    sd = probs.std(0) / math.sqrt(probs.shape[0])  # Monte Carlo error of the 4000-draw mean
    assert bool(((probs.mean(0) - reference).abs() < 4 * sd + 1e-3).all())


def test_kfac_prior_precision_maximises_the_evidence_for_a_classifier():
    bnn, x, y = _classifier_problem()
    kwargs = dict(backend="laplace", hessian="kfac", seed=0, progress=False, num_samples=2)
    tuned = fit(bnn, x, y, map_steps=300, prior_precision="marglik", **kwargs)
    delta = tuned.info["prior_precision_scale"]
    best = tuned.info["log_evidence"]
    layout = WeightLayout(bnn)
    bnn.update_reference(layout.unflatten(tuned.mean))  # the network at the MAP: init="current" keeps it there
    at_map = fit(bnn, x, y, init="current", prior_precision=delta, **kwargs)  # prior N(0, 1): P₀ = 1, same δ
    assert at_map.info["log_evidence"] == pytest.approx(best, rel=1e-6)
    for factor in (0.7, 1.4):
        other = fit(bnn, x, y, init="current", prior_precision=delta * factor, **kwargs)
        assert other.info["log_evidence"] < best


def test_regression_refuses_the_classification_predictives(conjugate_regression):
    c = conjugate_regression
    with pytest.raises(ValueError, match="predictive='probit' is a classification predictive"):
        fit(linear_bnn(c), c.x, c.y, backend="laplace", predictive="probit", progress=False)


def test_default_classification_prior_precision_is_searched_on_validation_rows_then_refitted():
    # Kristiadi, Hein & Hennig 2020 / laplace-torch's gridsearch: δ by the validation NLL of the probit
    # predictive (MAP fitted without the held-out rows), then the MAP refitted on every row with that δ
    bnn, x, y = _classifier_problem()
    # stochastic="last": the MAP trains the hidden layer as well
    bnn = BayesianNetwork(bnn.net, "last", NormalPrior(1.0), CategoricalLikelihood(), output_dim=3)
    fresh = copy.deepcopy(bnn)
    grid = [0.01, 1.0, 100.0]
    post = fit(bnn, x, y, backend="laplace", seed=0, progress=False, map_steps=200, num_samples=4,
               prior_precision_grid=grid)
    rows = post.info["validation"]
    assert [r["prior_precision_scale"] for r in rows] == pytest.approx(grid)
    scores = [r["validation_nll"] for r in rows]
    assert post.info["prior_precision_scale"] == grid[scores.index(min(scores))]
    assert post.info["num_validation"] == 48 - int(0.8 * 48) and len(set(scores)) == 3
    # the refit: the same MAP (from the same start: the search gives the network back) and Laplace as a
    # fit on all rows with that δ as a fixed number (P₀ = 1 for this N(0, 1) prior)
    fixed = fit(fresh, x, y, backend="laplace", seed=0, progress=False, map_steps=200, num_samples=4,
                prior_precision=post.info["prior_precision_scale"])
    torch.testing.assert_close(post.mean, fixed.mean, rtol=0, atol=0)
    torch.testing.assert_close(post.predict(x[:7]).mean, fixed.predict(x[:7]).mean, rtol=0, atol=0)
    assert VALIDATION_GRID[0] == pytest.approx(1e-4) and VALIDATION_GRID[-1] == pytest.approx(1e6)


def test_the_held_out_map_trains_for_the_epochs_of_the_refit_not_its_steps():
    # 200 rows: the refit's 40 steps are 10 epochs of 4 minibatches of 64; the 160 kept rows make 3 a pass,
    # so the held-out MAP gets 30 steps (10 epochs), not 40 (14 epochs)
    bnn, x, y = _classifier_problem(200)
    fresh = copy.deepcopy(bnn)
    grid = [0.1, 3.0, 100.0]
    post = fit(bnn, x, y, backend="laplace", seed=0, progress=False, map_steps=40, num_samples=2,
               prior_precision_grid=grid)
    assert held_out_steps(40, 200, 160) == 30 and post.info["validation_map_steps"] == [30]
    # the scores are those of a Laplace fitted on the kept rows alone with 30 steps, on the held-out rows
    order = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    kept, held = order[:160], order[160:]
    for row in post.info["validation"]:
        alone = fit(copy.deepcopy(fresh), x[kept], y[kept], backend="laplace", seed=0, progress=False, map_steps=30,
                    num_samples=2, prior_precision=row["prior_precision_scale"])
        nll = -float(alone.predict(x[held], y=y[held]).log_predictive_density().mean())
        assert row["validation_nll"] == pytest.approx(nll, rel=1e-4)


def test_k_fold_validation_holds_every_row_out_once_and_pools_the_folds_nll():
    # K-fold cross-validation of δ: each fold's score is that of a Laplace fitted on the other rows alone (for the
    # refit's epochs), and the search's score is their mean over all held-out rows
    bnn, x, y = _classifier_problem()
    fresh = copy.deepcopy(bnn)
    grid = [0.3, 30.0]
    post = fit(bnn, x, y, backend="laplace", seed=2, progress=False, map_steps=60, num_samples=2,
               prior_precision_grid=grid, validation_folds=3)
    order, held_outs = held_out_folds(48, 0.2, 3, seed=2)
    assert sorted(torch.cat(held_outs).tolist()) == list(range(48)) and [h.numel() for h in held_outs] == [16, 16, 16]
    assert post.info["validation_folds"] == 3 and post.info["num_validation"] == 48
    assert post.info["validation_map_steps"] == [60, 60, 60]  # one minibatch an epoch on 32 rows as on 48
    for row in post.info["validation"]:
        total = 0.0
        for held in held_outs:
            kept = order[~torch.isin(order, held)]
            alone = fit(copy.deepcopy(fresh), x[kept], y[kept], backend="laplace", seed=2, progress=False,
                        map_steps=60, num_samples=2, prior_precision=row["prior_precision_scale"])
            total -= float(alone.predict(x[held], y=y[held]).log_predictive_density().sum())
        assert row["validation_nll"] == pytest.approx(total / 48, rel=1e-4)
    # five folds start with the one-fold split of validation_fraction 0.2
    one = held_out_folds(48, 0.2, 1, seed=2)
    five = held_out_folds(48, 0.2, 5, seed=2)
    assert torch.equal(one[0], five[0]) and torch.equal(one[1][0], five[1][0])


@pytest.mark.parametrize("predictive", ["probit", "bridge"])
def test_validation_scores_are_the_closed_form_predictive_nll_at_each_delta(predictive):
    bnn, x, y = _classifier_problem()
    kwargs = dict(backend="laplace", init="current", hessian="full", predictive=predictive, seed=0, progress=False,
                  num_samples=2)
    posts = [fit(bnn, x, y, prior_precision=delta, **kwargs) for delta in (0.5, 4.0)]
    g = torch.linalg.inv(posts[0].covariance.double()) - 0.5 * torch.eye(posts[0].mean.numel(), dtype=torch.float64)
    eigenvalues, vectors = torch.linalg.eigh(g)  # Σ(δ) = V diag(1/(λ + δ)) Vᵀ (prior N(0, 1): P₀ = 1)
    scores = validation_nll(bnn, posts[0].mean, vectors.float(), eigenvalues, torch.tensor([0.5, 4.0]), x, y,
                             predictive)
    expected = [-float(p.predict(x, y=y).log_predictive_density().mean()) for p in posts]
    assert scores.tolist() == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("options, message", [
    ({"init": "current"}, "fits the MAP on part of the data"),
    ({"map_steps": 0}, "fits the MAP on part of the data"),
    ({"predictive": "sample"}, "scores the probit, bridge and glm predictives; predictive is 'sample'"),
    ({"validation_fraction": 0.99}, "leaves 0 to fit and 48 to validate"),
    ({"validation_folds": 49}, "validation_folds 49 needs at least 49 training rows, got 48"),
])
def test_bad_validation_search_is_a_clear_error(options, message):
    bnn, x, y = _classifier_problem()
    with pytest.raises(ValueError, match=message):
        fit(bnn, x, y, backend="laplace", prior_precision="validation", progress=False, **options)


def test_the_default_map_is_the_map_backends_fit():
    """init='map' with map_steps=None: the map backend's default budget (200 epochs of minibatches of 64), so the
    Laplace mean is the map backend's fit with the same seed, bitwise (a classifier: no latents to refit)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 4, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(90, generator=g) > 0).long()

    def model():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
        return BayesianNetwork(net, "all", likelihood=CategoricalLikelihood(), output_dim=2)

    laplace = fit(model(), x, y, backend="laplace", seed=4, progress=False, prior_precision=1.0, hessian="diag")
    reference = fit(model(), x, y, backend="map", seed=4, progress=False)
    assert laplace.info["map_steps"] == 200 * 2  # ⌈90 / 64⌉ = 2 batches per epoch
    expected = torch.cat([reference.draws[site.name][0, 0].reshape(-1) for site in laplace.bnn.sites])
    assert torch.equal(laplace.mean, expected)

