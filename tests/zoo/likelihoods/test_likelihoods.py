"""Likelihoods: densities and CDFs against scipy.stats, the output Fisher against the expected
Hessian, the registry, β-NLL, the mean-head selector, mixture-PIT coverage against sampling, and
the recovery of a heteroscedastic noise curve and of Student-t parameters."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats as st
import torch
from torch.func import hessian, vmap

from zoo import BayesianNetwork, MeanHead
from zoo.architectures import MLP
from zoo.likelihoods import (LIKELIHOODS, CategoricalLikelihood, GaussianLikelihood,
                             HeteroscedasticGaussianLikelihood, StudentTLikelihood, make_likelihood, student_t_cdf)

LOC, SCALE = torch.tensor([1.5, -2.0], dtype=torch.float64), torch.tensor([3.0, 0.5], dtype=torch.float64)


def _inputs(heads=1, targets=2, draws=3, points=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(draws, points, heads * targets, generator=g, dtype=torch.float64)
    y_std = torch.randn(points, targets, generator=g, dtype=torch.float64) * 1.5
    return f, y_std, LOC + SCALE * y_std  # y in original units


def _studentt_latents(draws):
    return {"noise_precision": torch.tensor([[4.0, 0.5]], dtype=torch.float64).expand(draws, 2),
            "dof": torch.tensor([[3.0, 12.0]], dtype=torch.float64).expand(draws, 2)}


# ---------------------------------------------------------------- densities and CDFs vs scipy
def test_gaussian_log_prob_and_cdf_match_scipy_in_original_units():
    f, _, y = _inputs()
    lik = GaussianLikelihood(learn_noise=True)
    latents = {"noise_precision": torch.tensor([[4.0, 0.25]] * 3, dtype=torch.float64)}
    sd = latents["noise_precision"].rsqrt().unsqueeze(1)  # [S, 1, T]
    loc, scale = (LOC + SCALE * f).numpy(), (SCALE * sd).numpy()
    expected = st.norm.logpdf(y.numpy()[None], loc, scale).sum(-1)
    got = lik.log_prob(f, y, latents, target_loc=LOC, target_scale=SCALE)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10)
    pit = lik.cdf(f, y, latents, target_loc=LOC, target_scale=SCALE)
    np.testing.assert_allclose(pit.numpy(), st.norm.cdf(y.numpy()[None], loc, scale).mean(0), rtol=1e-10)


def test_heteroscedastic_log_prob_and_cdf_match_scipy_in_original_units():
    f, _, y = _inputs(heads=2)
    lik = HeteroscedasticGaussianLikelihood(beta=0.5)
    mean, log_var = f[..., :2], f[..., 2:]
    loc, scale = (LOC + SCALE * mean).numpy(), (SCALE * (0.5 * log_var).exp()).numpy()
    expected = st.norm.logpdf(y.numpy()[None], loc, scale).sum(-1)
    got = lik.log_prob(f, y, {}, target_loc=LOC, target_scale=SCALE)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10)  # β never enters the reported density
    np.testing.assert_allclose(lik.cdf(f, y, {}, target_loc=LOC, target_scale=SCALE).numpy(),
                               st.norm.cdf(y.numpy()[None], loc, scale).mean(0), rtol=1e-10)
    torch.testing.assert_close(lik.noise_variance(f, {}), log_var.exp())
    torch.testing.assert_close(lik.predictive_mean(f, {}), mean)


def test_studentt_log_prob_and_cdf_match_scipy_in_original_units():
    f, _, y = _inputs()
    lik = StudentTLikelihood(learn_scale=True, learn_dof=True)
    latents = _studentt_latents(3)
    s, nu = latents["noise_precision"].rsqrt().unsqueeze(1).numpy(), latents["dof"].unsqueeze(1).numpy()
    loc, scale = (LOC + SCALE * f).numpy(), SCALE.numpy() * s
    expected = st.t.logpdf(y.numpy()[None], nu, loc, scale).sum(-1)
    got = lik.log_prob(f, y, latents, target_loc=LOC, target_scale=SCALE)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(lik.cdf(f, y, latents, target_loc=LOC, target_scale=SCALE).numpy(),
                               st.t.cdf(y.numpy()[None], nu, loc, scale).mean(0), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dof", [0.7, 1.0, 2.5, 5.0, 40.0, 500.0])
def test_student_t_cdf_matches_scipy_including_far_tails(dof):
    t = torch.cat([torch.linspace(-50, 50, 201), torch.tensor([-1e4, 1e4, 0.0])]).double()
    np.testing.assert_allclose(student_t_cdf(t, torch.tensor(dof, dtype=torch.float64)).numpy(), st.t.cdf(t.numpy(), dof),
                               rtol=1e-9, atol=1e-13)


def test_studentt_noise_variance_is_infinite_at_and_below_two_dof():
    f = torch.zeros(2, 3, 1, dtype=torch.float64)
    assert torch.isinf(StudentTLikelihood(scale=0.5, dof=2.0).noise_variance(f, {})).all()
    var = StudentTLikelihood(scale=0.5, dof=5.0).noise_variance(f, {})
    assert var.shape == (2, 1, 1) and float(var[0, 0, 0]) == pytest.approx(0.25 * 5 / 3)


# ---------------------------------------------------------------- output Fisher = expected Hessian
def _expected_hessian(lik, f, latents, num_y=40000, seed=0):
    """Monte Carlo E_y[−∂² log p(y | f)/∂f²] ``[N, P, P]`` and its standard error, by autograd."""
    g = torch.Generator().manual_seed(seed)
    batched = {k: v.unsqueeze(0) for k, v in latents.items()}
    ys = lik.sample(f.unsqueeze(0).expand(num_y, *f.shape), {k: v.expand(num_y, *v.shape[1:]) for k, v in
                                                                batched.items()}, generator=g)  # [M, N, T]

    def nll(fn, yn):  # one point: fn [P], yn [T]
        return -lik.log_prob(fn.view(1, 1, -1), yn.view(1, -1), batched).sum()

    per_point = []
    for n in range(f.shape[0]):
        h = vmap(hessian(nll), in_dims=(None, 0))(f[n], ys[:, n])  # [M, P, P]
        per_point.append((h.mean(0), h.std(0) / math.sqrt(num_y)))
    return torch.stack([m for m, _ in per_point]), torch.stack([s for _, s in per_point])


@pytest.mark.parametrize("name", ["gaussian", "heteroscedastic", "softplus", "studentt", "categorical"])
def test_output_fisher_is_the_expected_hessian_of_the_nll(name):
    g = torch.Generator().manual_seed(1)
    lik = {"gaussian": GaussianLikelihood(learn_noise=True), "heteroscedastic": HeteroscedasticGaussianLikelihood(),
           "softplus": HeteroscedasticGaussianLikelihood(variance="softplus"),
           "studentt": StudentTLikelihood(learn_scale=True, learn_dof=True), "categorical": CategoricalLikelihood()}[name]
    latents = {"gaussian": {"noise_precision": torch.tensor([4.0, 0.5], dtype=torch.float64)},
               "studentt": {k: v[0] for k, v in _studentt_latents(1).items()}}.get(name, {})
    width = {"heteroscedastic": 4, "softplus": 4, "categorical": 3}.get(name, 2)
    f = torch.randn(3, width, generator=g, dtype=torch.float64)
    fisher = lik.output_fisher(f, latents)
    assert fisher.shape == (3, width, width)
    if name == "categorical":  # the Hessian does not depend on the label: exact
        h = vmap(hessian(lambda fn: -torch.log_softmax(fn, -1)[0]))(f)
        torch.testing.assert_close(fisher, h)
        return
    expected, se = _expected_hessian(lik, f, latents)
    assert bool(((fisher - expected).abs() <= 5 * se + 1e-9).all()), (fisher, expected, se)
    if name == "heteroscedastic":
        torch.testing.assert_close(torch.diagonal(fisher, dim1=-2, dim2=-1)[:, 2:], torch.full((3, 2), 0.5,
                                                                                             dtype=torch.float64))


def test_heteroscedastic_fisher_is_zero_for_a_clamped_log_variance():
    f = torch.tensor([[0.0, 100.0]], dtype=torch.float64)  # log σ² beyond the clamp: no gradient, no curvature
    for variance in ("log", "softplus"):
        fisher = HeteroscedasticGaussianLikelihood(variance=variance).output_fisher(f, {})
        assert float(fisher[0, 1, 1]) == 0.0 and float(fisher[0, 0, 0]) > 0


def test_softplus_variance_link_is_the_deep_ensemble_papers():
    """σ² = log(1 + e^v) + 10⁻⁶ (Lakshminarayanan et al. 2017, Section 2.2.1), capped at σ = 10 like the log link;
    the density is the Gaussian's with that variance; reprs and saves of the default log link are unchanged."""
    f, _, y = _inputs(heads=2)
    lik = HeteroscedasticGaussianLikelihood(variance="softplus")
    variance = torch.nn.functional.softplus(f[..., 2:]) + 1e-6
    torch.testing.assert_close(lik.noise_variance(f, {}), variance)
    loc, scale = (LOC + SCALE * f[..., :2]).numpy(), (SCALE * variance.sqrt()).numpy()
    np.testing.assert_allclose(lik.log_prob(f, y, {}, target_loc=LOC, target_scale=SCALE).numpy(),
                               st.norm.logpdf(y.numpy()[None], loc, scale).sum(-1), rtol=1e-10)
    floor = lik.noise_variance(torch.tensor([[[0.0, -200.0]]], dtype=torch.float64), {})
    assert float(floor) == pytest.approx(1e-6, rel=1e-9)  # the minimum variance: no clamp from below
    cap = lik.noise_variance(torch.tensor([[[0.0, 1e4]]], dtype=torch.float64), {})
    assert float(cap) == pytest.approx(100.0)
    assert lik.options() == {"beta": 0.5, "variance": "softplus"} and HeteroscedasticGaussianLikelihood().options() == {
        "beta": 0.5}
    assert make_likelihood("heteroscedastic", **lik.options()).variance == "softplus"
    with pytest.raises(ValueError, match="variance must be one of log, softplus"):
        HeteroscedasticGaussianLikelihood(variance="exp")


