"""SGLD, pSGLD and SGHMC as Pyro MCMC kernels (``inference.sgmcmc.pyro_kernels``) on plain Pyro models.

Each kernel runs one chain under ``pyro.infer.MCMC``.  Tolerances come from Monte Carlo error.
SGLD and SGHMC are linear maps on a Gaussian target, so their stationary sd and the long-run
variance of the chain mean are known exactly (stationary covariance (P(I − εP/4))⁻¹ and
long-run covariance 4P⁻²/ε for SGLD; the discrete Lyapunov equation of the (z, v) map for
SGHMC).  On the ``conjugate_regression`` posterior (precision eigenvalues 111–256):

* SGLD, ε = 3e-3: sd inflated by 5–9 %; MC standard error of the mean ≤ 0.054 sd at 4000
  draws, ≤ 0.027 sd at 16000;
* SGHMC, η = 1e-3, α = 0.1: sd inflated by 2–3 %; MC error ≤ 0.029 sd at 2000 draws;
* pSGLD, ε = 1.2e-3 (no closed form): measured ESS ≥ 0.11 per draw, i.e. MC error ≤ 0.047 sd
  at 4000 draws, ≤ 0.024 sd at 16000.

A single SGLD chain needs ~16000 draws (≈ 20 s) for "mean within 0.1 posterior sd" at ≥ 3.5
standard errors, so the fast runs check 0.2 sd at 4000 draws (≥ 3.7 standard errors) and the
0.1-sd runs are marked slow; SGHMC mixes fast enough for 0.1 sd in the fast suite.  The sd
tolerances cover the discretisation bias plus ≈ 3 standard errors of the sd estimate.  The
Poisson–Gamma and minibatch tolerances are derived in their tests.
"""
from __future__ import annotations

import math
import pickle

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.mcmc.util import initialize_model

from tests.inference.conftest import make_conjugate_regression
from inference.sgmcmc.pyro_kernels import PSGLD, SGHMC, SGLD
from inference.sgmcmc.updates import polynomial_decay
from inference.sgmcmc.step_sizes import sghmc_step_size, sgld_step_size


def regression_model(x, y, noise_sd, prior_sd, subsample_size=None, subsample=None):
    """The ``conjugate_regression`` fixture as a plain Pyro model: y ~ N(x w + b, σ²), (w, b) ~ N(0, σ_p²)."""
    w = pyro.sample("w", dist.Normal(0.0, prior_sd).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, prior_sd))
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size, subsample=subsample) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w + b, noise_sd), obs=y[idx])


def run(kernel, data, num_samples, warmup_steps=300, **model_kwargs) -> MCMC:
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True)
    mcmc.run(data.x, data.y[:, 0], data.noise_sd, data.prior_sd, **model_kwargs)
    return mcmc


def regression_draws(mcmc: MCMC) -> torch.Tensor:
    """``[S, D + 1]``: weights then bias."""
    samples = mcmc.get_samples()
    return torch.cat([samples["w"], samples["b"][:, None]], dim=1)


# kernel, options, draws, tolerances (posterior sd) of the mean and relative of the sd
CONJUGATE = {
    "sgld": (SGLD, {"step_size": 3e-3}, 4000, 0.2, 0.2),
    "psgld": (PSGLD, {"step_size": 1.2e-3}, 4000, 0.2, 0.2),
    "sghmc": (SGHMC, {"step_size": 1e-3, "friction": 0.1}, 2000, 0.1, 0.15),
    "sgld-long": (SGLD, {"step_size": 3e-3}, 16_000, 0.1, 0.15),
    "psgld-long": (PSGLD, {"step_size": 1.2e-3}, 16_000, 0.1, 0.15),
}


@pytest.mark.parametrize("name", [pytest.param(k, marks=pytest.mark.slow) if "long" in k else k for k in CONJUGATE])
def test_kernel_recovers_the_conjugate_posterior(conjugate_regression, name):
    data = conjugate_regression
    kernel, options, num_samples, mean_tol, sd_tol = CONJUGATE[name]
    draws = regression_draws(run(kernel(regression_model, **options), data, num_samples))
    assert draws.shape == (num_samples, 3)
    assert ((draws.mean(0) - data.post_mean).abs() / data.post_sd).max() < mean_tol
    assert ((draws.std(0) / data.post_sd) - 1).abs().max() < sd_tol


def _largest_precision_eigenvalue(data) -> float:
    return float(torch.linalg.eigvalsh(torch.linalg.inv(data.post_cov.double())).max())


