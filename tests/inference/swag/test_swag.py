"""The ``swag`` / ``multiswag`` backends: the SWA mean on Bayesian linear regression, the SWAG
sampling covariance, MultiSWAG members as chains, save/load, ArviZ and bad input."""
from __future__ import annotations

import math

import arviz as az
import pytest
import torch
from torch import nn

from tests.inference.conftest import flat_linear_draws
from inference import fit, load_posterior
from inference.swag.moments import init_moments, update_moments
from inference.swag.swag_posterior import swag_samples
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior

FAST = {"batch_size": 10, "lr": 2e-3, "epochs": 50, "burnin_epochs": 50, "burnin_lr": 0.05}


def linear_bnn(c):
    return BayesianNetwork(c.net(), "all", NormalPrior(c.prior_sd), GaussianLikelihood(c.noise_sd), output_dim=1)


@pytest.mark.parametrize("options", [{}, {"diag": True}, {"lr_schedule": "cyclical", "lr_min": 1e-4}])
def test_swa_mean_recovers_the_conjugate_posterior_mean(conjugate_regression, options):
    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend="swag", seed=0, progress=False, num_samples=500, **FAST, **options)
    assert post.num_chains == 1 and post.info["num_snapshots"] == 50  # one snapshot per epoch (4 steps)
    # the loss −log π/N is quadratic with Hessian eigenvalues λ ≈ 1/σ² = 4: SGD at a small constant rate
    # (lr/(1 − momentum)·λ ≈ 0.08 per step) fluctuates around the mode, the posterior mean, by a few
    # hundredths of a sd; the SWA average is closer still, and 500 draws add a Monte Carlo error of
    # (SWAG sd / √500) ≪ 0.01 sd
    z = (flat_linear_draws(post.sample_params()).mean(0) - c.post_mean) / c.post_sd
    assert z.abs().max() < 0.1, z


def test_swag_draws_have_the_swag_covariance():
    g = torch.Generator().manual_seed(0)
    moments = init_moments(num_members=1, dim=4, max_rank=3)
    for _ in range(7):
        update_moments(moments, torch.randn(1, 4, generator=g) * torch.tensor([1.0, 2.0, 0.5, 1.0]))
    d = moments.deviations[0]  # the last 3 deviations [K, P]
    expected = 0.5 * torch.diag(moments.variance[0]) + 0.5 * d.T @ d / (3 - 1)
    draws = swag_samples(moments, 40000, diag=False, generator=g)[0]
    # 40000 draws: the sample covariance's sd per entry is ≈ √(2/40000)·σ_i σ_j ≈ 0.7 % of the scale
    assert torch.allclose(draws.T.cov(), expected, atol=0.04 * float(expected.diagonal().max()))
    assert torch.allclose(draws.mean(0), moments.mean[0], atol=0.03 * float(expected.diagonal().max().sqrt()))
    diag_draws = swag_samples(moments, 40000, diag=True, generator=g)[0]
    assert torch.allclose(diag_draws.var(0), moments.variance[0], rtol=0.04)


def test_multiswag_members_are_chains_of_independent_runs(conjugate_regression):
    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend="multiswag", seed=0, progress=False, num_members=3, num_samples=100,
               **FAST)
    assert post.num_chains == 3 and post.draws["weight"].shape == (3, 100, 1, 2)
    per_member = flat_linear_draws({k: v for k, v in post.draws.items()}).reshape(3, 100, 3).mean(1)
    # a convex loss: every member's SWA mean is at the posterior mean (within 0.1 sd), from different starts
    assert (((per_member - c.post_mean) / c.post_sd).abs() < 0.1).all()
    assert not torch.equal(post.draws["weight"][0], post.draws["weight"][1])
    data = post.to_arviz(c.x, c.y)
    assert data.posterior.sizes["chain"] == 3
    assert math.isfinite(az.loo(data).elpd_loo)


@pytest.mark.parametrize("backend, options", [("swag", {}), ("multiswag", {"num_members": 2})])
def test_save_load_round_trip(tmp_path, conjugate_regression, backend, options):
    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend=backend, seed=0, progress=False, num_samples=20,
               **{**FAST, "epochs": 25, "burnin_epochs": 5}, **options)
    post.save(tmp_path / backend)
    loaded = load_posterior(tmp_path / backend)
    assert loaded.num_chains == post.num_chains
    assert torch.equal(loaded.predict(c.x, y=c.y, seed=2).log_lik, post.predict(c.x, y=c.y, seed=2).log_lik)


