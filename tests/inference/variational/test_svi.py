"""SVI backend: known posterior, KL annealing, non-finite losses, options, save/load, ArviZ."""
import math

import arviz as az
import numpy as np
import pytest
import scipy.stats as st
import torch
from torch.distributions import biject_to
from torch import nn

from tests.inference.conftest import flat_linear_draws, make_conjugate_regression
from inference import NonFiniteLossError, fit, load_netcdf, load_posterior, save_netcdf
from inference.variational.guides import build_guide
from inference.optim.latent_fit import fit_latents
from inference.optim.training import average_particles, kl_weight, optimiser_step, pretrain
from zoo import BayesianNetwork, GaussianLikelihood, LaplacePrior, NormalPrior, StudentTLikelihood


def conjugate_bnn(problem, **kwargs):
    return BayesianNetwork(
        problem.net(),
        stochastic="all",
        prior=NormalPrior(problem.prior_sd),
        likelihood=GaussianLikelihood(noise_sd=problem.noise_sd),
        output_dim=1,
        **kwargs,
    )


def test_svi_recovers_conjugate_posterior_mean(conjugate_regression):
    problem = conjugate_regression
    post = fit(
        conjugate_bnn(problem), problem.x, problem.y, backend="svi", seed=0, progress=False,
        epochs=2000, batch_size=None, lr=0.03, lr_final_factor=0.003, num_particles=8, init_scale=0.05,
    )
    assert post.info["elbo_path"] == "fused"  # Normal priors: the trace-free path (tests/inference/variational/test_elbo_paths.py)
    draws = flat_linear_draws(post.sample_params(8000, seed=1))
    # Monte Carlo error of the draw mean is sd/sqrt(8000) ≈ 0.011 sd, well inside the 0.1 sd bound
    z = (draws.mean(0) - problem.post_mean) / problem.post_sd
    assert z.abs().max() < 0.1, z
    # mean-field sds are the inverse diagonal precisions: never larger than the true marginal sds
    precision = torch.linalg.inv(problem.post_cov)
    mf_sd = precision.diagonal().rsqrt()
    assert torch.allclose(draws.std(0), mf_sd, rtol=0.1), (draws.std(0), mf_sd)


def test_minibatch_likelihood_is_scaled_to_full_data(conjugate_regression):
    problem = conjugate_regression
    post = fit(
        conjugate_bnn(problem), problem.x, problem.y, backend="svi", seed=0, progress=False,
        epochs=600, batch_size=10, lr=0.02, num_particles=2, init_scale=0.05,
    )
    draws = flat_linear_draws(post.sample_params(8000, seed=1))
    z = (draws.mean(0) - problem.post_mean) / problem.post_sd
    # minibatch gradient noise widens the tolerance; an unscaled likelihood would be off by > 2 sd
    assert z.abs().max() < 0.5, z


def test_kl_annealing_schedule():
    assert kl_weight(0, 3, 4) == 0.0
    assert kl_weight(2.9, 3, 4) == 0.0
    assert kl_weight(5, 3, 4) == pytest.approx(0.5)
    assert kl_weight(7, 3, 4) == 1.0
    assert kl_weight(100, 3, 4) == 1.0
    assert kl_weight(0, 0, 0) == 1.0


def test_particles_are_averaged_with_the_kl_weight():
    draws = iter([(torch.tensor(2.0), torch.tensor(1.0)), (torch.tensor(4.0), torch.tensor(3.0))])
    loss, loglik, kl = average_particles(lambda: next(draws), 2, beta=0.5)
    assert (float(loglik), float(kl)) == (3.0, 2.0)
    assert float(loss) == 0.5 * 2.0 - 3.0  # β · mean KL − mean expected log-likelihood


def test_pretraining_reaches_the_least_squares_fit(conjugate_regression):
    problem = conjugate_regression
    bnn = conjugate_bnn(problem)
    values = pretrain(bnn, problem.x, problem.y, epochs=1500, lr=0.05, batch_size=None,
                      generator=torch.Generator().manual_seed(0), progress=False)
    design = torch.cat([problem.x, torch.ones(problem.x.shape[0], 1)], 1)
    ls = torch.linalg.lstsq(design, problem.y).solution.reshape(-1)
    torch.testing.assert_close(torch.cat([values["weight"].reshape(-1), values["bias"].reshape(-1)]), ls, atol=2e-3, rtol=0)


