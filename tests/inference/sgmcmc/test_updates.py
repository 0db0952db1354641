"""The SG-MCMC updates of :mod:`inference.sgmcmc.updates` on N(0, 1) targets with known answers: step-size
schedules, SGLD's and SGHMC's stationary variances of the discretised chains, pSGLD's preconditioner.

Tolerances: 10 000 independent chains, bounds of about 4 Monte Carlo standard errors (stated at each test).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from inference.sgmcmc.updates import as_schedule, cosine_cycle, polynomial_decay, psgld, sghmc, sgld
from tests.inference.mcmc.test_parts import gaussian


def test_step_size_schedules():
    assert as_schedule(0.1)(7) == 0.1
    assert as_schedule(lambda t: 1.0 / (t + 1))(3) == 0.25
    with pytest.raises(ValueError, match="positive number or a schedule"):
        as_schedule(-1.0)
    assert math.isclose(polynomial_decay(0.1, 10.0, 0.5)(30), 0.1 * (1 + 3.0) ** -0.5)
    cycle = cosine_cycle(0.4, 10)
    assert cycle(0) == 0.4 and math.isclose(cycle(5), 0.2) and cycle(10) == 0.4


def test_sgld_stationary_variance_matches_the_discretised_chain():
    """SGLD on N(0, 1) with exact gradients is z ← (1 − ε/2) z + √ε ξ, whose stationary variance is
    1/(1 − ε/4): 1.111 at ε = 0.4.  10 000 independent chains give a relative sd of 1.4 %; bound 5 %."""
    kernel = sgld(gaussian(torch.eye(1)), 0.4)
    g = torch.Generator().manual_seed(0)
    state = kernel.init(torch.zeros(10000, 1))
    for _ in range(200):
        state = kernel.update(state, g)
    assert state.step == 200
    var = float(state.z.var())
    assert abs(var / (1 / (1 - 0.1)) - 1) < 0.05 and var > 1.05


def test_sghmc_stationary_variance_matches_the_discrete_lyapunov_solution():
    """SGHMC on N(0, 1): (z, v) ← A (z, v) + b ξ with A = [[1−η, 1−α], [−η, 1−α]], b = √(2αη)(1, 1);
    the stationary covariance solves Σ = A Σ Aᵀ + b bᵀ.  10 000 chains, relative sd 1.4 %; bound 5 %."""
    eta, alpha = 0.1, 0.3
    kernel = sghmc(gaussian(torch.eye(1)), eta, alpha)
    g = torch.Generator().manual_seed(1)
    state = kernel.init(torch.zeros(10000, 1))
    for _ in range(400):
        state = kernel.update(state, g)
    a = np.array([[1 - eta, 1 - alpha], [-eta, 1 - alpha]])
    b = math.sqrt(2 * alpha * eta) * np.ones((2, 1))
    sigma = scipy.linalg.solve_discrete_lyapunov(a, b @ b.T)
    assert abs(float(state.z.var()) / sigma[0, 0] - 1) < 0.05
    assert abs(float(state.momentum.var()) / sigma[1, 1] - 1) < 0.05


def test_psgld_first_step_uses_the_rmsprop_preconditioner():
    """Without noise the first step is z + (ε/2) g / (λ + |g/N|) (V starts at the first squared mean gradient)."""
    num_data, eps = 10, 0.01
    kernel = psgld(gaussian(torch.eye(2)), eps, num_data, rms_decay=0.9, rms_damping=1e-3)
    z = torch.tensor([[1.0, -2.0]])
    state = kernel.update(kernel.init(z), torch.Generator(), noise=False)
    g = -z
    assert torch.allclose(state.z, z + 0.5 * eps * g / (1e-3 + (g / num_data).abs()))
    assert torch.allclose(state.square_avg, (g / num_data) ** 2)
    second = kernel.update(state, torch.Generator(), noise=False)
    assert torch.allclose(second.square_avg, 0.9 * (g / num_data) ** 2 + 0.1 * (state.grad / num_data) ** 2)