# ---------------------------------------------------------------- registry, options, β-NLL
def test_registry_names_and_bad_input_list_the_valid_choices():
    assert set(LIKELIHOODS) == {"gaussian", "heteroscedastic", "studentt", "categorical"}
    assert [make_likelihood(n).heads for n in LIKELIHOODS] == [1, 2, 1, 1]
    with pytest.raises(ValueError, match="valid likelihoods: gaussian, heteroscedastic, studentt, categorical"):
        make_likelihood("laplace")
    with pytest.raises(ValueError, match="no option 'nu'; its options are: scale, learn_scale, dof"):
        make_likelihood("studentt", nu=3)
    with pytest.raises(ValueError, match="beta must be a number in"):
        make_likelihood("heteroscedastic", beta=2.0)
    with pytest.raises(ValueError, match="studentt option dof must be positive and finite"):
        make_likelihood("studentt", dof=-1.0)


def test_beta_nll_reweights_the_training_objective_only():
    f, y_std, _ = _inputs(heads=2)
    f = f.clone().requires_grad_(True)
    plain, weighted = HeteroscedasticGaussianLikelihood(beta=0.0), HeteroscedasticGaussianLikelihood(beta=0.7)
    torch.testing.assert_close(plain.training_log_prob(f, y_std, {}), plain.log_prob(f, y_std, {}))
    torch.testing.assert_close(weighted.log_prob(f, y_std, {}), plain.log_prob(f, y_std, {}))
    var = f[..., 2:].detach().exp()
    elementwise = torch.distributions.Normal(f[..., :2], (0.5 * f[..., 2:]).exp()).log_prob(y_std)
    weight = var**0.7 / (var**0.7).mean(dim=(-2, -1), keepdim=True)  # σ^(2β), mean 1 per draw
    torch.testing.assert_close(weighted.training_log_prob(f, y_std, {}), (weight * elementwise).sum(-1))
    (grad,) = torch.autograd.grad(weighted.training_log_prob(f, y_std, {}).sum(), f)
    # the weight is a stop-gradient: the mean gradient is w (y − μ)/σ²
    torch.testing.assert_close(grad[..., :2], weight * (y_std - f[..., :2].detach()) / var)
    # a common σ gives the plain NLL whatever it is: β-NLL does not temper the likelihood against a KL
    same = torch.cat([f[..., :2].detach(), torch.full_like(f[..., 2:], -3.0)], -1)
    torch.testing.assert_close(weighted.training_log_prob(same, y_std, {}), plain.log_prob(same, y_std, {}))