def test_latent_fit_is_the_closed_form_map_of_the_gaussian_noise_precision():
    """For fixed outputs the MAP of τ_t under a Gamma(a, b) prior is (a − 1 + N/2) / (b + Σ r²/2)."""
    g = torch.Generator().manual_seed(0)
    f, y = torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g) * torch.tensor([0.3, 2.0])
    likelihood = GaussianLikelihood(learn_noise=True, precision_concentration=2.0, precision_rate=0.5)
    fitted = fit_latents(likelihood, f, y, {"noise_precision": torch.ones(2)})["noise_precision"]
    exact = (2.0 - 1 + 500 / 2) / (0.5 + ((y - f) ** 2).sum(0) / 2)
    torch.testing.assert_close(fitted, exact, rtol=1e-5, atol=0)


def test_pretraining_fits_the_likelihood_latents_and_the_guide_starts_there():
    """Constant mean on 4000 draws of 0.5 + 0.7 t_4: after pretraining, (ν, s) are scipy's maximum-likelihood
    fit at the pretrained location (the weak Gamma priors shift the MAP by < 1 %), within ~3 standard errors
    of the truth, and the mean-field guide's latents start at them (before: at their prior medians)."""
    nu, scale, n = 4.0, 0.7, 4000
    y = torch.tensor(0.5 + scale * st.t.rvs(nu, size=(n, 1), random_state=np.random.default_rng(0)),
                     dtype=torch.float32)
    torch.manual_seed(0)
    bnn = BayesianNetwork(nn.Linear(1, 1), "all", output_dim=1,
                          likelihood=StudentTLikelihood(learn_scale=True, learn_dof=True))
    values = pretrain(bnn, torch.zeros(n, 1), y, epochs=100, lr=0.05, batch_size=None,
                      generator=torch.Generator().manual_seed(0), progress=False)
    loc = float(values["bias"])
    nu_hat, s_hat = float(values["dof"]), float(values["noise_precision"] ** -0.5)
    mle_nu, _, mle_scale = st.t.fit(y.numpy().ravel(), floc=loc)
    assert abs(nu_hat - mle_nu) < 0.02 * mle_nu and abs(s_hat - mle_scale) < 0.005 * mle_scale, (nu_hat, mle_nu)
    assert abs(nu_hat - nu) < 1.0 and abs(s_hat - scale) < 0.05  # ~3 standard errors of ν̂ and ŝ at N = 4000
    guide = build_guide("normal", bnn, init_values=values)
    start = guide.median()
    for name in ("dof", "noise_precision"):
        torch.testing.assert_close(start[name], values[name], rtol=1e-5, atol=0)
    for family in ("graves", "sparse-vd", "kingma-vd"):  # the mean-field families' latent factors too
        factors = build_guide("mean-field", bnn, init_values=values, family=family).latents
        for name in ("dof", "noise_precision"):
            start = biject_to(factors.priors[name].support)(factors.loc[name].detach())
            torch.testing.assert_close(start, values[name].reshape(start.shape), rtol=1e-5, atol=0)
    priors = build_guide("mean-field", bnn).latents  # no latent values given: the prior means
    start = biject_to(priors.priors["dof"].support)(priors.loc["dof"].detach())
    torch.testing.assert_close(start, priors.priors["dof"].mean, rtol=1e-5, atol=0)


def test_progress_bar_can_be_silenced(conjugate_regression, capfd):
    problem = conjugate_regression
    fit(conjugate_bnn(problem), problem.x, problem.y, progress=False, epochs=2, pretrain_epochs=1)
    assert capfd.readouterr().err == ""
    fit(conjugate_bnn(problem), problem.x, problem.y, progress=True, epochs=2)
    assert "svi" in capfd.readouterr().err


def test_kl_annealing_is_recorded(conjugate_regression):
    problem = conjugate_regression
    post = fit(conjugate_bnn(problem), problem.x, problem.y, progress=False, epochs=10, batch_size=None,
               kl_warmup_epochs=3, kl_anneal_epochs=4)
    weights = post.info["history"]["kl_weight"]
    assert weights[:3] == [0.0, 0.0, 0.0] and weights[-1] == 1.0
    assert all(b >= a for a, b in zip(weights, weights[1:]))


class ExplodesAfter(nn.Module):
    """A linear net whose output turns NaN from the ``after``-th forward call on."""

    def __init__(self, after):
        super().__init__()
        self.lin = nn.Linear(2, 1)
        self.calls = 0
        self.after = after

    def forward(self, x):
        self.calls += int(self.training)  # fit's eval-mode forward checks do not count
        out = self.lin(x)
        return out * float("nan") if self.calls > self.after else out


