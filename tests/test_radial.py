"""Radial AutoGuide (Farquhar, Osborne & Gal 2020) and its M-independent MC cross-entropy."""
from __future__ import annotations

import math

import pyro
import pytest
import torch

from inference import fit
from inference.elbo import elbo_terms
from inference.guides import build_guide
from inference.variational.radial import (
    AutoRadial,
    RadialNormal,
    radial_cross_entropy,
    radial_entropy_constant,
)
from zoo import BayesianNetwork, GaussianLikelihood, LaplacePrior


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