# ---------------------------------------------------------------- model wiring
def test_network_has_heads_times_targets_outputs_and_mean_head_selector():
    x = torch.randn(4, 3)
    net = MLP(3, 4, hidden=(5,))  # 2 targets × (mean, log-variance)
    bnn = BayesianNetwork(net, MeanHead("all"), likelihood=HeteroscedasticGaussianLikelihood(), example_input=x)
    assert (bnn.output_dim, bnn.target_dim, tuple(bnn.target_scale.shape)) == (4, 2, (2,))
    shapes = {s.name: s.shape for s in bnn.sites}
    assert shapes["fc1.weight"] == (5, 3) and shapes["out.weight"] == (10,) and shapes["out.bias"] == (2,)
    values = {k: v.unsqueeze(0) for k, v in bnn.initial_values().items()}
    values["out.weight"] = values["out.weight"] + 1.0  # moving the random entries leaves the variance rows fixed
    out = bnn.forward_draws(values, x)[0]
    base = bnn.forward_draws({k: v.unsqueeze(0) for k, v in bnn.initial_values().items()}, x)[0]
    assert torch.equal(out[:, 2:], base[:, 2:]) and not torch.allclose(out[:, :2], base[:, :2])
    last = {s.name for s in MeanHead("last").select(net, x)}
    assert last == {"out.weight", "out.bias"}
    with pytest.raises(ValueError, match="needs 2 network outputs per target"):
        BayesianNetwork(MLP(3, 3, hidden=(5,)), likelihood=HeteroscedasticGaussianLikelihood(), example_input=x)


