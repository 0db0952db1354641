"""Known posteriors for the tests of inference/: the conjugate regression every backend is tested against.

``conjugate_regression`` is Bayesian linear regression y = X w + b + ε with a Normal(0, σ_p²) prior on (w, b) and
known noise σ, whose posterior is Gaussian in closed form:

    Σ = (Φᵀ Φ / σ² + I / σ_p²)⁻¹,   μ = Σ Φᵀ y / σ²,   Φ = [X, 1].

Test modules import ``make_conjugate_regression`` and ``flat_linear_draws`` from ``tests.inference.conftest``.

The stacked fits' tests (``tests/inference/multifit/test_stacked.py`` and each family's ``test_stacked*.py``) share the
small problems below: ``_model(seed)`` (an MLP 3 → 8 → 1), ``_data(seed)`` (40 rows of a noisy linear target), ``K``
fits, ``_stacked(backend)`` (``fit_many`` over K of them) and the options ``MAP_OPTIONS``, ``SVI_OPTIONS``.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from inference.fitting import fit_many
from zoo.bnn import BayesianNetwork


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


# ---------------------------------------------------------------------- the stacked fits' small problems
K = 3


def _model(seed, stochastic="all", d=3):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, 8), nn.Tanh(), nn.Linear(8, 1))
    return BayesianNetwork(net, stochastic=stochastic, example_input=torch.zeros(2, d))


def _data(seed, n=40, d=3, scale=1.0):
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(n, d, generator=g)
    return x, scale * (0.7 * x[:, :1] + 0.3 * torch.randn(n, 1, generator=g))


def _stacked(backend, seeds=(10, 11, 12), **options):
    data = [_data(k) for k in range(len(seeds))]
    return fit_many([_model(k) for k in range(len(seeds))], [d[0] for d in data], [d[1] for d in data],
                    backend=backend, seeds=list(seeds), **options), data


MAP_OPTIONS = dict(epochs=15, batch_size=16)
SVI_OPTIONS = dict(epochs=15, batch_size=16, pretrain_epochs=4)
