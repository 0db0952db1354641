"""Likelihood latents in the variational guides: mean-field factors and point masses (``fixed``)."""
from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

from inference import fit, load_posterior
from inference.variational import MeanFieldGuide
from inference.variational.elbo import elbo_terms
from inference.variational.latents import LatentFactors
from zoo import BayesianNetwork, GaussianLikelihood


def _noise_bnn(stochastic="all"):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    return BayesianNetwork(net, stochastic, likelihood=GaussianLikelihood(learn_noise=True),
                           example_input=torch.zeros(2, 2))


def test_a_fixed_latent_is_a_point_mass_with_the_prior_cross_entropy_as_its_kl():
    bnn = _noise_bnn()
    priors = bnn.latent_priors()
    start = torch.tensor([400.0])  # noise precision: sd 0.05
    factors = LatentFactors(priors, 1e-3, {"noise_precision": start}, fixed=["noise_precision"])
    assert list(factors.parameters()) == []  # nothing to train
    values, kl = factors.rsample_with_kl()
    torch.testing.assert_close(values["noise_precision"], start)
    torch.testing.assert_close(kl, -priors["noise_precision"].log_prob(start).sum())
    with pyro.plate("draws", 7, dim=-1):
        trace = pyro.poutine.trace(factors.pyro_sample).get_trace()
    drawn = trace.nodes["noise_precision"]["value"]
    assert drawn.shape == (7, 1)
    torch.testing.assert_close(drawn, start.expand(7, 1))
    learned = LatentFactors(priors, 1e-3, {"noise_precision": start})
    assert len(list(learned.parameters())) == 2


def test_an_unknown_fixed_latent_is_refused():
    with pytest.raises(ValueError, match=r"fixed latents \['noise_sd'\] are not latent sites.*noise_precision"):
        LatentFactors(_noise_bnn().latent_priors(), 1e-3, fixed=["noise_sd"])


def test_the_trace_and_fused_paths_agree_on_a_fixed_latents_kl():
    """The Pyro-trace ELBO scores the point mass's Delta (log q = 0) against the prior: −log p(z*), the same
    constant the fused path adds; the weights' KL is the family's closed form on both."""
    bnn = _noise_bnn()
    x, y = torch.randn(10, 2), torch.randn(10, 1)
    init = {**bnn.initial_values(), "noise_precision": torch.tensor([50.0])}
    guide = MeanFieldGuide(bnn, init, family="kingma-vd", init_scale=0.1, fixed_latents=["noise_precision"])
    traced = elbo_terms(bnn.model, guide, x, y, 10)
    _, fused_kl = guide.elbo_terms(bnn, x, y, 10, "weights")
    torch.testing.assert_close(traced.kl, fused_kl)


@pytest.mark.parametrize("backend", ["kingma-vd", "sparse-vd"])
def test_the_dropout_families_keep_the_pretrained_noise(backend, tmp_path):
    """Over every weight with a learned noise: the pretraining's length is chosen on held-out rows and the noise
    stays at its pretrained value (every draw the same), recorded in ``info["body"]``; saved and loaded, the
    posterior predicts identically.  ``protocol="paper"`` (no pretraining) learns the noise by the ELBO."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 2, generator=g)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(200, 1, generator=g)
    posterior = fit(_noise_bnn(), x, y, backend=backend, seed=0, progress=False, epochs=20, pretrain_epochs=100)
    assert "noise_precision (a point mass)" in posterior.info["body"] and "the body" not in posterior.info["body"]
    assert posterior.info["early_stopping"]["max_epochs"] == 100
    noise = posterior.sample_params(20, seed=3)["noise_precision"]
    assert torch.equal(noise, noise[:1].expand_as(noise))
    assert 1.0 < float(noise[0]) < 1e4  # the pretrained residual sd, between 0.01 and 1
    posterior.save(tmp_path / "p")
    again = load_posterior(tmp_path / "p")
    torch.testing.assert_close(posterior.predict(x, num_samples=5, seed=2).f, again.predict(x, num_samples=5, seed=2).f)
    paper = fit(_noise_bnn(), x, y, backend=backend, seed=0, progress=False, epochs=20, protocol="paper")
    drawn = paper.sample_params(20, seed=3)["noise_precision"]
    assert "body" not in paper.info and float(drawn.std()) > 0