# ---------------------------------------------------------------- predictions, coverage, save / load
def _random_posterior(name, num_draws=40, repeats=100, seed=0):
    """A SamplePosterior of ``num_draws`` random parameter sets (each repeated ``repeats`` times, so the
    observation draws sample the predictive mixture densely) of a tiny net with the likelihood."""
    from inference.posterior import SamplePosterior

    g = torch.Generator().manual_seed(seed)
    lik = {"gaussian": GaussianLikelihood(learn_noise=True), "heteroscedastic": HeteroscedasticGaussianLikelihood(),
           "studentt": StudentTLikelihood(learn_scale=True, learn_dof=True)}[name]
    x = torch.linspace(-1, 1, 30).unsqueeze(1)
    bnn = BayesianNetwork(MLP(1, lik.heads, hidden=(3,)), "all", likelihood=lik, example_input=x,
                          target_loc=torch.tensor([2.0]), target_scale=torch.tensor([0.5]))
    draws = {k: (v + 0.3 * torch.randn(num_draws, *v.shape, generator=g)) for k, v in bnn.initial_values().items()}
    latent = {"noise_precision": lambda: 2.0 + 3 * torch.rand(num_draws, 1, generator=g),
              "dof": lambda: 2.5 + 4 * torch.rand(num_draws, 1, generator=g)}
    draws.update({k: latent[k]() for k in bnn.latent_priors()})
    draws = {k: v.repeat_interleave(repeats, 0).unsqueeze(0) for k, v in draws.items()}
    y = 2.0 + 0.5 * (torch.sin(3 * x) + 0.4 * torch.randn(30, 1, generator=g))
    return SamplePosterior(bnn, draws), x, y


@pytest.mark.parametrize("name", ["gaussian", "heteroscedastic", "studentt"])
def test_mixture_pit_and_its_coverage_match_sampling(name):
    """The predictive mixture CDF at the targets equals the fraction of sampled observations below
    them, and coverage from the PIT equals coverage of the sampled central interval (MC error)."""
    from inference.evaluation.metrics import coverage_from_pit

    posterior, x, y = _random_posterior(name)
    prediction = posterior.predict(x, y=y, seed=0)
    sampled = (prediction.y <= y).double().mean(0)
    m = prediction.y.shape[0]
    tolerance = 4 * torch.sqrt(prediction.pit * (1 - prediction.pit) / m) + 1e-3
    assert bool(((sampled - prediction.pit).abs() <= tolerance).all())
    for level in (0.5, 0.9):
        lo, hi = prediction.interval(level)
        by_sampling = float(((y >= lo) & (y <= hi)).double().mean())
        assert coverage_from_pit(prediction.pit, level) == pytest.approx(by_sampling, abs=2 / 30 + 1e-9)


