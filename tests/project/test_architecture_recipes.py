"""The recipes of docs/architecture.md, run: a new backend registers, fits, saves, loads and exports.

The toy backend is the smallest posterior family there is — independent draws from the prior — built the
way the recipe says: a ``Config`` dataclass (its options, checked by :func:`inference.backends.parse_config`)
and a ``run`` that assembles parts (here one: the prior's ``sample``), returning a posterior of an
existing kind so that save/load and ArviZ export come for free.
"""
from __future__ import annotations

import dataclasses

import pyro
import pytest
import torch

from inference import BACKENDS, fit, load_posterior, register_backend
from inference.backends.base import Backend
from inference.posterior import SamplePosterior
from zoo import BayesianNetwork
from zoo.architectures import MLP


@dataclasses.dataclass
class PriorDrawsConfig:
    num_samples: int = 64

    def validate(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")


class PriorDrawsBackend(Backend):
    """``num_samples`` independent draws of every random site from its prior (one chain)."""

    name = "prior-draws"
    Config = PriorDrawsConfig

    def run(self, bnn, x, y, config, seed, progress):
        pyro.set_rng_seed(seed)  # fit() restores the caller's random state afterwards
        draws = {site: prior.sample((1, config.num_samples))  # [chains, draws, *site_shape]
                 for site, prior in bnn.prior_distributions().items()}
        return SamplePosterior(bnn, draws, info={"backend": self.name})


@pytest.fixture
def toy_backend():
    register_backend(PriorDrawsBackend())
    try:
        yield BACKENDS["prior-draws"]
    finally:
        del BACKENDS["prior-draws"]


def _problem():
    x = torch.linspace(-2, 2, 30).unsqueeze(1)
    y = torch.sin(x) + 0.1 * torch.randn(30, 1, generator=torch.Generator().manual_seed(0))
    bnn = BayesianNetwork(MLP(1, 1, hidden=(8,)), "last", example_input=x, target_loc=y.mean(0),
                          target_scale=y.std(0))
    return bnn, x, y


def test_a_new_backend_registers_fits_saves_loads_and_exports(toy_backend, tmp_path):
    bnn, x, y = _problem()
    posterior = fit(bnn, x, (y - bnn.target_loc) / bnn.target_scale, backend="prior-draws", seed=3,
                    progress=False, num_samples=40)
    draws = posterior.sample_params(seed=0)
    assert all(v.shape[0] == 40 for v in draws.values())
    # the prior's spread, not a fitted one: the last layer's weights have the prior's sd (N(0, 1) by default)
    weight = next(v for k, v in draws.items() if k.endswith("weight"))
    assert 0.6 < float(weight.std()) < 1.5
    prediction = posterior.predict(x, y=y, seed=0)
    posterior.save(tmp_path / "toy")
    reloaded = load_posterior(tmp_path / "toy").predict(x, y=y, seed=0)
    assert torch.equal(prediction.f, reloaded.f)
    idata = posterior.to_arviz(x, y, seed=0)
    assert idata.log_likelihood["obs"].shape[:2] == (1, 40)
    same_seed = fit(bnn, x, (y - bnn.target_loc) / bnn.target_scale, backend="prior-draws", seed=3,
                    progress=False, num_samples=40)
    assert all(torch.equal(same_seed.draws[k], posterior.draws[k]) for k in posterior.draws)


def test_a_new_backends_options_are_checked_by_the_one_contract(toy_backend):
    bnn, x, y = _problem()
    with pytest.raises(ValueError, match="unknown option.*num_sample.*valid options: num_samples"):
        fit(bnn, x, y, backend="prior-draws", num_sample=5)
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        fit(bnn, x, y, backend="prior-draws", num_samples=0)
    with pytest.raises(ValueError, match="prior-draws"):  # a DataLoader needs LoopOptions or accepts_loader
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=10)
        fit(bnn, loader, backend="prior-draws")


def test_unknown_backends_list_the_registered_ones(toy_backend):
    bnn, x, y = _problem()
    with pytest.raises(ValueError, match="valid backends: .*prior-draws"):
        fit(bnn, x, y, backend="prior-draw")
