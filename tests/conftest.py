"""Shared fixtures: seeding, a clean Pyro state, slow-test marking and known posteriors.

``conjugate_regression`` is the known-posterior fixture every backend is tested against:
Bayesian linear regression y = X w + b + ε with a Normal(0, σ_p²) prior on (w, b) and
known noise σ, whose posterior is Gaussian in closed form:

    Σ = (Φᵀ Φ / σ² + I / σ_p²)⁻¹,   μ = Σ Φᵀ y / σ²,   Φ = [X, 1].
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass

import pyro
import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
# runs are scored against any reference posterior built in $BNN_ZOO_REFERENCES (lab.references.fidelity): tests see an empty one
os.environ["BNN_ZOO_REFERENCES"] = tempfile.mkdtemp(prefix="bnn-zoo-references-")
atexit.register(shutil.rmtree, os.environ["BNN_ZOO_REFERENCES"], ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("ZOO_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or ZOO_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_and_clean_pyro():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.set_num_threads(1)  # small models are overhead-bound; threads only add contention
    yield
    pyro.clear_param_store()


@dataclass
class ConjugateRegression:
    """Data and closed-form posterior of Bayesian linear regression (standardised units)."""

    x: torch.Tensor  # [N, D]
    y: torch.Tensor  # [N, 1]
    noise_sd: float
    prior_sd: float
    post_mean: torch.Tensor  # [D + 1]: weights then bias
    post_cov: torch.Tensor  # [D + 1, D + 1]

    @property
    def post_sd(self) -> torch.Tensor:
        return self.post_cov.diagonal().sqrt()

    def net(self) -> torch.nn.Module:
        torch.manual_seed(1)
        return torch.nn.Linear(self.x.shape[1], 1)


def make_conjugate_regression(n=40, d=2, noise_sd=0.5, prior_sd=1.0, seed=0) -> ConjugateRegression:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.tensor([1.0, -0.5][:d] + [0.3] * max(0, d - 2))
    y = (x @ w + 0.2 + noise_sd * torch.randn(n, generator=g)).unsqueeze(-1)
    phi = torch.cat([x, torch.ones(n, 1)], dim=1).double()
    precision = phi.T @ phi / noise_sd**2 + torch.eye(d + 1, dtype=torch.float64) / prior_sd**2
    cov = torch.linalg.inv(precision)
    mean = cov @ phi.T @ y.double().squeeze(-1) / noise_sd**2
    return ConjugateRegression(x, y, noise_sd, prior_sd, mean.float(), cov.float())


@pytest.fixture
def conjugate_regression() -> ConjugateRegression:
    return make_conjugate_regression()


def flat_linear_draws(draws: dict) -> torch.Tensor:
    """``[S, D + 1]`` (weights then bias) from draws of an ``nn.Linear(D, 1)``'s sites."""
    w = draws["weight"].reshape(-1, draws["weight"].shape[-1])
    b = draws["bias"].reshape(-1, 1)
    return torch.cat([w, b], dim=1)
