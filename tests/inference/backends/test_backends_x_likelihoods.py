"""Every registered backend × the heteroscedastic and Student-t likelihoods on a tiny data set:
finite metrics, an ArviZ export with a pointwise log-likelihood, and the likelihood's latents.

HMC and NUTS are marked slow; the default part runs every other backend
(about a second each)."""
from __future__ import annotations

import math

import pytest
import torch

from inference.backends import BACKENDS

from inference.fitting import fit
from inference.evaluation.metrics import evaluate
from zoo import BayesianNetwork
from zoo.architectures import MLP
from zoo.likelihoods import make_likelihood

#: the smallest settings that run each backend end to end
TINY = {
    "svi": dict(epochs=5, batch_size=8), "svi-lrt": dict(epochs=5, batch_size=8),
    "graves": dict(epochs=5, batch_size=8), "sparse-vd": dict(epochs=5, batch_size=8, kl_anneal_epochs=2),
    "kingma-vd": dict(epochs=5, batch_size=8, kl_anneal_epochs=2), "radial": dict(epochs=5, batch_size=8),
    "map": dict(epochs=5, batch_size=8), "mc-dropout": dict(epochs=5, batch_size=8, num_samples=6),
    "laplace": dict(map_steps=20, num_samples=6),
    "swag": dict(epochs=4, burnin_epochs=2, batch_size=8, num_samples=6, max_rank=2),
    "multiswag": dict(epochs=4, burnin_epochs=2, batch_size=8, num_samples=3, max_rank=2, num_members=2),
    "ensemble": dict(epochs=5, batch_size=8, num_members=2),
    "deep-ensemble": dict(epochs=5, batch_size=8, num_members=2),
    "hmc": dict(num_chains=1, warmup_steps=6, num_samples=6, map_steps=20, num_steps=4, compile=False),
    "nuts": dict(num_chains=1, warmup_steps=6, num_samples=6, map_steps=20, max_tree_depth=3, compile=False),
    **{name: dict(num_chains=1, num_samples=6, thin=1, warmup_steps=6, map_steps=20, batch_size=8)
       for name in ("sgld", "psgld", "sghmc")},
    "csgmcmc": dict(num_chains=1, num_samples=6, thin=1, map_steps=20, batch_size=8, num_cycles=2),
}
SLOW = {"hmc", "nuts"}
LIKELIHOODS = {"heteroscedastic": {"beta": 0.5}, "studentt": {"learn_scale": True, "learn_dof": True}}


def _cases():
    for backend in BACKENDS:
        for name in LIKELIHOODS:
            marks = [pytest.mark.slow] if backend in SLOW else []
            yield pytest.param(backend, name, marks=marks, id=f"{backend}-{name}")


def test_every_backend_has_tiny_settings():
    assert set(BACKENDS) <= set(TINY), f"add tiny settings for {sorted(set(BACKENDS) - set(TINY))}"


def tiny_problem(backend: str, likelihood_name: str, **likelihood_options):
    """``(bnn, x, y, y_std)``: a 1-4-1 MLP on 24 points of a sine (dropout for ``mc-dropout``), targets
    standardised by the model's affine map."""
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 24).unsqueeze(1)
    y = 3.0 + 2.0 * torch.sin(3 * x) + 0.3 * torch.randn(24, 1)
    likelihood = make_likelihood(likelihood_name, **likelihood_options)
    net = MLP(1, likelihood.heads, hidden=(4,), dropout=0.1 if backend == "mc-dropout" else 0.0)
    bnn = BayesianNetwork(net, "all", likelihood=likelihood, example_input=x,
                          target_loc=y.mean(0), target_scale=y.std(0))
    return bnn, x, y, (y - bnn.target_loc) / bnn.target_scale


def check_tiny_fit(posterior, x, y):
    """Finite metrics, latents and ArviZ export of a posterior of :func:`tiny_problem` at ``x``, ``y``
    (original units, on the model's device); returns ``(prediction, draws)``."""
    prediction = posterior.predict(x, y=y, seed=0)
    assert prediction.f.shape[1:] == (24, 1) and prediction.pit.shape == (24, 1)
    metrics = evaluate(prediction, y)
    assert all(math.isfinite(metrics[k]) for k in ("rmse", "test_ll", "coverage_90")), metrics
    draws = posterior.sample_params(seed=0)
    for name in posterior.bnn.latent_priors():  # e.g. the Student-t's scale and dof (finite, positive)
        assert bool((torch.isfinite(draws[name]) & (draws[name] > 0)).all()), (name, draws[name])
    idata = posterior.to_arviz(x, y, seed=0)
    log_lik = idata.log_likelihood["obs"]
    assert log_lik.sizes["obs_id"] == 24 and bool(torch.isfinite(torch.as_tensor(log_lik.values)).all())
    return prediction, draws


@pytest.mark.parametrize("backend,name", list(_cases()))
def test_backend_fits_the_likelihood(backend, name):
    bnn, x, y, y_std = tiny_problem(backend, name, **LIKELIHOODS[name])
    posterior = fit(bnn, x, y_std, backend=backend, seed=0, progress=False, **TINY[backend])
    check_tiny_fit(posterior, x, y)
