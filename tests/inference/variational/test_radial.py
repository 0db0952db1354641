"""Radial AutoGuide (Farquhar, Osborne & Gal 2020) and its M-independent MC cross-entropy."""
from __future__ import annotations

import math

import pyro
import pytest
import torch

from inference import fit
from inference.variational.elbo import elbo_terms
from inference.variational.guides import build_guide
from inference.variational.radial import AutoRadial, RadialNormal, radial_cross_entropy
from inference.variational.radial_kl import radial_entropy_constant
from zoo import BayesianNetwork, GaussianLikelihood, LaplacePrior, PretrainedNormalPrior
from zoo.priors import Prior


def _normal_prior(shape, loc=0.3, scale=1.5):
    return pyro.distributions.Normal(torch.full(shape, loc), torch.full(shape, scale)).to_event(len(shape))


def test_radial_samples_have_the_radial_law():
    loc, scale = torch.randn(4, 5), torch.rand(4, 5) + 0.5
    torch.manual_seed(0)
    w = RadialNormal(loc, scale).rsample((20000,))
    u = (w - loc) / scale
    radius = u.flatten(1).norm(dim=1)
    # ‖ξ‖ = |r| with r ~ N(0, 1): E|r| = sqrt(2/π), E r² = 1; each coordinate has variance 1/D
    assert float(radius.mean()) == pytest.approx(math.sqrt(2 / math.pi), abs=4 * 0.6 / math.sqrt(20000))
    assert float((radius**2).mean()) == pytest.approx(1.0, abs=4 * math.sqrt(2 / 20000))
    coord_var = (u**2).mean(0)
    assert float((coord_var - 1 / 20).abs().max()) < 0.01


def test_entropy_and_log_prob_are_consistent():
    loc, scale = torch.zeros(3, 4), torch.rand(3, 4) + 0.2
    q = RadialNormal(loc, scale)
    torch.manual_seed(1)
    w = q.rsample((50000,))
    neg_log_q = -q.log_prob(w)
    se = float(neg_log_q.std()) / math.sqrt(w.shape[0])
    assert float(neg_log_q.mean()) == pytest.approx(float(q.entropy()), abs=4 * se)
    # one dimension: the Radial distribution is the Normal one
    one = RadialNormal(torch.tensor([0.3]), torch.tensor([0.7]))
    normal = torch.distributions.Normal(0.3, 0.7)
    value = torch.tensor([[0.1], [1.2]])
    torch.testing.assert_close(one.log_prob(value), normal.log_prob(value).squeeze(-1))
    assert radial_entropy_constant(1) == pytest.approx(0.5 * math.log(2 * math.pi * math.e))