@pytest.mark.parametrize("kernel", [SGLD, SGHMC])
def test_default_step_size_follows_the_rule(kernel):
    """Chosen in setup from the curvature at the start: exactly the rule's step for the posterior
    precision's largest eigenvalue λ with full-batch steps (the Hessian is constant here); with a
    plate subsampling 50 of 500 rows, r = 10 from the site's scale and λ from 10 fixed minibatches
    (≈ 500 rows drawn with replacement: a few per cent of sampling error in λ)."""
    data = make_conjugate_regression(n=500)
    largest = _largest_precision_eigenvalue(data)

    def rule(batch_ratio):
        return sgld_step_size(largest, batch_ratio) if kernel is SGLD else sghmc_step_size(largest, batch_ratio, 0.1)

    for subsample_size, batch_ratio, tolerance in ((None, 1.0, 1e-3), (50, 10.0, 0.1)):
        k = kernel(regression_model)
        assert math.isnan(k.step_size)  # not chosen before setup
        k.setup(0, data.x, data.y[:, 0], data.noise_sd, data.prior_sd, subsample_size=subsample_size)
        assert k._batch_ratio == batch_ratio
        assert math.isclose(k.step_size, rule(batch_ratio), rel_tol=tolerance)


DEFAULT_STEP_DRAWS = 16_000


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [SGLD, PSGLD, SGHMC])
def test_default_step_size_recovers_the_posterior_from_minibatches(kernel):
    """N = 500 in minibatches of 50 with the default step (chosen at the uniform start and again
    after the 1 000 warm-up steps): the rule keeps the sd within 5 %; one chain at ε λ ≈ 0.04
    decorrelates in ≈ 130 steps, so 16 000 draws give an MC error of the mean ≈ 0.1 sd."""
    data = make_conjugate_regression(n=500)
    draws = regression_draws(run(kernel(regression_model), data, DEFAULT_STEP_DRAWS, warmup_steps=1000, subsample_size=50))
    assert ((draws.mean(0) - data.post_mean).abs() / data.post_sd).max() < 0.2
    ratio = draws.std(0) / data.post_sd
    assert 0.8 < ratio.min() and ratio.max() < 1.3


# Poisson–Gamma: rate ~ Gamma(1, 1), counts ~ Poisson(rate) ⇒ rate | counts ~ Gamma(1 + Σy, 1 + N)
COUNTS = torch.tensor([0.0, 1.0, 2.0, 0.0])
POSTERIOR = dist.Gamma(1.0 + COUNTS.sum(), 1.0 + len(COUNTS))  # Gamma(4, 5): mean 0.8, sd 0.4


def poisson_gamma_model(counts):
    rate = pyro.sample("rate", dist.Gamma(1.0, 1.0))
    with pyro.plate("counts", len(counts)):
        pyro.sample("obs", dist.Poisson(rate), obs=counts)


def test_positive_latent_is_sampled_with_the_log_jacobian():
    """Without the log-Jacobian the chain would sample Gamma(3, 5): mean 0.6, 0.5 sd off.

    SGHMC η = 0.04, α = 0.2 on log-rate (precision ≈ 4 at the mode): over seeds 0–4 the
    posterior means of rate and log-rate were off by ≤ 0.1 sd (MC error ≈ 0.05 sd at 3000
    draws; the Gaussian approximation's long-run variance gives 0.03) and the sd by ≤ 13 %, so
    0.2 sd is ≈ 4 standard errors and still far from the 0.5 sd of a missing Jacobian.
    """
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(poisson_gamma_model, step_size=0.04, friction=0.2), num_samples=3000, warmup_steps=300,
                disable_progbar=True)  # fmt: skip
    mcmc.run(COUNTS)
    rate = mcmc.get_samples()["rate"]
    assert (rate > 0).all()  # MCMC maps the draws back to the constrained space
    sd = POSTERIOR.stddev
    assert abs(rate.mean() - POSTERIOR.mean) / sd < 0.2
    assert abs(rate.std() / sd - 1) < 0.2
    log_rate_mean = torch.digamma(POSTERIOR.concentration) - POSTERIOR.rate.log()
    log_rate_sd = torch.polygamma(1, POSTERIOR.concentration).sqrt()
    assert abs(rate.log().mean() - log_rate_mean) / log_rate_sd < 0.2


def test_potential_matches_pyros_with_the_jacobian():
    """The kernel's potential equals Pyro's (``initialize_model``) value and gradient, Jacobian included."""
    _, pyro_potential, transforms, _ = initialize_model(poisson_gamma_model, (COUNTS,))
    kernel = SGLD(poisson_gamma_model, step_size=0.1)
    kernel.setup(0, COUNTS)
    assert type(kernel.transforms["rate"]) is type(transforms["rate"])
    for z in (-1.5, 0.0, 0.7):
        ours = torch.tensor(z, requires_grad=True)
        theirs = torch.tensor(z, requires_grad=True)
        u, v = kernel.potential_fn({"rate": ours}), pyro_potential({"rate": theirs})
        assert torch.allclose(u, v)
        assert torch.allclose(torch.autograd.grad(u, ours)[0], torch.autograd.grad(v, theirs)[0])
    # and by hand: −log π(z) = −[log Gamma(e^z; 1, 1) + Σ log Poisson(y; e^z) + z]
    z = torch.tensor(0.3)
    by_hand = dist.Gamma(1.0, 1.0).log_prob(z.exp()) + dist.Poisson(z.exp()).log_prob(COUNTS).sum() + z
    assert torch.allclose(kernel.potential_fn({"rate": z}), -by_hand)