@pytest.mark.parametrize("name", ["heteroscedastic", "studentt"])
def test_predictions_save_load_and_arviz_round_trip(name, tmp_path):
    import arviz as az

    from inference import load_posterior

    posterior, x, y = _random_posterior(name, num_draws=5, repeats=1)
    loaded = load_posterior(posterior.save(tmp_path / "posterior"))
    assert type(loaded.bnn.likelihood) is type(posterior.bnn.likelihood)
    assert loaded.bnn.likelihood.options() == posterior.bnn.likelihood.options()
    a, b = posterior.predict(x, y=y, seed=3), loaded.predict(x, y=y, seed=3)
    torch.testing.assert_close(a.log_lik, b.log_lik)
    torch.testing.assert_close(a.noise_var, b.noise_var)
    assert a.noise_var.shape[1] == (30 if name == "heteroscedastic" else 1)  # the variance depends on x or not
    idata = posterior.to_arviz(x, y, seed=0)
    assert idata.log_likelihood["obs"].shape == (1, 5, 30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 5 random draws: Pareto-k warnings are expected
        loo = az.loo(idata)
    # ArviZ's in-sample lppd (elpd_loo + p_loo) is the sum of our log predictive densities at the same draws
    assert float(loo.elpd_loo + loo.p_loo) == pytest.approx(float(a.log_predictive_density().sum()), rel=1e-4)


def test_observe_scores_the_training_objective():
    """Inside the Pyro model an observed target scores ``training_log_prob`` (β-NLL), not the density."""
    import pyro

    x, y = torch.randn(6, 1), torch.randn(6, 1)
    bnn = BayesianNetwork(MLP(1, 2, hidden=(3,)), "last", likelihood=HeteroscedasticGaussianLikelihood(beta=1.0),
                          example_input=x)
    trace = pyro.poutine.trace(bnn.model).get_trace(x, y)
    site = trace.nodes["obs"]
    f = bnn.forward_single({s.name: trace.nodes[s.name]["value"] for s in bnn.sites}, x).unsqueeze(0)
    expected = bnn.likelihood.training_log_prob(f, y, {})[0]
    torch.testing.assert_close(site["fn"].log_prob(site["value"]), expected)
    assert not torch.allclose(expected, bnn.likelihood.log_prob(f, y, {})[0])


# ---------------------------------------------------------------- recovery
def test_heteroscedastic_map_recovers_a_noise_sd_that_grows_with_x():
    """y = sin(2x) + σ(x) ε with σ(x) = 0.1 + 0.2 (x + 1): the fitted σ follows it within 15 % on a grid."""
    from inference.fitting import fit

    g = torch.Generator().manual_seed(0)
    x = torch.rand(2000, 1, generator=g) * 2 - 1

    def true_sd(x):
        return 0.1 + 0.2 * (x + 1)

    y = torch.sin(2 * x) + true_sd(x) * torch.randn(2000, 1, generator=g)
    torch.manual_seed(0)
    bnn = BayesianNetwork(MLP(1, 2, hidden=(32,)), "all", likelihood=HeteroscedasticGaussianLikelihood(beta=0.0),
                          example_input=x)
    posterior = fit(bnn, x, y, backend="map", seed=0, progress=False, epochs=600, batch_size=None, lr=0.03,
                    early_stopping=False)  # the likelihood under test, trained for the epochs given
    grid = torch.linspace(-0.9, 0.9, 10).unsqueeze(1)
    fitted = posterior.predict(grid).noise_var.mean(0).sqrt()
    assert float((fitted / true_sd(grid) - 1).abs().max()) < 0.15
    assert float(fitted[-1] / fitted[0]) > 2.5  # truly heteroscedastic: 0.48 / 0.12 = 4


def test_studentt_map_recovers_dof_and_scale_within_their_standard_errors():
    """A constant-mean model on 4000 draws of 0.5 + 0.7 t_4: ν̂ and ŝ lie within 3 standard errors (inverse
    observed information) of the truth and agree with scipy's maximum-likelihood fit."""
    from inference.fitting import fit

    nu, scale, n = 4.0, 0.7, 4000
    y = torch.tensor(0.5 + scale * st.t.rvs(nu, size=(n, 1), random_state=np.random.default_rng(0)),
                     dtype=torch.float32)
    torch.manual_seed(0)
    bnn = BayesianNetwork(torch.nn.Linear(1, 1), "all", output_dim=1,
                          likelihood=StudentTLikelihood(learn_scale=True, learn_dof=True))
    posterior = fit(bnn, torch.zeros(n, 1), y, backend="map", seed=0, progress=False, epochs=1000,
                    batch_size=None, lr=0.1)
    nu_hat = float(posterior.draws["dof"].flatten()[0])
    s_hat = float(posterior.draws["noise_precision"].flatten()[0] ** -0.5)
    loc_hat = float(posterior.draws["bias"].flatten()[0])
    theta = torch.tensor([nu_hat, s_hat], dtype=torch.float64)
    y64 = y.double().flatten()
    info = -hessian(lambda t: torch.distributions.StudentT(t[0], loc_hat, t[1]).log_prob(y64).sum())(theta)
    se = torch.linalg.inv(info).diagonal().sqrt()
    assert abs(nu_hat - nu) < 3 * float(se[0]) and abs(s_hat - scale) < 3 * float(se[1]), (nu_hat, s_hat, se)
    mle_nu, _, mle_scale = st.t.fit(y.numpy().ravel())
    assert abs(nu_hat - mle_nu) < 0.3 * float(se[0]) and abs(s_hat - mle_scale) < 0.3 * float(se[1])


# ---------------------------------------------------------------- lab wiring: RunSpec and the CLI
@pytest.mark.parametrize("argv, message", [
    (["--data", "moons", "--likelihood", "studentt"], "likelihood 'studentt' is for regression but the data are "
                                                      "classification; valid likelihoods for these data: categorical"),
    (["--data", "toy1d", "--beta", "0.5"], "--beta applies to --likelihood heteroscedastic only"),
    (["--data", "toy1d", "--variance-link", "softplus"], "--variance-link applies to --likelihood heteroscedastic only"),
    (["--data", "toy1d", "--likelihood", "studentt", "--dof", "-2"], "dof must be positive"),
    (["--data", "toy1d", "--likelihood", "heteroscedastic", "--beta", "3"], "beta must be a number in [0, 1]"),
    (["--data", "toy1d", "--likelihood", "heteroscedastic", "--noise", "0.1"], "--noise does not apply"),
    (["--data", "toy1d", "--stochastic", "mean-head"], "needs a likelihood with a variance head"),
])
def test_cli_rejects_bad_likelihood_choices_with_exit_2(tmp_path, argv, message, capsys, monkeypatch):
    import lab.runs.execution
    from lab.cli import main

    monkeypatch.setattr(lab.runs.execution, "fit", lambda *a, **k: pytest.fail("fitted despite a bad likelihood"))
    code = main(["fit", *argv, "--quiet", "--epochs", "1", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error:") and message in err, err
    assert not (tmp_path / "x").exists()


def test_run_spec_builds_heads_times_targets_outputs_and_a_deterministic_variance_head():
    from lab.runs.model import build_model
    from lab.runs.spec import RunSpec
    from zoo.data import load_dataset

    data = load_dataset("toy1d", split=0, seed=0)
    spec = RunSpec(data="toy1d", hidden=[4], likelihood="heteroscedastic", stochastic="last-mean-head",
                   likelihood_options={"beta": 0.25})
    bnn = build_model(spec, data)
    assert (bnn.output_dim, bnn.target_dim, bnn.likelihood.beta) == (2, 1, 0.25)
    from lab.cli import build_parser, spec_from_args
    args = build_parser().parse_args(["fit", "--data", "toy1d", "--likelihood", "heteroscedastic", "--variance-link",
                                      "softplus", "--beta", "0", "--out", "x"])
    assert spec_from_args(args).likelihood_options == {"beta": 0.0, "variance": "softplus"}
    assert {s.name: tuple(s.shape) for s in bnn.sites} == {"out.weight": (4,), "out.bias": (1,)}
    student = build_model(RunSpec(data="toy1d", hidden=[4], likelihood="studentt", noise=0.3), data)
    assert student.likelihood.options()["scale"] == 0.3 and set(student.latent_priors()) == {"dof"}


# ---------------------------------------------------------------- the predictive mixture: exact central intervals
def _mixture_case(name, draws):
    """``(likelihood, f, latents, scipy frozen components [S, N, T])`` in original units (float64)."""
    f, _, _ = _inputs(heads=2 if name == "heteroscedastic" else 1, draws=draws)
    if name == "gaussian":
        latents = {"noise_precision": torch.tensor([[4.0, 0.25]], dtype=torch.float64).expand(draws, 2)}
        lik = GaussianLikelihood(learn_noise=True)
        sd = latents["noise_precision"].rsqrt().unsqueeze(1)
        return lik, f, latents, st.norm((LOC + SCALE * f).numpy(), (SCALE * sd).numpy())
    if name == "heteroscedastic":
        mean, log_var = f[..., :2], f[..., 2:]
        return (HeteroscedasticGaussianLikelihood(), f, {},
                st.norm((LOC + SCALE * mean).numpy(), (SCALE * (0.5 * log_var).exp()).numpy()))
    g = torch.Generator().manual_seed(draws)
    latents = {"noise_precision": 0.5 + 4 * torch.rand(draws, 2, generator=g, dtype=torch.float64),
               "dof": 0.3 + 8 * torch.rand(draws, 2, generator=g, dtype=torch.float64)}  # ν < 1: very heavy tails
    s, nu = latents["noise_precision"].rsqrt().unsqueeze(1), latents["dof"].unsqueeze(1)
    return (StudentTLikelihood(learn_scale=True, learn_dof=True), f, latents,
            st.t(nu.numpy(), (LOC + SCALE * f).numpy(), (SCALE * s).numpy()))


@pytest.mark.parametrize("name", ["gaussian", "heteroscedastic", "studentt"])
def test_predictive_mixture_quantiles_solve_the_scipy_mixture_cdf(name):
    """Quantiles of (1/S) Σ_s p(y | draw s): scipy's mixture CDF at them is the probability (1e-6), the mixture
    CDF is the likelihood's PIT, and one draw gives scipy's own quantile (norm.ppf / t.ppf)."""
    from zoo.likelihoods import PredictiveMixture

    for draws in (1, 5):
        lik, f, latents, components = _mixture_case(name, draws)
        mixture = PredictiveMixture(**lik.mixture_params(f, latents)).to_original_units(LOC, SCALE)
        _, _, y = _inputs()
        torch.testing.assert_close(mixture.cdf(y), lik.cdf(f, y, latents, target_loc=LOC, target_scale=SCALE),
                                   rtol=0, atol=1e-12)
        for prob in (0.025, 0.05, 0.25, 0.5, 0.95, 0.975):
            q = mixture.quantile(prob)
            assert q.dtype == torch.float64 and q.shape == (5, 2)
            np.testing.assert_allclose(components.cdf(q.numpy()[None]).mean(0), prob, rtol=0, atol=1e-6)
            if draws == 1:
                np.testing.assert_allclose(q.numpy(), components.ppf(prob)[0], rtol=1e-7)
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
        mixture.interval(1.0)


@pytest.mark.parametrize("name", ["gaussian", "heteroscedastic", "studentt"])
def test_prediction_interval_is_the_central_interval_whose_coverage_the_pit_measures(name):
    """A target lies in the ``level`` interval iff its PIT value lies in [(1 − level)/2, (1 + level)/2]
    (exactly, up to ties at the boundary), and the endpoints have mixture CDF (1 ∓ level)/2."""
    from inference.evaluation.metrics import coverage_from_pit

    posterior, x, y = _random_posterior(name, num_draws=5, repeats=1)
    prediction = posterior.predict(x, y=y, seed=0)
    assert prediction.mixture.num_components == 5
    for level in (0.5, 0.9):
        lo, hi = prediction.interval(level)
        bounds = ((1 - level) / 2, (1 + level) / 2)
        for end, prob in zip((lo, hi), bounds):
            assert float((prediction.mixture.cdf(end) - prob).abs().max()) < 1e-6
        ties = torch.stack([(prediction.pit - b).abs() < 1e-5 for b in bounds]).any(0)
        inside = (y >= lo) & (y <= hi)
        by_pit = (prediction.pit >= bounds[0]) & (prediction.pit <= bounds[1])
        assert not bool(ties.any()) and torch.equal(inside, by_pit)
        assert float(inside.float().mean()) == coverage_from_pit(prediction.pit, level)
        # the 5 observation draws alone give a far narrower band than the predictive mixture
        sampled = torch.quantile(prediction.y, torch.tensor(bounds), dim=0)
        assert float((sampled[1] - sampled[0]).mean()) < float((hi - lo).mean())