@pytest.mark.parametrize("num_draws", [1, 7, 300])
def test_reparameterized_estimator_equals_naive_with_same_draws(num_draws):
    loc = torch.randn(6, 5, requires_grad=True)
    scale = (torch.rand(6, 5) + 0.1).requires_grad_()
    prior = _normal_prior((6, 5))
    results = {}
    for estimator in ("naive", "reparameterized"):
        torch.manual_seed(3)
        value = radial_cross_entropy(loc, scale, prior, num_draws, estimator, chunk_elements=64)
        results[estimator] = (value, *torch.autograd.grad(value, (loc, scale)))
    for a, b in zip(results["naive"], results["reparameterized"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_reparameterized_estimator_is_unbiased():
    """E[ξ] = 0 and E[ξ²] = 1/D, so E[CE] = Σ log s + ½ log 2π + ((μ−m)² + σ²/D) / (2s²)."""
    loc, scale = torch.randn(10), torch.rand(10) + 0.5
    prior = _normal_prior((10,))
    m, s = 0.3, 1.5
    exact = float((math.log(s) + 0.5 * math.log(2 * math.pi) + ((loc - m) ** 2 + scale**2 / 10) / (2 * s**2)).sum())
    torch.manual_seed(0)
    values = torch.tensor([float(radial_cross_entropy(loc, scale, prior, 5)) for _ in range(2000)])
    assert float(values.mean()) == pytest.approx(exact, abs=4 * float(values.std()) / math.sqrt(2000))


def _saved_elements(fn) -> int:
    """Number of tensor elements autograd saves for backward while running ``fn``."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def test_graph_size_is_independent_of_m_only_for_the_reparameterized_estimator():
    loc = torch.randn(20, 30, requires_grad=True)
    log_scale = torch.full((20, 30), -1.0, requires_grad=True)
    prior = _normal_prior((20, 30))
    size = {
        (est, m): _saved_elements(lambda: radial_cross_entropy(loc, log_scale.exp(), prior, m, est))
        for est in ("naive", "reparameterized")
        for m in (1, 100)
    }
    assert size[("reparameterized", 1)] == size[("reparameterized", 100)]
    assert size[("naive", 100)] > 50 * size[("naive", 1)] / 2


def _bnn(**kw):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    return BayesianNetwork(net, output_dim=1, **kw)


def test_auto_radial_guide_in_elbo_and_predictions():
    bnn = _bnn(likelihood=GaussianLikelihood(learn_noise=True))
    guide = build_guide("radial", bnn, mc_kl_samples=4)
    assert isinstance(guide, AutoRadial) and set(guide.sites()) == {s.name for s in bnn.sites}
    prior = bnn.prior_distributions()["0.weight"]
    assert guide.site_kl("0.weight", prior).dim() == 0 and guide.site_kl("noise_precision", None) is None
    x, y = torch.randn(5, 2), torch.randn(5, 1)
    terms = elbo_terms(bnn.model, guide, x, y, 5)
    (terms.kl - terms.expected_log_likelihood).backward()
    assert all(p.grad is not None for p in guide.parameters())
    post = fit(bnn, x, y, backend="radial", epochs=2, progress=False, mc_kl_samples=3, mc_kl_estimator="naive")
    draws = post.sample_params(7, seed=0)
    assert draws["0.weight"].shape == (7, 4, 2) and bool((draws["noise_precision"] > 0).all())


def test_bad_radial_input_gives_clear_errors():
    bnn = _bnn()
    x, y = torch.randn(5, 2), torch.randn(5, 1)
    with pytest.raises(ValueError, match="mc_kl_samples"):
        fit(bnn, x, y, backend="radial", mc_kl_samples=0, progress=False)
    with pytest.raises(ValueError, match="mc_kl_estimator"):
        fit(bnn, x, y, backend="radial", mc_kl_estimator="taylor", progress=False)
    with pytest.raises(ValueError, match="mc_kl_samples"):
        AutoRadial(bnn.model, mc_kl_samples=2.5)
    laplace = _bnn(prior=LaplacePrior(1.0))
    with pytest.raises(ValueError, match="Laplace prior"):
        fit(laplace, x, y, backend="radial", epochs=1, progress=False)
    post = fit(laplace, x, y, backend="radial", epochs=1, progress=False, mc_kl_estimator="naive")
    assert math.isfinite(post.info["history"]["loss"][0])


class _GraduatedNormalPrior(Prior):
    """Normal(0.1, s_i) with a different s_i for every entry: the exact KL's tensor-scale branch."""

    def _base(self, site):
        scale = torch.linspace(0.5, 1.5, site.numel).reshape(site.shape)
        return pyro.distributions.Normal(torch.full(site.shape, 0.1), scale)


@pytest.mark.parametrize("estimator, prior", [("reparameterized", None), ("naive", None), ("exact", None),
                                              ("exact", PretrainedNormalPrior(0.7)), ("exact", _GraduatedNormalPrior())])
@pytest.mark.parametrize("batch", [None, 4])
def test_fused_radial_elbo_gives_the_trace_path_numbers_for_a_seed(estimator, prior, batch):
    """:meth:`AutoRadial.elbo_terms` (no Pyro traces): same values and gradients as the trace path,
    draw after draw, with a learned noise precision (a constrained latent) and minibatches; the exact
    estimator (its written-out backward) with constant, tensor-mean and tensor-scale Normal priors."""
    bnn = _bnn(likelihood=GaussianLikelihood(learn_noise=True), **({"prior": prior} if prior is not None else {}))
    draws = {"mc_kl_samples": 3} if estimator != "exact" else {}
    guide = build_guide("radial", bnn, init_scale=0.3, mc_kl_estimator=estimator, chunk_elements=8, **draws)
    with torch.no_grad():
        for param in guide.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=torch.Generator().manual_seed(4)))
    x, y = torch.randn(10, 2), torch.randn(10, 1)
    n, params = batch or 10, list(guide.parameters()) + bnn.deterministic_parameters()
    results = {}
    for path in ("fused", "trace"):
        pyro.set_rng_seed(11)
        results[path] = []
        for _ in range(3):
            if path == "fused":
                ell, kl = guide.elbo_terms(bnn, x[:n], y[:n], 10)
            else:
                terms = elbo_terms(bnn.model, guide, x[:n], y[:n], 10)
                ell, kl = terms.expected_log_likelihood, terms.kl
            grads = torch.autograd.grad(kl - ell, params)
            results[path].append((torch.stack([ell, kl]).detach(), torch.cat([g.reshape(-1) for g in grads])))
    for (fused_terms, fused_grad), (trace_terms, trace_grad) in zip(results["fused"], results["trace"]):
        torch.testing.assert_close(fused_terms, trace_terms, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(fused_grad, trace_grad, rtol=1e-4, atol=1e-4)


def test_radial_backend_takes_the_fused_path_and_fits_as_the_trace_path():
    bnn = _bnn(likelihood=GaussianLikelihood(learn_noise=True))
    x, y = torch.randn(12, 2), torch.randn(12, 1)
    options = dict(epochs=3, batch_size=5, progress=False, mc_kl_samples=2, seed=1)
    fused = fit(bnn, x, y, backend="radial", **options)
    trace = fit(bnn, x, y, backend="radial", elbo_path="pyro-trace", **options)
    assert fused.info["elbo_path"] == "fused" and trace.info["elbo_path"] == "pyro-trace"
    for a, b in zip(fused.guide.parameters(), trace.guide.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert fused.info["history"]["loss"] == pytest.approx(trace.info["history"]["loss"], rel=1e-5)


@pytest.mark.parametrize("prior_scale", [1.5, "tensor"])
def test_exact_cross_entropy_is_the_limit_of_the_monte_carlo_estimator(prior_scale):
    """E ξ = 0 and E ξ_i² = 1/D make the Normal-prior cross-entropy a closed form: the reparameterized
    estimator with M draws scatters around it with its own MC standard error, and so do its gradients."""
    shape = (6, 5)
    torch.manual_seed(3)
    loc, scale = torch.randn(shape).requires_grad_(), (0.2 + torch.rand(shape)).requires_grad_()
    s = 1.5 if prior_scale == 1.5 else 0.5 + torch.rand(shape)
    prior = pyro.distributions.Normal(torch.full(shape, 0.3), torch.as_tensor(s).expand(shape)).to_event(2)
    exact = radial_cross_entropy(loc, scale, prior, 1, "exact")
    torch.manual_seed(0)
    draws = torch.stack([radial_cross_entropy(loc, scale, prior, 1, "reparameterized") for _ in range(4000)])
    se = draws.std() / math.sqrt(len(draws))
    assert abs(float(draws.detach().mean() - exact.detach())) < 4 * float(se.detach()) + 1e-6
    grad_exact = torch.autograd.grad(exact, (loc, scale))
    grad_mc = torch.autograd.grad(radial_cross_entropy(loc, scale, prior, 20000, "reparameterized"), (loc, scale))
    for exact_g, mc_g in zip(grad_exact, grad_mc):
        torch.testing.assert_close(mc_g, exact_g, atol=0.02, rtol=0.02)


def test_radial_estimator_defaults_and_errors():
    bnn = _bnn()
    assert build_guide("radial", bnn).mc_kl_estimator == "exact"
    guide = build_guide("radial", bnn, mc_kl_samples=4)
    assert (guide.mc_kl_estimator, guide.mc_kl_samples) == ("reparameterized", 4)
    guide = build_guide("radial", bnn, mc_kl_estimator="naive")
    assert (guide.mc_kl_estimator, guide.mc_kl_samples) == ("naive", 10)
    with pytest.raises(ValueError, match="no effect with mc_kl_estimator='exact'"):
        build_guide("radial", bnn, mc_kl_samples=4, mc_kl_estimator="exact")
    x, y = torch.randn(8, 2), torch.randn(8, 1)
    post = fit(bnn, x, y, backend="radial", epochs=2, progress=False)
    assert post.info["mc_kl_estimator"] == "exact" and post.info["mc_kl_samples"] is None
