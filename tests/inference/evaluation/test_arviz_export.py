"""The ArviZ export: what a run's prediction leaves in the InferenceData survives NetCDF exactly."""
import numpy as np
import pytest
import torch
from torch import nn

from inference import SamplePosterior, load_netcdf, save_netcdf
from inference.evaluation.arviz_export import loo_subset, to_inference_data
from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood


def _regression_posterior():
    torch.manual_seed(0)
    bnn = BayesianNetwork(nn.Linear(1, 1), "all", likelihood=GaussianLikelihood(0.5), output_dim=1,
                          target_loc=torch.tensor([1.0]), target_scale=torch.tensor([2.0]))
    draws = {"weight": 1 + 0.1 * torch.randn(2, 40, 1, 1), "bias": 0.1 * torch.randn(2, 40, 1)}
    return SamplePosterior(bnn, draws, {"energy": torch.randn(2, 40)}, info={"backend": "nuts"})


def test_prediction_summaries_round_trip_through_netcdf(tmp_path):
    post = _regression_posterior()
    x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    y = 1 + 2 * (x + 0.5 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1)))
    pred = post.predict(x, y=y, seed=5)
    save_netcdf(post.to_arviz(x, y, seed=5, prediction=pred), tmp_path / "p.nc")
    idata = load_netcdf(tmp_path / "p.nc")
    stored = idata.predictions
    assert stored.attrs["num_samples"] == 80 and stored.attrs["seed"] == 5
    for name, value in pred.summaries().items():
        np.testing.assert_array_equal(stored[name].values, value.numpy(), err_msg=name)
    np.testing.assert_array_equal(stored["pit"].values, pred.pit.numpy())
    lo, hi = pred.interval(0.9)
    np.testing.assert_array_equal(stored["lower_90"].values, lo.numpy())
    np.testing.assert_array_equal(stored["upper_90"].values, hi.numpy())
    np.testing.assert_array_equal(idata.constant_data["x"].values, x[:, 0].numpy())
    # a SamplePosterior's export uses all its draws in order: the same log-likelihoods as the prediction
    np.testing.assert_allclose(idata.log_likelihood["obs"].values.reshape(80, -1), pred.log_lik.numpy(), rtol=1e-6)


def test_classification_export_stores_mean_class_probabilities_and_no_inputs_beyond_1d():
    torch.manual_seed(0)
    bnn = BayesianNetwork(nn.Linear(2, 3), "all", likelihood=CategoricalLikelihood(), output_dim=3)
    post = SamplePosterior(bnn, {"weight": torch.randn(1, 20, 3, 2), "bias": torch.randn(1, 20, 3)})
    x, y = torch.randn(12, 2), torch.randint(0, 3, (12,))
    pred = post.predict(x, y=y, seed=0)
    idata = post.to_arviz(x, y, seed=0, prediction=pred)
    assert idata.predictions["probs"].dims == ("obs_id", "class")
    np.testing.assert_array_equal(idata.predictions["probs"].values, pred.mean.numpy())
    assert "constant_data" not in idata.groups()  # 2-D inputs are not stored
    assert "predictions" not in post.to_arviz(x, y, seed=0).groups()


def test_a_prediction_at_other_points_is_refused():
    post = _regression_posterior()
    x = torch.randn(10, 1)
    with pytest.raises(ValueError, match="prediction has 9 points but x has 10 rows"):
        post.to_arviz(x, torch.randn(10, 1), prediction=post.predict(x[:9]))


def test_to_inference_data_checks_shapes():
    with pytest.raises(ValueError, match=r"log_likelihood must be \[chain, draw, 4\]"):
        to_inference_data(task="regression", log_likelihood=torch.zeros(1, 5, 3), log_joint=torch.zeros(1, 5),
                          observed=torch.zeros(4, 1), observation_draws=torch.zeros(1, 5, 4, 1),
                          f_points=torch.zeros(1, 5, 2, 1), point_index=[0, 3])
    with pytest.raises(ValueError, match="task must be"):
        to_inference_data(task="ranking", log_likelihood=torch.zeros(1, 5, 4), log_joint=torch.zeros(1, 5),
                          observed=torch.zeros(4, 1), observation_draws=torch.zeros(1, 5, 4, 1),
                          f_points=torch.zeros(1, 5, 2, 1), point_index=[0, 3])