@pytest.mark.parametrize("options, message", [
    ({"max_rank": 0}, "max_rank K must be at least 2"),
    ({"max_rank": 1}, "max_rank K must be at least 2"),
    ({"epochs": 10, "max_rank": 20}, r"max_rank K=20 exceeds the number of snapshots \(10"),
    ({"epochs": 10, "max_rank": 5, "collect_every": 20}, r"max_rank K=5 exceeds the number of snapshots \(2 "),
    ({"lr_schedule": "cosine"}, "unknown lr_schedule"),
    ({"momentum": 1.0}, "momentum must lie in"),
])
def test_bad_options_are_clear_errors(conjugate_regression, options, message):
    c = conjugate_regression
    with pytest.raises(ValueError, match=message):
        fit(linear_bnn(c), c.x, c.y, backend="swag", progress=False, **{**FAST, "burnin_epochs": 0, **options})


def test_multiswag_needs_a_member(conjugate_regression):
    c = conjugate_regression
    with pytest.raises(ValueError, match="num_members"):
        fit(linear_bnn(c), c.x, c.y, backend="multiswag", progress=False, num_members=0)


def _batchnorm_problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 2, generator=g)
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(16, 1, generator=g)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 1))
    return x, y, BayesianNetwork(net, "all", NormalPrior(1.0), GaussianLikelihood(learn_noise=True), output_dim=1)


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
def test_swag_refreshes_batchnorm_statistics_per_draw(tmp_path):
    x, y, bnn = _batchnorm_problem()
    post = fit(bnn, x, y, backend="swag", seed=0, progress=False, num_samples=6,
               **{**FAST, "batch_size": 4, "epochs": 10, "max_rank": 5, "burnin_epochs": 5, "lr": 1e-2})
    mean, var = post.draws["batchnorm:1.running_mean"][0], post.draws["batchnorm:1.running_var"][0]  # [S, 4]
    assert mean.shape == (6, 4) and not torch.allclose(mean[0], mean[1]) and not torch.allclose(var[0], var[1])
    # manual recompute: the pre-BatchNorm activations of each draw over the 4 batches of 4 points in data
    # order; momentum None averages the batch means and the batches' unbiased variances
    h = x @ post.draws["0.weight"][0].transpose(-1, -2) + post.draws["0.bias"][0].unsqueeze(1)  # [S, 16, 4]
    batches = h.reshape(6, 4, 4, 4)
    assert torch.allclose(mean, batches.mean(2).mean(1), atol=1e-5)
    assert torch.allclose(var, batches.var(2, unbiased=True).mean(1), atol=1e-5)
    # each draw predicts with its own statistics (eval-mode BatchNorm)
    z = (h - mean.unsqueeze(1)) / (var.unsqueeze(1) + 1e-5).sqrt() * post.draws["1.weight"][0].unsqueeze(1) + \
        post.draws["1.bias"][0].unsqueeze(1)
    f = torch.tanh(z) @ post.draws["3.weight"][0].transpose(-1, -2) + post.draws["3.bias"][0].unsqueeze(1)
    assert torch.allclose(post.predict(x, seed=0).f, bnn.to_original_units(f), atol=1e-4)
    assert torch.equal(bnn.net[1].running_mean, torch.zeros(4))  # the network's own buffers are untouched
    post.save(tmp_path / "post")
    loaded = load_posterior(tmp_path / "post")
    assert torch.equal(loaded.predict(x, y=y, seed=1).log_lik, post.predict(x, y=y, seed=1).log_lik)
    assert math.isfinite(az.loo(post.to_arviz(x, y)).elpd_loo)


def test_multiswag_batchnorm_statistics_at_each_members_mean():
    x, y, bnn = _batchnorm_problem()
    post = fit(bnn, x, y, backend="multiswag", seed=0, progress=False, num_members=2, num_samples=3,
               batchnorm="mean", **{**FAST, "batch_size": None, "epochs": 6, "max_rank": 3, "burnin_epochs": 3})
    mean = post.draws["batchnorm:1.running_mean"]  # [M, S, 4]
    assert torch.equal(mean[:, 0], mean[:, 2]) and not torch.allclose(mean[0, 0], mean[1, 0])


def test_unknown_batchnorm_refresh_is_a_clear_error():
    x, y, bnn = _batchnorm_problem()
    with pytest.raises(ValueError, match="unknown batchnorm 'none'; valid: draw, mean"):
        fit(bnn, x, y, backend="swag", progress=False, batchnorm="none", **FAST)