def test_nan_loss_stops_with_step_and_keeps_last_finite_state(conjugate_regression):
    problem = conjugate_regression
    net = ExplodesAfter(after=6)
    bnn = BayesianNetwork(net, "all", likelihood=GaussianLikelihood(0.5), output_dim=1)
    with pytest.raises(NonFiniteLossError) as info:
        fit(bnn, problem.x, problem.y, progress=False, epochs=50, batch_size=None)
    err = info.value
    assert err.step == 6  # forwards 1..6 (steps 0..5) were finite; the 7th is step 6
    assert "step 6" in str(err)
    net.after = 10**9  # the kept state must be finite and usable
    params = err.posterior.sample_params(10)
    assert all(torch.isfinite(v).all() for v in params.values())
    assert torch.isfinite(err.posterior.predict(problem.x, num_samples=5).mean).all()


def test_optimiser_step_without_clipping_is_the_clip_grad_norm_step_and_refuses_nonfinite_gradients():
    """With clip = inf the step computes the gradient norm without applying it: the same update as
    ``clip_grad_norm_(params, inf)``; an infinite gradient with a finite loss stops before any update."""
    start = torch.tensor([0.3, -1.2, 2.0])

    def particle(w):
        return -(w * w).sum() * 3.0, (w.abs() ** 3).sum()

    updated = []
    for clip_old_way in (False, True):
        w = nn.Parameter(start.clone())
        optimizer = torch.optim.Adam([w], lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        if clip_old_way:
            loss = 0.5 * particle(w)[1] - particle(w)[0]
            optimizer.zero_grad()
            loss.backward()
            assert torch.isfinite(torch.nn.utils.clip_grad_norm_([w], math.inf))
            optimizer.step()
        else:
            optimiser_step(lambda: particle(w), 1, 0.5, optimizer, scheduler, [w], math.inf, 0, lambda: None)
        updated.append(w.detach().clone())
    torch.testing.assert_close(updated[0], updated[1], rtol=0, atol=0)
    assert not torch.equal(updated[0], start)

    w = nn.Parameter(torch.tensor([0.0, 1.0]))
    optimizer = torch.optim.Adam([w], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    for clip in (math.inf, 10.0):
        with pytest.raises(NonFiniteLossError, match="the gradient became non-finite at step 4"):
            optimiser_step(lambda: (w.sqrt().sum(), w.new_zeros(())), 1, 1.0, optimizer, scheduler, [w], clip, 4, lambda: None)
        assert torch.equal(w.detach(), torch.tensor([0.0, 1.0]))


def test_unknown_and_invalid_options_are_clear(conjugate_regression):
    problem = conjugate_regression
    bnn = conjugate_bnn(problem)
    with pytest.raises(ValueError, match="valid options: .*epochs"):
        fit(bnn, problem.x, problem.y, progress=False, epoch=3)
    with pytest.raises(ValueError, match="lr must be positive"):
        fit(bnn, problem.x, problem.y, progress=False, lr=-1.0)
    with pytest.raises(ValueError, match="unknown lr_schedule"):
        fit(bnn, problem.x, problem.y, progress=False, lr_schedule="wild")
    with pytest.raises(ValueError, match="valid backends: .*svi"):
        fit(bnn, problem.x, problem.y, backend="magic")


def test_bad_training_data_is_rejected(conjugate_regression):
    problem = conjugate_regression
    bnn = conjugate_bnn(problem)
    x = problem.x.clone()
    x[3, 1] = float("nan")
    with pytest.raises(ValueError, match="row"):
        fit(bnn, x, problem.y, progress=False)
    with pytest.raises(ValueError, match="rows"):
        fit(bnn, problem.x, problem.y[:-1], progress=False)
    with pytest.raises(ValueError, match="target columns"):
        fit(bnn, problem.x, problem.y.repeat(1, 2), progress=False)


def test_laplace_prior_uses_monte_carlo_kl(conjugate_regression):
    problem = conjugate_regression
    bnn = BayesianNetwork(problem.net(), "all", prior=LaplacePrior(1.0),
                          likelihood=GaussianLikelihood(problem.noise_sd), output_dim=1)
    post = fit(bnn, problem.x, problem.y, progress=False, epochs=400, batch_size=None, lr=0.03)
    assert post.info["elbo_path"] == "pyro-trace"
    draws = flat_linear_draws(post.sample_params(4000, seed=1))
    # with 40 points the likelihood dominates: the mean is near the Gaussian-prior answer
    assert ((draws.mean(0) - problem.post_mean).abs() < 3 * problem.post_sd).all()


def test_save_load_round_trip_gives_identical_predictions(tmp_path, conjugate_regression):
    problem = conjugate_regression
    bnn = BayesianNetwork(problem.net(), "all", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1,
                          target_loc=torch.tensor([3.0]), target_scale=torch.tensor([2.0]))
    post = fit(bnn, problem.x, problem.y, progress=False, epochs=30, batch_size=None)
    post.save(tmp_path / "post")
    loaded = load_posterior(tmp_path / "post")
    y = problem.y * 2 + 3
    a = post.predict(problem.x, num_samples=50, y=y, seed=3)
    b = loaded.predict(problem.x, num_samples=50, y=y, seed=3)
    assert torch.equal(a.f, b.f) and torch.equal(a.y, b.y) and torch.equal(a.log_lik, b.log_lik)
    assert loaded.info["backend"] == "svi"


def test_arviz_export_supports_loo_waic_compare_and_netcdf(tmp_path, conjugate_regression):
    problem = conjugate_regression
    idatas = {}
    for selection in ("all", "none"):
        bnn = BayesianNetwork(problem.net(), selection, likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)
        post = fit(bnn, problem.x, problem.y, progress=False, epochs=60, batch_size=None)
        idatas[selection] = post.to_arviz(problem.x, problem.y, num_samples=100)
    idata = idatas["all"]
    assert set(idata.groups()) >= {"posterior", "log_likelihood", "posterior_predictive", "observed_data"}
    assert idata.posterior["weight"].dims == ("chain", "draw", "weight_dim_0", "weight_dim_1")
    assert idata.log_likelihood["obs"].shape == (1, 100, problem.x.shape[0])
    assert idata.posterior_predictive["obs"].shape == (1, 100, problem.x.shape[0], 1)
    loo = az.loo(idata, pointwise=True)
    waic = az.waic(idata)
    assert math.isfinite(loo.elpd_loo) and math.isfinite(waic.elpd_waic)
    table = az.compare(idatas)
    assert set(table.index) == {"all", "none"}
    save_netcdf(idata, tmp_path / "p.nc")
    back = load_netcdf(tmp_path / "p.nc")
    assert float(abs(back.log_likelihood["obs"] - idata.log_likelihood["obs"]).max()) == 0.0


def test_module_local_params_keep_posteriors_independent(conjugate_regression):
    problem = conjugate_regression
    first = fit(conjugate_bnn(problem), problem.x, problem.y, progress=False, epochs=50, batch_size=None)
    before = first.sample_params(20, seed=0)["weight"].clone()
    fit(conjugate_bnn(problem), problem.x, -problem.y, progress=False, epochs=50, batch_size=None)
    assert torch.equal(first.sample_params(20, seed=0)["weight"], before)


def test_large_problem_helper_is_reproducible():
    a = make_conjugate_regression(seed=3)
    b = make_conjugate_regression(seed=3)
    assert torch.equal(a.y, b.y)


def test_non_finite_loss_error_crosses_process_boundaries():
    """An experiment's worker sends the error to its parent by pickling: message and step survive,
    the in-process posterior stays behind (unpickling used to fail and break the worker pool)."""
    import pickle

    err = NonFiniteLossError(4, "the log density or its gradient", posterior=object())
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NonFiniteLossError and str(back) == str(err)
    assert back.step == 4 and back.posterior is None


@pytest.mark.parametrize("backend", ["svi", "graves", "radial", "map"])
def test_a_diverging_learning_rate_stops_with_the_step_not_a_distribution_error(backend):
    """lr=1e30 makes the parameters non-finite in one update: the next step's distributions refuse
    them; the fit stops with NonFiniteLossError naming the step (not torch's "found invalid values")."""
    from tests.inference.backends.test_backends_x_likelihoods import tiny_problem

    from inference import NonFiniteLossError

    bnn, x, _, y = tiny_problem(backend, "heteroscedastic", beta=0.5)
    with pytest.raises(NonFiniteLossError, match=r"non-finite at step \d+") as caught:
        fit(bnn, x, y, backend=backend, lr=1e30, epochs=5, batch_size=8, progress=False)
    assert caught.value.posterior is not None and caught.value.step <= 1
