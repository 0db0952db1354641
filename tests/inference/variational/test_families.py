"""Variational families (Graves 2011; Kingma, Salimans & Welling 2015; Molchanov, Ashukha & Vetrov
2017): KL formulas, the fused training path, LRT, and the backends.

Statistical checks use fixed seeds and tolerances of 4 Monte Carlo standard errors; the KL
approximations of the dropout families are checked against the exact KL by numerical
integration (their published accuracy: ~0.01 for Molchanov et al., ~0.03 for Kingma et al.).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from tests.inference.conftest import flat_linear_draws
from inference import fit, load_posterior
from inference.variational.elbo import elbo_terms
from inference.variational.guides import build_guide
from inference.variational.families import (
    FAMILIES,
    KINGMA_KL_CONST,
    gaussian_kl,
    get_family,
    kingma_vd_kl,
    sparse_vd_kl,
)
from inference.variational.lrt import lrt_forward, lrt_modules
from inference.variational.meanfield import MeanFieldGuide
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood, LaplacePrior, NormalPrior


def _exact_log_uniform_kl(log_alpha: float) -> float:
    """KL(N(θ, αθ²) ‖ log-uniform) in Molchanov's normalisation, by numerical integration:
    −½ log α + E_{z~N(0,1)} log|1 + √α z| + (γ + log 2)/2."""
    root = math.sqrt(math.exp(log_alpha))
    pole = -1.0 / root
    f = lambda z: math.log(abs(1.0 + root * z)) * stats.norm.pdf(z)
    expectation = integrate.quad(f, -np.inf, pole, limit=200)[0] + integrate.quad(f, pole, np.inf, limit=200)[0]
    return -0.5 * log_alpha + expectation + 0.5 * (np.euler_gamma + math.log(2.0))


# ------------------------------------------------------------------------------------------ KL formulas
def test_gaussian_kl_matches_monte_carlo_and_closed_form():
    torch.manual_seed(0)
    loc, log_sigma = torch.tensor([0.3, -1.0, 0.0]), torch.tensor([-1.0, 0.2, -0.5])
    prior_loc, prior_scale = 0.5, 1.7
    kl = gaussian_kl(loc, log_sigma, prior_loc, prior_scale)
    q = torch.distributions.Normal(loc, log_sigma.exp())
    p = torch.distributions.Normal(prior_loc, prior_scale)
    torch.testing.assert_close(kl, torch.distributions.kl_divergence(q, p))
    w = q.sample((200_000,))
    terms = q.log_prob(w) - p.log_prob(w)
    se = terms.std(0) / math.sqrt(w.shape[0])
    assert bool(((terms.mean(0) - kl).abs() < 4 * se).all())


def test_sparse_vd_kl_matches_numerical_integration():
    grid = np.linspace(-8, 8, 17)
    approx = sparse_vd_kl(torch.tensor(grid, dtype=torch.float64)).numpy()
    exact = np.array([_exact_log_uniform_kl(v) for v in grid])
    assert np.abs(approx - exact).max() < 0.01
    # clipped outside [-8, 8]
    assert float(sparse_vd_kl(torch.tensor(12.0))) == pytest.approx(float(sparse_vd_kl(torch.tensor(8.0))))


def test_kingma_vd_kl_matches_numerical_integration():
    grid = np.linspace(-8, 0, 9)
    approx = kingma_vd_kl(torch.tensor(grid, dtype=torch.float64)).numpy()
    exact = np.array([_exact_log_uniform_kl(v) for v in grid])
    assert np.abs(approx - exact).max() < 0.03
    assert KINGMA_KL_CONST == pytest.approx(-np.mean(exact + 0.5 * grid + 1.16145124 * np.exp(grid)
                                                    - 1.50204118 * np.exp(2 * grid) + 0.58629921 * np.exp(3 * grid)), abs=0.01)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("prior", ["scalar", "tensor"])
def test_closed_form_gradients_match_autograd(name, prior):
    family = get_family(name)
    g = torch.Generator().manual_seed(1)
    loc = torch.randn(200, generator=g, dtype=torch.float64) * 0.5
    s = torch.randn(200, generator=g, dtype=torch.float64) * 3 - 2  # spans the clip regions
    prior_loc, prior_scale = (0.2, 1.5) if prior == "scalar" else (torch.rand(200, dtype=torch.float64), torch.rand(200, dtype=torch.float64) + 0.5)
    loc_a, s_a = loc.clone().requires_grad_(), s.clone().requires_grad_()
    kl_ref = family.kl(loc_a, s_a, prior_loc, prior_scale).sum()
    sigma_ref = family.sigma(loc_a, s_a)
    zero = torch.zeros_like(loc)
    grads = [g if g is not None else zero for g in torch.autograd.grad(kl_ref, (loc_a, s_a), allow_unused=True)]
    sigma_grads = [g if g is not None else zero for g in torch.autograd.grad(sigma_ref.sum(), (loc_a, s_a), allow_unused=True)]
    kl, accumulate = family.kl_and_grads(loc, s, family.sigma(loc, s), prior_loc, prior_scale)
    d_loc, d_s = torch.full_like(loc, 0.5), torch.full_like(loc, -0.25)
    accumulate(d_loc, d_s, 2.0)
    torch.testing.assert_close(kl, kl_ref.detach())
    torch.testing.assert_close(d_loc, 0.5 + 2 * grads[0])
    torch.testing.assert_close(d_s, -0.25 + 2 * grads[1])
    ds_loc, ds_s = family.sigma_grads(loc, s, family.sigma(loc, s))
    torch.testing.assert_close(ds_loc if ds_loc is not None else zero, sigma_grads[0])
    torch.testing.assert_close(ds_s, sigma_grads[1])


# ------------------------------------------------------------------------------------------ fused path
def _mlp_bnn(likelihood=None, stochastic="all", prior=None, out=1):
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, out))
    return BayesianNetwork(net, stochastic=stochastic, prior=prior, likelihood=likelihood or GaussianLikelihood(0.5), output_dim=out)


def _reference_terms(bnn, guide, x, y, estimator):
    """Plain-autograd ELBO terms with the random stream of the fused path (same seed → same draws)."""
    loc, s = guide.loc, guide.scale_param
    sigma = guide.family.sigma(loc, s)
    values, offset = {}, 0
    spec, plan = guide._spec(bnn, estimator)
    lrt_sites = {n for pair in plan.values() for n in pair if n}
    sampled = sum(seg.numel for seg in guide.segments if seg.name not in lrt_sites)
    eps = torch.randn(sampled) if sampled else None
    for seg in guide.segments:
        if seg.name in lrt_sites:
            continue
        values[seg.name] = (loc[seg.span] + sigma[seg.span] * eps[offset : offset + seg.numel]).view(seg.shape)
        offset += seg.numel
    h = x
    for module in bnn.net:
        if isinstance(module, torch.nn.Linear):
            w_name = [n for n, m in bnn.net.named_modules() if m is module][0]
            if w_name in plan:
                seg_w, seg_b = guide._by_name[w_name + ".weight"], guide._by_name[w_name + ".bias"]
                mean = h @ loc[seg_w.span].view(seg_w.shape).T + loc[seg_b.span]
                var = (h * h) @ (sigma[seg_w.span] ** 2).view(seg_w.shape).T + sigma[seg_b.span] ** 2
                h = mean + (var + 1e-16).sqrt() * torch.randn_like(mean)
            else:
                h = h @ values[w_name + ".weight"].T + values[w_name + ".bias"]
        else:
            h = module(h)
    ell = bnn.likelihood.log_prob(h.unsqueeze(0), y, {}).sum() * (100 / x.shape[0])
    kl = sum(guide.family.kl(loc[seg.span], s[seg.span], *guide._priors[i]).sum() for i, seg in enumerate(guide.segments))
    return ell, kl


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("estimator", ["weights", "lrt"])
def test_fused_path_equals_plain_autograd(family, estimator):
    bnn = _mlp_bnn()
    guide = build_guide("mean-field", bnn, family=family, init_scale=0.05)
    with torch.no_grad():
        guide.scale_param.add_(torch.randn_like(guide.scale_param) * 0.3)
    x, y = torch.randn(20, 3), torch.randn(20, 1)
    torch.manual_seed(7)
    ell, kl = guide.elbo_terms(bnn, x, y, 100, estimator)
    grads = torch.autograd.grad(-ell + 0.7 * kl, (guide.loc, guide.scale_param))
    torch.manual_seed(7)
    ell_ref, kl_ref = _reference_terms(bnn, guide, x, y, estimator)
    grads_ref = torch.autograd.grad(-ell_ref + 0.7 * kl_ref, (guide.loc, guide.scale_param))
    torch.testing.assert_close(ell, ell_ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(kl, kl_ref, rtol=1e-5, atol=1e-4)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["sparse-vd", "kingma-vd"])
def test_fused_steps_reuse_work_tensors_without_mixing_them(family):
    """The dropout families' [P] work tensors come from the guide's workspace: a step's tensors are
    reused only after its backward, so two live draws (particles) and later steps keep exact gradients;
    a second backward through one draw (its tensors given back) is refused, not silently wrong."""
    bnn = _mlp_bnn()
    guide = build_guide("mean-field", bnn, family=family, init_scale=0.05)
    x, y = torch.randn(20, 3), torch.randn(20, 1)

    def gradients(seeds):
        draws = []
        for seed in seeds:  # every draw alive before the one backward, as with num_particles > 1
            torch.manual_seed(seed)
            draws.append(guide.elbo_terms(bnn, x, y, 100, "lrt"))
        loss = sum(-ell + kl for ell, kl in draws)
        return torch.autograd.grad(loss, (guide.loc, guide.scale_param))

    alone = [gradients([seed]) for seed in (1, 2)]
    assert guide._workspace._free  # the first step's tensors went back and were reused
    together = gradients([1, 2])
    again = gradients([1, 2])
    for a, b, c, d in zip(alone[0], alone[1], together, again):
        torch.testing.assert_close(a + b, c, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(c, d, rtol=0, atol=0)
    ell, kl = guide.elbo_terms(bnn, x, y, 100, "lrt")
    (kl - ell).backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward pass per forward pass"):
        (kl - ell).backward()


def test_estimators_agree_in_expectation_with_pyro_elbo():
    """weights, LRT and the Pyro-trace ELBO of the same guide estimate the same expectation."""
    bnn = _mlp_bnn(likelihood=GaussianLikelihood(learn_noise=True))
    guide = build_guide("mean-field", bnn, family="graves", init_scale=0.3)
    x, y = torch.randn(10, 3), torch.randn(10, 1)
    draws = {"weights": [], "lrt": [], "pyro": []}
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(1500):
            for estimator in ("weights", "lrt"):
                ell, kl = guide.elbo_terms(bnn, x, y, 10, estimator)
                draws[estimator].append(float(ell - kl))
            terms = elbo_terms(bnn.model, guide, x, y, 10)
            draws["pyro"].append(float(terms.expected_log_likelihood - terms.kl))
    means = {k: np.mean(v) for k, v in draws.items()}
    ses = {k: np.std(v) / math.sqrt(len(v)) for k, v in draws.items()}
    for a, b in (("weights", "lrt"), ("weights", "pyro")):
        assert abs(means[a] - means[b]) < 4 * math.hypot(ses[a], ses[b]), (means, ses)


def test_lrt_moments_match_weight_sampling_for_linear_and_conv():
    torch.manual_seed(0)
    for module, x in ((torch.nn.Linear(4, 3), torch.randn(2, 4)), (torch.nn.Conv2d(2, 3, 3, padding=1), torch.randn(1, 2, 4, 4))):
        w_mean, w_var = module.weight.detach(), torch.rand_like(module.weight) * 0.2
        b_mean, b_var = module.bias.detach(), torch.rand_like(module.bias) * 0.1
        with torch.no_grad():
            out = torch.stack([lrt_forward(module, x, w_mean, w_var, b_mean, b_var) for _ in range(20000)])
            w = w_mean + w_var.sqrt() * torch.randn(4000, *w_mean.shape)
            b = b_mean + b_var.sqrt() * torch.randn(4000, *b_mean.shape)
            ref = torch.stack([torch.func.functional_call(module, {"weight": wi, "bias": bi}, (x,)) for wi, bi in zip(w, b)])
        mean_exact = module(x).detach()
        torch.testing.assert_close(out.mean(0), mean_exact, atol=4 * float(out.std(0).max()) / math.sqrt(20000), rtol=0)
        torch.testing.assert_close(ref.mean(0), mean_exact, atol=4 * float(ref.std(0).max()) / math.sqrt(4000), rtol=0)
        ratio = out.var(0) / ref.var(0)
        assert float((ratio - 1).abs().max()) < 0.15  # sampling error of a variance ratio with 4000 draws


def test_lrt_plan_covers_full_sites_only():
    bnn = _mlp_bnn(stochastic={"0.weight": torch.ones(5, 3, dtype=torch.bool), "2.weight": torch.eye(1, 5, dtype=torch.bool)})
    sites = {s.name: s for s in bnn.sites}
    assert lrt_modules(bnn.net, sites) == {"0": ("0.weight", None)}  # deterministic bias OK, masked site not


# ------------------------------------------------------------------------------------------ backends
@pytest.mark.parametrize("backend,options", [
    ("graves", {"epochs": 1500, "lr": 1e-2}),
    ("svi-lrt", {"epochs": 1500, "lr": 1e-2}),
    ("radial", {"epochs": 1500, "lr": 1e-2, "mc_kl_samples": 16}),
])
def test_backends_recover_conjugate_posterior(conjugate_regression, backend, options):
    """Mean-field / Radial optima have the exact posterior mean for a Gaussian posterior; the sds are
    close because this posterior is nearly diagonal.  Tolerances: 0.2 posterior sd for the means (SGD
    noise at the end of training), 15% for the sds."""
    c = conjugate_regression
    bnn = BayesianNetwork(c.net(), prior=NormalPrior(c.prior_sd), likelihood=GaussianLikelihood(c.noise_sd), output_dim=1)
    post = fit(bnn, c.x, c.y, backend=backend, seed=0, progress=False, batch_size=None, **options)
    draws = flat_linear_draws(post.sample_params(8000, seed=1))
    z = (draws.mean(0) - c.post_mean) / c.post_sd
    assert float(z.abs().max()) < 0.2, z
    assert float((draws.std(0) / c.post_sd - 1).abs().max()) < 0.15
    assert post.info["backend"] == backend and len(post.info["history"]["sparsity"]) == options["epochs"]


@pytest.mark.parametrize("backend", ["sparse-vd", "kingma-vd"])
def test_dropout_backends_train_and_track_sparsity(backend):
    torch.manual_seed(0)
    x = torch.randn(200, 3)
    y = (x[:, 0] > 0).long()
    bnn = _mlp_bnn(likelihood=CategoricalLikelihood(), out=2)
    post = fit(bnn, x, y, backend=backend, seed=0, progress=False, epochs=30, pretrain_epochs=5, kl_anneal_epochs=10)
    history = post.info["history"]
    assert len(history["sparsity"]) == 30 and set(history["layer_sparsity"][-1]) == {s.name for s in bnn.sites}
    assert post.info["lrt_modules"] == ["0", "2"] and post.info["family"] == backend
    assert 0.0 <= post.info["sparsity"]["sparsity"] <= 1.0
    pred = post.predict(x, num_samples=20, seed=0)
    assert float((pred.mean.argmax(-1) == y).float().mean()) > 0.8


def test_saved_posterior_predicts_identically(tmp_path):
    bnn = _mlp_bnn()
    x, y = torch.randn(30, 3), torch.randn(30, 1)
    post = fit(bnn, x, y, backend="graves", seed=0, progress=False, epochs=3, prior_sd=2.0)
    post.save(tmp_path / "p")
    again = load_posterior(tmp_path / "p")
    torch.testing.assert_close(post.predict(x, num_samples=5, seed=2).f, again.predict(x, num_samples=5, seed=2).f)


# ------------------------------------------------------------------------------------------ bad input
def test_bad_options_give_clear_errors():
    bnn = _mlp_bnn()
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    with pytest.raises(ValueError, match="unknown estimator"):
        fit(bnn, x, y, backend="graves", estimator="flipout", progress=False)
    with pytest.raises(ValueError, match="out of range"):
        fit(bnn, x, y, backend="sparse-vd", prune_threshold=9.0, progress=False)
    with pytest.raises(ValueError, match="out of range"):
        fit(bnn, x, y, backend="graves", prune_threshold=-1.0, progress=False)
    with pytest.raises(ValueError, match="prior_sd must be positive"):
        fit(bnn, x, y, backend="graves", prior_sd=0.0, progress=False)
    with pytest.raises(ValueError, match="needs random weights"):
        fit(_mlp_bnn(stochastic="none"), x, y, backend="sparse-vd", progress=False)
    with pytest.raises(ValueError, match="Laplace prior"):
        fit(_mlp_bnn(prior=LaplacePrior(1.0)), x, y, backend="graves", epochs=1, progress=False)
    with pytest.raises(ValueError, match="Graves family only"):
        MeanFieldGuide(bnn, family="sparse-vd", prior_sd=1.0)
    with pytest.raises(ValueError, match="unknown variational family"):
        MeanFieldGuide(bnn, family="dense")
