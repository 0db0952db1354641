"""laplace-torch (Daxberger et al. 2021) as a peer of the ``laplace`` backend.

On the same trained network, at the same prior precision and noise, both libraries' full-GGN Laplace
(last layer and all weights) must give the same GLM predictive means and variances, the same
closed-form classification predictives (probit, Laplace bridge) and the same log marginal
likelihood, to float32 precision.  laplace-torch is an optional peer (``pip install -e .[peers]``,
see docs/baselines.md for the install recipe); without it the module is skipped.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from inference import fit
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood, NormalPrior

laplace = pytest.importorskip("laplace", reason="laplace-torch is not installed (pip install -e .[peers])")

PRIOR_PRECISION = 2.0
NOISE_SD = 0.3
SUBSETS = {"last": "last_layer", "all": "all"}


def _trained(net, x, y, loss, steps=300):
    optimizer = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(steps):
        optimizer.zero_grad()
        loss(net(x), y).backward()
        optimizer.step()
    return net


def _regression():
    generator = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 2, 40).unsqueeze(-1)
    y = torch.sin(2 * x) + NOISE_SD * torch.randn(x.shape, generator=generator)
    torch.manual_seed(0)
    net = _trained(nn.Sequential(nn.Linear(1, 10), nn.Tanh(), nn.Linear(10, 1)), x, y, nn.functional.mse_loss)
    return net, x, y


def _classification():
    generator = torch.Generator().manual_seed(1)
    centres = torch.tensor([[0.0, 1.5], [-1.3, -0.8], [1.3, -0.8]])
    y = torch.arange(3).repeat_interleave(20)
    x = centres[y] + 0.8 * torch.randn(60, 2, generator=generator)
    torch.manual_seed(1)
    net = _trained(nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3)), x, y, nn.functional.cross_entropy)
    return net, x, y


def _peer(net, x, y, task, stochastic):
    kwargs = {"sigma_noise": NOISE_SD} if task == "regression" else {}
    la = laplace.Laplace(net, task, subset_of_weights=SUBSETS[stochastic], hessian_structure="full",
                         prior_precision=PRIOR_PRECISION, **kwargs)
    la.fit(DataLoader(TensorDataset(x, y), batch_size=len(x)))
    return la


def _ours(net, x, y, likelihood, stochastic, predictive, num_samples=8, prior_precision=PRIOR_PRECISION):
    bnn = BayesianNetwork(net, stochastic, NormalPrior(1.0), likelihood, output_dim=net[-1].out_features)
    return fit(bnn, x, y, backend="laplace", init="current", hessian="full", prior_precision=prior_precision,
               predictive=predictive, seed=0, progress=False, num_samples=num_samples)


def _close(ours, theirs, rtol):
    torch.testing.assert_close(ours.double(), theirs.double(), rtol=rtol, atol=rtol * float(theirs.abs().max()))


@pytest.mark.parametrize("stochastic", ["last", "all"])
def test_regression_glm_predictive_and_evidence_match_laplace_torch(stochastic):
    net, x, y = _regression()
    la = _peer(net, x, y, "regression", stochastic)
    post = _ours(net, x, y, GaussianLikelihood(noise_sd=NOISE_SD), stochastic, "glm")
    x_test = torch.linspace(-3, 3, 13).unsqueeze(-1)
    f_mu, f_var = la(x_test, pred_type="glm")
    mean, var = post.glm_moments(x_test)
    # float32 networks and Jacobians: the means to round-off, variances (laplace-torch inverts the
    # posterior precision in float32, we take its eigendecomposition in float64) to float32 round-off
    # times cond(Σ) (3e-5 of the largest variance measured)
    _close(mean, f_mu, 1e-6)
    _close(var, f_var.reshape(var.shape), 1e-4)
    assert post.info["log_evidence"] == pytest.approx(float(la.log_marginal_likelihood()), rel=1e-6)


@pytest.mark.parametrize("stochastic", ["last", "all"])
def test_classification_predictives_and_evidence_match_laplace_torch(stochastic):
    net, x, y = _classification()
    la = _peer(net, x, y, "classification", stochastic)
    x_test = torch.cat([x[::4], 3 * torch.randn(8, 2, generator=torch.Generator().manual_seed(2))])
    probit = _ours(net, x, y, CategoricalLikelihood(), stochastic, "probit")
    assert probit.info["log_evidence"] == pytest.approx(float(la.log_marginal_likelihood()), rel=1e-6)
    mean, cov = probit.glm_moments(x_test, joint=True)
    f_mu, f_cov = la._glm_predictive_distribution(x_test)
    _close(mean, f_mu, 1e-6)
    _close(cov, f_cov, 1e-5)  # measured: 4e-7 of the largest entry
    for link, post in (("probit", probit), ("bridge", _ours(net, x, y, CategoricalLikelihood(), stochastic, "bridge"))):
        theirs = la(x_test, pred_type="glm", link_approx=link)
        _close(post.predict(x_test, seed=0).mean, theirs, 1e-5)  # measured: 1e-7 (probit), 2e-7 (bridge)


@pytest.mark.parametrize("stochastic", ["last", "all"])
def test_classification_glm_monte_carlo_predictive_matches_laplace_torch(stochastic):
    # The GLM predictive p = E[softmax(f)], f ~ N(f(x; w*), J Σ Jᵀ), by Monte Carlo in both libraries at the same
    # prior precision: ours over S₁ weight draws of the linearised network, laplace-torch's (link_approx="mc")
    # over S₂ draws of the logits.  Both are means of iid draws of softmax(f)_k ∈ [0, 1], whose variance is at
    # most p_k(1 − p_k) (the sample variance is no bound here: far from the data the draws are heavy-tailed,
    # p_k ≈ 10⁻⁴ with rare draws near 0.1, and it underestimates the error up to threefold), so their
    # difference has sd ≤ √(p_k(1 − p_k)(1/S₁ + 1/S₂)); 5 such sd over the 69 entries is a false alarm less
    # than once in 10⁵ runs (and both are seeded).
    net, x, y = _classification()
    la = _peer(net, x, y, "classification", stochastic)
    x_test = torch.cat([x[::4], 3 * torch.randn(8, 2, generator=torch.Generator().manual_seed(2))])
    draws_ours, draws_theirs = 8000, 8000
    ours = _ours(net, x, y, CategoricalLikelihood(), stochastic, "glm", num_samples=draws_ours).predict(x_test).mean
    torch.manual_seed(0)
    theirs = la(x_test, pred_type="glm", link_approx="mc", n_samples=draws_theirs)
    p = (ours + theirs) / 2
    tolerance = 5 * (p * (1 - p) * (1 / draws_ours + 1 / draws_theirs)).sqrt() + 1e-6
    assert bool(((ours - theirs).abs() <= tolerance).all())
    # the same check detects a covariance off by a factor 2 (a prior precision or GGN in the wrong units)
    wide = _ours(net, x, y, CategoricalLikelihood(), stochastic, "glm", num_samples=draws_ours, prior_precision=1.0)
    assert not bool(((wide.predict(x_test).mean - theirs).abs() <= tolerance).all())
