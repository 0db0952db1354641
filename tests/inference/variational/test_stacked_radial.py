"""The stacked Radial fit (inference.variational.stacked_radial, through fit_many) against one-at-a-time fits,
and the fits it refuses to stack."""
import pytest
import torch
from torch import nn

from tests.inference.conftest import K, SVI_OPTIONS, _data, _model
from inference import fit
from inference.optim.batches import minibatches
from inference.fitting import fit_many
from zoo import GaussianLikelihood
from zoo.bnn import BayesianNetwork


def test_radial_matches_one_at_a_time_fits_with_learned_noise_and_sparsity():
    """Radial (exact cross-entropy, fused path): each fit's ε, r, the noise precision's Normal noise and its
    minibatches are the one-at-a-time fit's; parameters agree to float rounding, and the per-epoch rule-based
    sparsity and the info records are the same."""
    def model(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return BayesianNetwork(net, stochastic="all", likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)

    data = [_data(k) for k in range(K)]
    fits = fit_many([model(k) for k in range(K)], [d[0] for d in data], [d[1] for d in data], backend="radial",
                    seeds=[10, 11, 12], **SVI_OPTIONS)
    for k, posterior in enumerate(fits):
        single = fit(model(k), *data[k], backend="radial", seed=10 + k, progress=False, **SVI_OPTIONS)
        stacked_params = dict(posterior.guide.named_parameters())
        assert set(stacked_params) == {name for name, _ in single.guide.named_parameters()}
        for name, value in single.guide.named_parameters():
            torch.testing.assert_close(stacked_params[name].detach(), value.detach(), atol=1e-5, rtol=1e-5)
        history, expected = posterior.info["history"], single.info["history"]
        assert history["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert history["sparsity"] == expected["sparsity"] and len(history["sparsity"]) == SVI_OPTIONS["epochs"]
        assert history["layer_sparsity"] == expected["layer_sparsity"]
        assert {key: posterior.info[key] for key in ("mc_kl_estimator", "mc_kl_samples", "elbo_path", "sparsity")} == \
            {key: single.info[key] for key in ("mc_kl_estimator", "mc_kl_samples", "elbo_path", "sparsity")}


def test_radial_with_a_monte_carlo_cross_entropy_is_not_stacked():
    data = [_data(k) for k in range(2)]
    with pytest.raises(ValueError, match="estimates the cross-entropy by Monte Carlo"):
        fit_many([_model(k) for k in range(2)], [d[0] for d in data], [d[1] for d in data], backend="radial",
                 mc_kl_samples=4, **SVI_OPTIONS)


def test_radial_with_a_non_normal_prior_is_not_stacked():
    from zoo import LaplacePrior

    def model(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return BayesianNetwork(net, stochastic="all", prior=LaplacePrior(1.0), output_dim=1)

    data = [_data(k) for k in range(2)]
    with pytest.raises(ValueError, match="has a Laplace prior; the exact Radial cross-entropy needs a Normal one"):
        fit_many([model(k) for k in range(2)], [d[0] for d in data], [d[1] for d in data], backend="radial",
                 **SVI_OPTIONS)