def test_subsampled_plate_scales_the_likelihood_by_n_over_batch(conjugate_regression):
    """On a minibatch the potential is −[log p(w, b) + (N/n) Σ_batch log p(y_i | w, b)]."""
    data = conjugate_regression
    batch = torch.tensor([3, 17, 22, 39])
    kernel = SGLD(regression_model, step_size=1e-3)
    kernel.setup(0, data.x, data.y[:, 0], data.noise_sd, data.prior_sd, subsample=batch)
    w, b = torch.tensor([0.9, -0.4]), torch.tensor(0.1)
    prior = dist.Normal(0.0, data.prior_sd)
    likelihood = dist.Normal(data.x[batch] @ w + b, data.noise_sd).log_prob(data.y[batch, 0]).sum()
    expected = prior.log_prob(w).sum() + prior.log_prob(b) + len(data.x) / len(batch) * likelihood
    assert torch.allclose(kernel.potential_fn({"w": w, "b": b}), -expected)


def test_minibatch_sgld_recovers_the_posterior(conjugate_regression):
    """SGLD on minibatches of n = 20 of N = 40 drawn by a subsampled plate.

    The gradient noise adds ≈ (ε/4)·Var(g̃) ≈ 10 % to the injected noise's variance on top of
    the discretisation bias of ε = 2.5e-3 (sd 4–8 % too wide): over seeds 0–3 the sd was 4–17 %
    too wide and the mean off by ≤ 0.11 sd (MC error ≤ 0.059 sd at 4000 draws), hence 0.25 for
    both.  Without the N/n scale the likelihood would count n of N points: the sd √2 = 1.41×
    too wide, which fails the sd check.
    """
    data = conjugate_regression
    draws = regression_draws(run(SGLD(regression_model, step_size=2.5e-3), data, 4000, subsample_size=20))
    assert ((draws.mean(0) - data.post_mean).abs() / data.post_sd).max() < 0.25
    assert ((draws.std(0) / data.post_sd) - 1).abs().max() < 0.25


def test_summary_arviz_and_diagnostics(capsys):
    mcmc = MCMC(SGHMC(poisson_gamma_model, step_size=0.02), num_samples=300, warmup_steps=50, disable_progbar=True)
    mcmc.run(COUNTS)
    mcmc.summary()
    printed = capsys.readouterr().out
    assert "rate" in printed and "n_eff" in printed and "Number of divergences: 0" in printed
    assert mcmc.diagnostics()["step size"] == {"chain 0": 0.02}
    idata = az.from_pyro(mcmc)
    assert idata.posterior["rate"].shape == (1, 300)
    assert idata.log_likelihood["obs"].shape == (1, 300, len(COUNTS))
    assert idata.observed_data["obs"].shape == (len(COUNTS),)
    assert not idata.sample_stats["diverging"].any()
    assert list(az.summary(idata).index) == ["rate"]


def test_seeded_by_pyro_set_rng_seed(conjugate_regression):
    def draws(seed):
        pyro.set_rng_seed(seed)
        return regression_draws(run(PSGLD(regression_model, step_size=1e-3), conjugate_regression, 20, warmup_steps=5))

    assert torch.equal(draws(3), draws(3))
    assert not torch.equal(draws(3), draws(4))


def test_initial_params_and_a_step_size_schedule(conjugate_regression):
    data = conjugate_regression
    schedule = polynomial_decay(2e-3, offset=10, decay=0.55)
    kernel = SGLD(regression_model, step_size=schedule)
    start = {"w": torch.tensor([1.0, -0.5]), "b": torch.tensor(0.2)}
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=0, initial_params=start, disable_progbar=True)
    mcmc.run(data.x, data.y[:, 0], data.noise_sd, data.prior_sd)
    first = mcmc.get_samples()["w"][0]
    assert (first - start["w"]).abs().max() < 0.2  # one step from the given start
    assert math.isclose(mcmc.diagnostics()["step size"]["chain 0"], schedule(29))