def test_loo_subset_is_all_points_or_a_seeded_sorted_subset():
    assert torch.equal(loo_subset(7, seed=3), torch.arange(7))
    a, b, c = loo_subset(5000, seed=1), loo_subset(5000, seed=1), loo_subset(5000, seed=2)
    assert a.shape == (2000,) and torch.equal(a, b) and not torch.equal(a, c)
    assert torch.all(a[1:] > a[:-1]) and int(a.max()) < 5000
    assert torch.equal(loo_subset(50, seed=0, max_points=10), torch.randperm(50, generator=torch.Generator().manual_seed(0))[:10].sort().values)
    with pytest.raises(ValueError, match="n_train >= 1"):
        loo_subset(0, seed=0)


def test_a_point_mass_export_gives_az_loo_the_plug_in_score_flagged_unreliable(tmp_path):
    import arviz as az

    torch.manual_seed(0)
    bnn = BayesianNetwork(nn.Linear(1, 1), "all", likelihood=GaussianLikelihood(0.5), output_dim=1)
    post = SamplePosterior(bnn, {"weight": torch.ones(1, 1, 1, 1), "bias": torch.zeros(1, 1, 1)},
                           info={"backend": "map"})
    x = torch.linspace(-2, 2, 25).unsqueeze(-1)
    y = x + 0.5 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    save_netcdf(post.to_arviz(x, y, seed=0), tmp_path / "map.nc")
    idata = load_netcdf(tmp_path / "map.nc")
    assert idata.posterior.sizes["draw"] == 1 and idata.log_likelihood.attrs["point_mass"] == 1
    plug_in = float(torch.distributions.Normal(x, 0.5).log_prob(y).sum())  # Σ log p(y_n | ŵ)
    with pytest.warns(UserWarning, match="Pareto"):
        result = az.loo(idata)
    assert result.elpd_loo == pytest.approx(plug_in, rel=1e-5) and result.p_loo == pytest.approx(0.0, abs=1e-6)
    assert np.isinf(result.pareto_k.values).all()  # importance sampling from one point cannot be checked
    assert az.waic(idata).elpd_waic == pytest.approx(plug_in, rel=1e-5)
    # posteriors with more draws are written as they are
    many = _regression_posterior().to_arviz(x, y)
    assert many.log_likelihood.sizes["draw"] == 40 and many.log_likelihood.attrs["point_mass"] == 0


def test_log_likelihood_is_exported_in_float64_so_psis_stays_finite():
    """Heavy-tailed float32 importance ratios make ArviZ's PSIS return NaN (seen on a heteroscedastic
    SVI fit of energy); the export stores the pointwise log-likelihood in float64, where it is finite."""
    import arviz as az
    n, draws = 30, 200
    rng = np.random.default_rng(0)
    log_lik = -0.3 - np.exp(2 * rng.standard_normal((1, draws, n)))
    float32 = az.from_dict(posterior={"x": np.zeros((1, draws))}, log_likelihood={"obs": log_lik.astype(np.float32)})
    assert np.isnan(az.loo(float32).elpd_loo)  # the failure this guards against
    idata = to_inference_data(task="regression", log_likelihood=torch.tensor(log_lik, dtype=torch.float32),
                              log_joint=torch.zeros(1, draws), observed=torch.zeros(n, 1),
                              observation_draws=torch.zeros(1, draws, n, 1), f_points=torch.zeros(1, draws, 2, 1),
                              point_index=[0, 3])
    assert idata.log_likelihood["obs"].dtype == np.float64
    assert np.isfinite(az.loo(idata).elpd_loo)