def test_multiswag_members_are_not_judged_as_unmixed_chains(conjugate_regression):
    """R-hat between MultiSWAG's members measures the method's own spread over modes, not a failure to mix:
    the export marks the chains as members and the convergence metrics leave R-hat and ESS out (the fit of
    an every-weight network gave R-hat 8.5 and the advice 'run longer chains')."""
    from inference.evaluation.diagnostics import convergence_metrics, convergence_warning

    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend="multiswag", seed=0, progress=False, num_members=3, num_samples=20,
               **FAST)
    idata = post.to_arviz(c.x, c.y, seed=0)
    assert idata.attrs["chains"] == "members"
    metrics = convergence_metrics(idata)
    assert metrics["chains_are_members"] and metrics["rhat_max"] is None and metrics["ess_bulk_min"] is None
    assert convergence_warning(metrics) is None
    single = fit(linear_bnn(c), c.x, c.y, backend="swag", seed=0, progress=False, num_samples=20, **FAST)
    assert "chains" not in single.to_arviz(c.x, c.y, seed=0).attrs


@pytest.mark.parametrize("stochastic, likelihood", [("all", GaussianLikelihood(0.1)),
                                                    ("last", GaussianLikelihood(learn_noise=True))])
def test_multiswag_members_start_from_the_ensemble_backends_fits(stochastic, likelihood):
    """Issue 38: MultiSWAG is SWAG around each deep-ensemble member (Wilson & Izmailov 2020), SWAG starts from a trained
    solution (Maddox et al. 2019).  The default burn-in is the ``ensemble`` backend's members' own training (200
    epochs), not the SWAG phase's epochs (100 by default), which left members from fresh starts underfitted on UCI
    energy (training RMSE up to 0.96 against 0.34).  With a negligible SWAG step the SWA means are those members;
    a trained body that sets a learned noise (``last``) gets the ensemble's held-out choice of the epochs too (trained
    for all 200 the GRU of the defaults matrix's body memorised its rows: SWAG covered 0.786 at 90 %)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(48, 1, generator=g) * 6 - 3
    y = torch.sin(x) + 0.1 * torch.randn(48, 1, generator=g)

    def bnn():
        torch.manual_seed(0)
        return BayesianNetwork(nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)), stochastic,
                               likelihood=likelihood, example_input=x[:2])

    options = {"num_members": 2, "batch_size": 16}
    ensemble = fit(bnn(), x, y, backend="ensemble", seed=0, progress=False, **options)
    swag = fit(bnn(), x, y, backend="multiswag", seed=0, progress=False, epochs=2, diag=True, lr=1e-9, lr_min=1e-9,
               num_samples=2, **options)
    members = ensemble.draws  # {site: [M, 1, ...]}
    swa_means = swag.param_draws()  # {site: [M, S, ...]}: S draws around each member's SWA mean, spread ~ 1e-9
    for name, value in members.items():
        torch.testing.assert_close(swa_means[name].mean(1), value[:, 0], atol=1e-4, rtol=1e-4)
    assert ("early_stopping" in ensemble.info) == (stochastic == "last")
    if stochastic == "last":  # the burn-in records the length it chose (the ensemble's), not the most it could take
        chosen = ensemble.info["early_stopping"]
        assert swag.info["burnin_epochs"] == chosen["epochs"] < 200
        assert swag.info["burnin_early_stopping"] == chosen
    else:
        assert swag.info["burnin_epochs"] == 200 and "burnin_early_stopping" not in swag.info


def test_an_explicit_burn_in_length_is_run_as_given_without_a_held_out_choice():
    """``burnin_epochs=E`` is the burn-in's length even where the default would choose it on held-out rows (a
    trained body with a learned noise): ``info["burnin_epochs"]`` is E and no choice is recorded."""
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, 1, generator=g) * 6 - 3
    y = torch.sin(x) + 0.1 * torch.randn(40, 1, generator=g)
    torch.manual_seed(0)
    bnn = BayesianNetwork(nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)), "last",
                          likelihood=GaussianLikelihood(learn_noise=True), example_input=x[:2])
    post = fit(bnn, x, y, backend="swag", seed=0, progress=False, epochs=3, burnin_epochs=7, batch_size=20,
               num_samples=2, diag=True)
    assert post.info["burnin_epochs"] == 7 and "burnin_early_stopping" not in post.info