@pytest.mark.parametrize(
    "make, option",
    [
        (lambda m: SGLD(m, step_size=0.0), "step_size"),
        (lambda m: SGLD(m, step_size=-1e-3), "step_size"),
        (lambda m: SGLD(m, step_size=float("nan")), "step_size"),
        (lambda m: SGLD(m, step_size=lambda t: -1.0), "step_size"),
        (lambda m: PSGLD(m, step_size=1e-3, rms_decay=1.0), "rms_decay"),
        (lambda m: PSGLD(m, step_size=1e-3, rms_damping=0.0), "rms_damping"),
        (lambda m: PSGLD(m, step_size=1e-3, num_data=0), "num_data"),
        (lambda m: SGHMC(m, step_size=1e-3, friction=0.0), "friction"),
        (lambda m: SGHMC(m, step_size=1e-3, friction=1.5), "friction"),
        (lambda m: SGLD(m, step_size=1e-3, init_strategy="bogus"), "init_strategy"),
        (lambda m: SGLD("not a model", step_size=1e-3), "model"),
    ],
)
def test_bad_options_raise_naming_the_option(make, option):
    with pytest.raises(ValueError, match=option):
        make(poisson_gamma_model)


def test_bad_models_and_starts_raise(conjugate_regression):
    data = conjugate_regression
    args = (data.x, data.y[:, 0], data.noise_sd, data.prior_sd)

    def start_at(model, start, *model_args):
        MCMC(SGLD(model, step_size=1e-3), num_samples=5, initial_params=start, disable_progbar=True).run(*model_args)

    with pytest.raises(ValueError, match="unknown sites \\['v'\\]"):
        start_at(regression_model, {"v": torch.zeros(2), "b": torch.tensor(0.0)}, *args)
    with pytest.raises(ValueError, match="initial_params\\['w'\\] has shape \\(3,\\), expected \\(2,\\)"):
        start_at(regression_model, {"w": torch.zeros(3), "b": torch.tensor(0.0)}, *args)
    with pytest.raises(ValueError, match="not finite at the given initial_params"):
        start_at(poisson_gamma_model, {"rate": torch.tensor(float("nan"))}, COUNTS)

    with pytest.raises(ValueError, match="no finite log density at 100 initial points"):
        MCMC(SGLD(poisson_gamma_model, step_size=1e-3), num_samples=5, disable_progbar=True).run(torch.tensor([-1.0]))

    def discrete(counts):
        pyro.sample("k", dist.Bernoulli(0.5))

    for init in ("uniform", "sample"):  # Pyro's init_to_uniform refuses it first, init_to_sample does not
        with pytest.raises(ValueError, match="discrete sample site 'k'"):
            MCMC(SGLD(discrete, step_size=1e-3, init_strategy=init), num_samples=5, disable_progbar=True).run(COUNTS)
    with pytest.raises(ValueError, match="no latent"):
        MCMC(SGLD(lambda: pyro.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0)), step_size=1e-3),
             num_samples=5, disable_progbar=True).run()  # fmt: skip
    with pytest.raises(RuntimeError, match="non-finite.*smaller step_size"):
        run(SGLD(regression_model, step_size=10.0), data, num_samples=200, warmup_steps=0)


def test_kernel_pickles_for_spawned_chain_workers():
    """``MCMC(num_chains > 1, mp_context="spawn")`` pickles the kernel (and its step size) for its workers."""
    kernel = pickle.loads(pickle.dumps(SGHMC(poisson_gamma_model, step_size=0.04, friction=0.2)))
    assert kernel.step_size == 0.04 and kernel.friction == 0.2
    assert math.isnan(pickle.loads(pickle.dumps(PSGLD(poisson_gamma_model))).step_size)  # chosen by each worker's setup


def test_a_step_above_the_stability_limit_backs_off_in_the_warm_up(conjugate_regression):
    """SGLD at 30× its stability limit 4/λ overflows within the warm-up; the kernel restarts from its start
    with a quarter of the step until it is stable (the fit backends' back-off) and samples; with no
    warm-up left to restart in, the overflow raises."""
    data = conjugate_regression
    limit = 4 / _largest_precision_eigenvalue(data)
    pyro.set_rng_seed(0)
    with pytest.warns(RuntimeWarning, match="restarting from the start with step size") as caught:
        mcmc = run(SGLD(regression_model, step_size=30 * limit), data, num_samples=200, warmup_steps=200)
    draws = regression_draws(mcmc)
    assert bool(torch.isfinite(draws).all())
    backoffs = [w for w in caught if "restarting from the start" in str(w.message)]
    final = float(str(backoffs[-1].message).split("with step size ")[-1].split(" ")[0])
    assert 1 <= len(backoffs) <= 3 and final == pytest.approx(30 * limit / 4 ** len(backoffs), rel=1e-2)
    assert final < limit
    with pytest.raises(RuntimeError, match="non-finite at step .* after 0 back-off"):
        run(SGLD(regression_model, step_size=30 * limit), data, num_samples=200, warmup_steps=0)
