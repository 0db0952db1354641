"""Unit tests of the parts in :mod:`inference.mcmc`, on targets with known answers.

Tolerances: the integrator tests are deterministic (float64 round-off); the statistical ones
use fixed seeds and bounds of 4-5 Monte Carlo standard errors (stated at each test).
"""
from __future__ import annotations

import math
import warnings
from functools import partial
from typing import NamedTuple

import numpy as np
import pytest
import torch

from inference.mcmc.adaptation import (
    adaptation_windows, dual_averaging, find_step_size, metric_choice, shrink_correlations, welford_covariance,
    window_adaptation,
)  # fmt: skip
from inference.mcmc.chains import sample_chains
from inference.mcmc.initial_metric import curvature_metric, hessian
from inference.mcmc.mass_matrix import identity_metric
from inference.mcmc.driver import run_chains, thinned
from inference.mcmc.integrators import IntegratorState, energy, leapfrog
from inference.mcmc.kernels import HMCState, hmc_transition, nuts_transition
from inference.mcmc.mass_matrix import euclidean_metric, kinetic_energy, sample_momentum, velocity
from inference.mcmc.nuts import Checkpoints, Edge, Proposal, block_masks, build_subtree, is_turning, new_subtree, subtree_step
from inference.optim.potential import compiled


def gaussian(precision: torch.Tensor):
    """``value_and_grad`` of log π(z) = −½ zᵀ P z for ``z`` ``[C, D]``."""

    def value_and_grad(z):
        pz = z @ precision
        return -0.5 * (z * pz).sum(-1), -pz

    return value_and_grad


def random_spd(dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    return a @ a.T / dim + 0.5 * torch.eye(dim, dtype=torch.float64)


# ---------------------------------------------------------------------- metrics and leapfrog
@pytest.mark.parametrize("dense", [False, True])
def test_leapfrog_is_reversible(dense):
    """Negating the momentum after n steps and taking n more returns to the start (to round-off)."""
    dim, chains = 5, 3
    vg = gaussian(random_spd(dim, 0))
    inv_mass = random_spd(dim, 1).expand(chains, dim, dim) if dense else torch.rand(chains, dim, dtype=torch.float64) + 0.5
    g = torch.Generator().manual_seed(2)
    z, p = torch.randn(chains, dim, generator=g, dtype=torch.float64), torch.randn(chains, dim, generator=g, dtype=torch.float64)
    start = IntegratorState(z, p, *vg(z))
    eps = torch.full((chains, 1), 0.1, dtype=torch.float64)
    state = start
    for _ in range(25):
        state = leapfrog(vg, inv_mass, state, eps)
    assert (state.z - z).abs().max() > 0.1  # it moved
    state = state._replace(p=-state.p)
    for _ in range(25):
        state = leapfrog(vg, inv_mass, state, eps)
    assert torch.allclose(state.z, z, atol=1e-12) and torch.allclose(-state.p, p, atol=1e-12)
    # and backwards in time (negative step) is the same as forwards with negated momentum
    back = leapfrog(vg, inv_mass, leapfrog(vg, inv_mass, start, eps), -eps)
    assert torch.allclose(back.z, z, atol=1e-12) and torch.allclose(back.p, p, atol=1e-12)


def test_leapfrog_energy_error_is_second_order():
    """Max |H − H₀| over a fixed integration time T = 2 on an anharmonic target
    (log π = −z²/2 − z⁴/4 per coordinate) falls 4× per halving of ε: slope 2 on log-log axes."""

    def vg(z):
        return -(0.5 * z**2 + 0.25 * z**4).sum(-1), -(z + z**3)

    z = torch.tensor([[0.5, -1.0], [1.2, 0.3]], dtype=torch.float64)
    p = torch.tensor([[1.0, 0.5], [-0.7, 1.1]], dtype=torch.float64)
    inv_mass = torch.ones_like(z)
    errors = []
    for eps in (0.1, 0.05, 0.025, 0.0125):
        state = IntegratorState(z, p, *vg(z))
        h0, worst = energy(inv_mass, state), torch.zeros(2, dtype=torch.float64)
        for _ in range(round(2.0 / eps)):
            state = leapfrog(vg, inv_mass, state, torch.full((2, 1), eps, dtype=torch.float64))
            worst = torch.maximum(worst, (energy(inv_mass, state) - h0).abs())
        errors.append(worst)
    slopes = torch.stack([torch.log2(a / b) for a, b in zip(errors, errors[1:])])
    assert bool(((slopes - 2).abs() < 0.1).all()), slopes


def test_dense_metric_momenta_have_covariance_m():
    """p ~ N(0, M): the sample covariance of 20 000 draws matches M = (M⁻¹)⁻¹ (4 MC standard errors)."""
    inv_mass = random_spd(3, 3).float()
    metric = euclidean_metric(inv_mass.expand(20000, 3, 3))
    p = sample_momentum(metric, torch.Generator().manual_seed(0))
    mass = torch.linalg.inv(inv_mass)
    cov = torch.cov(p.T)
    se = ((mass**2 + mass.diagonal().outer(mass.diagonal())) / 20000).sqrt()  # sd of a sample covariance entry
    assert ((cov - mass).abs() < 4 * se).all()
    assert torch.allclose(kinetic_energy(metric.inv_mass[:5], p[:5]), 0.5 * torch.einsum("cd,de,ce->c", p[:5], inv_mass, p[:5]), rtol=1e-5)
    assert torch.allclose(velocity(metric.inv_mass[:5], p[:5]), p[:5] @ inv_mass, rtol=1e-5, atol=1e-6)


def test_metric_rejects_a_bad_shape():
    with pytest.raises(ValueError, match=r"\[C, D\] or \[C, D, D\]"):
        euclidean_metric(torch.ones(3))


# ---------------------------------------------------------------------- the U-turn rule
def arc(angle: float, points: int = 41):
    """Momenta turning at a constant rate through ``angle`` in the plane: p_k = (cos θ_k, sin θ_k)."""
    theta = torch.linspace(0, angle, points, dtype=torch.float64)
    return torch.stack([theta.cos(), theta.sin()], -1)


@pytest.mark.parametrize("angle, turning", [(0.5 * math.pi, False), (0.9 * math.pi, False), (1.1 * math.pi, True), (1.5 * math.pi, True)])
def test_u_turn_rule_on_hand_built_trajectories(angle, turning):
    """With M = I the rule fires once the momenta have turned through more than π:
    ρ' = Σp − (p_first + p_last)/2 points along θ/2, so p_first·ρ' ∝ cos(θ/2) ≤ 0 iff θ ≥ π."""
    p = arc(angle)
    rho = p.sum(0)
    assert bool(is_turning(p[0], p[-1], p[0], p[-1], rho)) == turning
    assert bool(is_turning(p[-1], p[0], p[-1], p[0], rho)) == turning  # either direction


def test_u_turn_rule_is_per_chain_and_uses_the_velocity():
    straight = torch.ones(5, 2, dtype=torch.float64)  # constant momentum: never turning
    reversed_ = torch.cat([torch.ones(3, 2), -torch.ones(3, 2)]).double()  # momentum flips: turning
    p_left = torch.stack([straight[0], reversed_[0]])
    p_right = torch.stack([straight[-1], reversed_[-1]])
    rho = torch.stack([straight.sum(0), reversed_.sum(0) + torch.tensor([0.0, 0.5], dtype=torch.float64)])
    assert is_turning(p_left, p_right, p_left, p_right, rho).tolist() == [False, True]
    # a metric that rotates the velocity against the momentum sum turns a straight line into a U-turn
    flip = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    assert bool(is_turning(velocity(flip, straight[0]), velocity(flip, straight[-1]), straight[0], straight[-1], straight.sum(0)))


def test_block_masks_follow_aligned_sub_trees():
    """In a subtree of 2^j steps, the aligned blocks of 2^k steps start at multiples of 2^k and end one before."""
    sizes = 2 ** torch.arange(1, 4)
    for i in range(8):
        store, check = block_masks(torch.tensor(i), torch.tensor(8), sizes)
        for k in range(1, 4):
            assert bool(store[k - 1]) == (i % 2**k == 0)
            assert bool(check[k - 1]) == ((i + 1) % 2**k == 0)
    store, check = block_masks(torch.tensor(0), torch.tensor(2), sizes)  # depth 1: levels above j are never used
    assert store.tolist() == [True, False, False] and check.tolist() == [False, False, False]


def _one_subtree(subtree, vg, num_steps: int, chains: int = 4, depth: int = 5):
    """A subtree of ``num_steps`` from fixed starting points on a 3-D Gaussian, built by ``subtree``."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(chains, 3, generator=g, dtype=torch.float64)
    p = torch.randn(chains, 3, generator=g, dtype=torch.float64)
    lp, grad = vg(z)
    energy0 = 0.5 * (p * p).sum(-1) - lp
    zeros = torch.zeros(chains, dtype=torch.float64)
    checkpoints = Checkpoints(*(z.new_zeros(depth, chains, 3) for _ in range(3)))
    tree = new_subtree(Edge(z, p, lp, grad, p.clone()), torch.ones(chains, dtype=torch.bool),
                       Proposal(z.clone(), lp.clone(), grad.clone(), energy0.clone()), checkpoints, zeros, zeros.clone(),
                       torch.zeros(chains, dtype=torch.bool))  # fmt: skip
    u = torch.rand(2 ** (depth - 1), chains, generator=g, dtype=torch.float64)
    eps = torch.tensor([[0.3], [-0.3], [0.05], [0.9]], dtype=torch.float64)
    return subtree(torch.ones(chains, 3, dtype=torch.float64), eps, energy0, tree, u, torch.tensor(num_steps), 2 ** torch.arange(1, depth + 1))


def _by_hand(vg):
    def subtree(inv_mass, eps, energy0, tree, u, num_steps, sizes):
        for i in range(int(num_steps)):
            tree = subtree_step(vg, 1000.0, inv_mass, eps, energy0, tree, u[i], *block_masks(i, num_steps, sizes))
        return tree

    return subtree


def _assert_same_tree(a, b):
    for x, y in zip(a.proposal + (a.n_steps, a.accept_sum, a.rho, a.log_w), b.proposal + (b.n_steps, b.accept_sum, b.rho, b.log_w)):
        torch.testing.assert_close(x, y)
    assert torch.equal(a.alive, b.alive) and torch.equal(a.diverging, b.diverging)


def test_build_subtree_repeats_the_step():
    """``build_subtree`` is ``num_steps`` calls of ``subtree_step`` with the block masks of each
    step; stopping once every chain has stopped does not change the tree."""
    vg = gaussian(random_spd(3, 0))
    reference = _one_subtree(_by_hand(vg), vg, 16)
    assert not bool(reference.alive.all())  # some chain turned inside the subtree: the masks matter
    _assert_same_tree(_one_subtree(partial(build_subtree, vg, 1000.0), vg, 16), reference)


@pytest.mark.slow
def test_compiled_subtree_is_the_same_tree():
    """The compiled ``while_loop`` (one call per subtree) builds the same tree as the Python loop."""
    vg = gaussian(random_spd(3, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed compile would fall back to eager with a warning
        fused = _one_subtree(compiled(build_subtree, True, vg, 1000.0), vg, 16)
    _assert_same_tree(fused, _one_subtree(_by_hand(vg), vg, 16))


def test_nuts_trajectory_stops_within_half_a_period():
    """On a 1-D standard Gaussian the flow is a rotation of period 2π: the U-turn rule must stop
    every trajectory before it spans half a period (π/ε steps), and most well after one step."""
    chains, eps = 200, 0.1
    vg = gaussian(torch.eye(1))
    transition = partial(nuts_transition, partial(build_subtree, vg, 1000.0), 10)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(chains, 1, generator=g)
    state, info = transition(HMCState(z, *vg(z)), torch.full((chains,), eps), euclidean_metric(torch.ones(chains, 1)), g)
    assert float(info["n_steps"].max()) * eps < math.pi
    assert float(info["n_steps"].median()) >= 7 and not bool(info["diverging"].any())
    assert bool((info["tree_depth"] <= 5).all())


# ---------------------------------------------------------------------- adaptation
@pytest.mark.parametrize("noise, median_tol, max_tol", [(0.0, 0.005, 0.01), (0.2, 0.015, 0.05)])
def test_dual_averaging_converges_to_the_target_acceptance(noise, median_tol, max_tol):
    """Acceptance α(ε) = exp(−ε²), optionally ± uniform noise: from 200 step sizes between 0.01
    and 5, ε̄ reaches α⁻¹(0.8) = √(−ln 0.8) after 3000 updates.  Bounds: the measured spread over
    the 200 starts (sd 0.25 % without noise, 1.2 % with) times 4, and the median to within 1.5 %
    (clamping α to [0, 1] makes the noisy feedback slightly asymmetric)."""
    adapt = dual_averaging(0.8)
    g = torch.Generator().manual_seed(0)
    state = adapt.init(torch.logspace(-2, 0.7, 200))
    for _ in range(3000):
        accept = torch.exp(-state.log_step.exp() ** 2) + noise * (2 * torch.rand(200, generator=g) - 1)
        state = adapt.update(state, accept.clamp(0, 1))
    error = adapt.final(state) / math.sqrt(-math.log(0.8)) - 1
    assert abs(float(error.median())) < median_tol and float(error.abs().max()) < max_tol


def test_dual_averaging_tunes_hmc_on_a_gaussian():
    """Static HMC on a 10-D Gaussian: after 300 adaptation iterations from ε = 1.5, the mean acceptance
    over 300 fixed-ε iterations × 8 chains is 0.8 ± 0.05 (MC error ≈ 0.01; dual averaging's average
    iterate lands slightly off the target)."""
    chains, dim = 8, 10
    vg = gaussian(torch.diag(torch.linspace(0.5, 2.0, dim)))
    transition = partial(hmc_transition, partial(leapfrog, vg), 1000.0, 8, 0.0)
    metric = euclidean_metric(torch.ones(chains, dim))
    g = torch.Generator().manual_seed(1)
    z = torch.randn(chains, dim, generator=g)
    state, adapt = HMCState(z, *vg(z)), dual_averaging(0.8)
    da = adapt.init(torch.full((chains,), 1.5))
    for _ in range(300):
        state, info = transition(state, da.log_step.exp(), metric, g)
        da = adapt.update(da, info["accept_prob"])
    step_size, accept = adapt.final(da), []
    for _ in range(300):
        state, info = transition(state, step_size, metric, g)
        accept.append(info["accept_prob"])
    assert abs(float(torch.stack(accept).mean()) - 0.8) < 0.05


@pytest.mark.parametrize("dense", [False, True])
def test_welford_matches_numpy(dense):
    """Running mean and (co)variance of points far from the origin match numpy's two-pass estimates."""
    rng = np.random.default_rng(0)
    points = rng.normal(100.0, [1.0, 3.0, 0.2], size=(2, 300, 3)).astype(np.float32)
    welford = welford_covariance(dense)
    state = welford.init(2, 3)
    for t in range(300):
        state = welford.update(state, torch.from_numpy(points[:, t]))
    n = 300
    for c in range(2):
        assert np.allclose(state.mean[c].numpy(), points[c].mean(0), rtol=1e-6)
        cov = np.cov(points[c].astype(np.float64), rowvar=False, ddof=1)
        estimate = state.m2[c].numpy() / (n - 1)
        assert np.allclose(estimate, cov if dense else np.diag(cov), rtol=1e-3, atol=1e-4)
        # dense: the correlations first shrunk by Ledoit & Wolf's intensity (independent coordinates: λ ≈ 1)
        r2 = (cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))) ** 2
        off = r2.sum() - np.trace(r2)
        lam = min(1.0, (6 + off) / ((n - 1) * off))
        shrunk = (1 - lam) * cov + lam * np.diag(np.diag(cov)) if dense else cov
        regularised = n / (n + 5) * shrunk + 1e-3 * 5 / (n + 5) * np.eye(3)
        final = welford.final(state)[c].numpy()
        assert np.allclose(final, regularised if dense else np.diag(regularised), rtol=1e-3, atol=1e-4)


def _correlated_draws(dim: int, n: int, rho: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(draws [n, dim], Σ)``: Gaussian draws with AR(1) correlation ρ^|i−j| and sds from 0.1 to 3."""
    idx = torch.arange(dim, dtype=torch.float64)
    sd = torch.logspace(-1, math.log10(3.0), dim, dtype=torch.float64)
    cov = rho ** (idx[:, None] - idx[None, :]).abs() * sd[:, None] * sd[None, :]
    z = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return z @ torch.linalg.cholesky(cov).T, cov


def _relative_eigenvalues(inv_mass: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of Σ^{-1/2} M⁻¹ Σ^{-1/2}: 1 for the exact covariance, the metric's error per direction."""
    chol = torch.linalg.cholesky(cov)
    a = torch.linalg.solve_triangular(chol, inv_mass, upper=False)
    return torch.linalg.eigvalsh(torch.linalg.solve_triangular(chol, a.T, upper=False))


def test_dense_metric_from_fewer_draws_than_dimensions_keeps_every_direction_open():
    """100 pooled draws of a 300-dimensional Gaussian: the sample covariance is singular, and Stan's
    regularisation alone gave 201 directions the variance 10⁻³·5/105 ≈ 5e-5 (against 0.01–9 in the target: the
    chains stop moving there; issue 37, digits' last layer).  With the correlations shrunk, every direction
    keeps at least a tenth of its variance, and the shrinkage intensity is near 1 (the correlations seen in
    100 draws of 300 coordinates are mostly noise)."""
    draws, cov = _correlated_draws(300, 100, 0.5, seed=0)
    welford = welford_covariance(True)
    state = welford.init(4, 300, draws)
    for t in range(25):  # four chains of 25 draws, pooled
        state = welford.update(state, draws.view(4, 25, 300)[:, t])
    inv_mass = welford.final(state, pooled=True)
    assert torch.equal(inv_mass[0], inv_mass[3])
    relative = _relative_eigenvalues(inv_mass[0], cov)
    assert float(relative.min()) > 0.1 and float(relative.max()) < 10
    _, lam = shrink_correlations(torch.cov(draws.T).unsqueeze(0), 100)
    assert 0.7 < float(lam) <= 1


def test_correlation_shrinkage_vanishes_for_strong_correlations_seen_in_many_draws():
    """4 000 draws of a 5-dimensional Gaussian with correlations 0.95^|i−j|: λ ≈ (1 + r²)/((n − 1) r²) ≈ 5e-4, so
    the metric is Stan's (n/(n+5))·Σ + 10⁻³·5/(n+5)·I to 0.1 %; constant or 1-dimensional draws get the diagonal."""
    draws, _ = _correlated_draws(5, 4000, 0.95, seed=1)
    sample = torch.cov(draws.T)
    shrunk, lam = shrink_correlations(sample, 4000)
    assert 0 < float(lam) < 1e-3 and torch.allclose(shrunk, sample, rtol=1e-3, atol=1e-6)
    welford = welford_covariance(True)
    state = welford.init(1, 5, draws)
    for z in draws:
        state = welford.update(state, z.unsqueeze(0))
    stan = 4000 / 4005 * sample + 1e-3 * 5 / 4005 * torch.eye(5, dtype=torch.float64)
    assert torch.allclose(welford.final(state)[0], stan, rtol=1e-3, atol=1e-6)
    constant, lam = shrink_correlations(torch.zeros(2, 3, 3), 50)
    assert torch.equal(constant, torch.zeros(2, 3, 3)) and torch.equal(lam, torch.ones(2))
    one, lam = shrink_correlations(torch.full((1, 1), 2.0), 50)
    assert torch.equal(one, torch.full((1, 1), 2.0)) and float(lam) == 1


def test_windowed_dense_adaptation_with_fewer_draws_than_dimensions_keeps_the_typical_set():
    """NUTS on a 200-dimensional Gaussian whose only slow window holds 4 × 25 = 100 pooled draws.  Before the
    correlations were shrunk, the window's metric left 101 directions at a variance of 5e-5: the chains could
    move only in the 99-dimensional span of the window's draws (on digits' last layer they then sank into it
    towards the mode, log π from the typical set's −1 450 to −1 010), and every one of the 120 trees kept here
    ran to the depth cap of 7.  Now: no tree at the cap, and the draws in the typical set, the mean log π of
    4 chains × 30 draws within ±25 (2.5 sd of one draw) of −½·200."""
    dim, chains = 200, 4
    _, cov = _correlated_draws(dim, 1, 0.5, seed=2)
    precision = torch.linalg.inv(cov)
    vg = gaussian(precision)
    g = torch.Generator().manual_seed(3)
    start = torch.randn(chains, dim, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T  # in the typical set
    transition = partial(nuts_transition, partial(build_subtree, vg, 1000.0), 7)
    potential = type("Gaussian", (), {"value_and_grad": staticmethod(vg)})()
    z, stats, record = sample_chains(
        potential, start, transition, g, False, "nuts", warmup_steps=150, num_samples=30, thin=1, step_size=0.1,
        target_accept=0.8, dense_mass=True, pool_adaptation=True, adapt_step_size=True, adapt_mass=True,
        initial_metric=euclidean_metric(cov.expand(chains, dim, dim).clone()),  # the exact one until the window ends
    )  # fmt: skip
    assert record["adaptation_windows"] == [(75, 100)]
    assert abs(float(stats["lp"].mean()) + dim / 2) < 25
    assert int((stats["tree_depth"] >= 7).sum()) == 0


def test_initial_step_size_is_the_first_doubling_whose_one_step_acceptance_falls_below_0_8():
    """Alg. 4 of Hoffman & Gelman 2014 with Stan's and NumPyro's threshold 0.8: replaying the same momenta, every
    doubling before the step returned was accepted with probability ≥ 0.8 and the one returned with less
    (per chain); the threshold ½ of the paper returns steps at least as large."""
    dim, chains = 20, 6
    vg = gaussian(torch.diag(torch.linspace(0.5, 4.0, dim, dtype=torch.float64)))
    z = torch.randn(chains, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    state = HMCState(z, *vg(z))
    metric = identity_metric(chains, dim, dense=False, like=z)
    start = torch.full((chains,), 1e-3, dtype=torch.float64)
    eps = find_step_size(vg, state, start, metric, torch.Generator().manual_seed(1))
    replay = torch.Generator().manual_seed(1)
    found = torch.zeros(chains, dtype=torch.bool)
    for k in range(40):
        point = IntegratorState(z, sample_momentum(metric, replay), *vg(z))
        trial = start * 2**k
        moved = leapfrog(vg, metric.inv_mass, point, trial.unsqueeze(-1))
        accept = torch.exp(energy(metric.inv_mass, point) - energy(metric.inv_mass, moved)).clamp(max=1)
        below = ~found & (accept < 0.8)
        assert torch.equal(eps[below], trial[below])  # the first step below 0.8 is returned
        found |= below
        if bool(found.all()):
            break
    assert bool(found.all()) and k > 3
    paper = find_step_size(vg, state, start, metric, torch.Generator().manual_seed(1), accept=0.5)
    assert bool((paper >= eps).all()) and bool((paper > eps).any())


def test_metric_choice_is_dense_for_a_last_layer_and_diagonal_for_a_network():
    auto = ("auto", "auto", "auto")
    assert metric_choice(*auto, 34, 200, 4) == (True, True, True)  # last window 50 iterations · 4 chains = 200 draws
    assert metric_choice(*auto, 100, 200, 4) == (True, True, True)
    assert metric_choice(*auto, 101, 200, 4) == (False, False, True)  # fewer than 2 draws per dimension
    assert metric_choice(*auto, 150, 1000, 4) == (True, True, True)  # last window 500 iterations
    assert metric_choice(*auto, 201, 10000, 4) == (False, False, True)  # over DENSE_MAX_DIM
    assert metric_choice(*auto, 5, 10, 4) == (False, False, True)  # no window: nothing to estimate it from
    # an output layer started from its curvature (computed up to 2000 dimensions): dense whatever the draws, kept
    assert metric_choice(*auto, 150, 200, 4, curvature=True, output_layer=True) == (True, True, False)
    assert metric_choice(*auto, 850, 200, 4, curvature=True, output_layer=True) == (True, True, False)
    assert metric_choice(*auto, 850, 200, 4, output_layer=True) == (False, False, True)  # from the identity
    assert metric_choice(*auto, 34, 200, 4, curvature=True) == (True, True, True)  # a network: re-estimated
    assert metric_choice(False, "auto", "auto", 5, 200, 4) == (False, False, True)
    assert metric_choice(True, False, True, 500, 200, 4, curvature=True, output_layer=True) == (True, False, True)
    assert metric_choice("auto", True, False, 1000, 200, 4) == (False, True, False)


def test_windows_are_contiguous_and_double():
    for warmup in (150, 200, 500, 1000, 3000):
        windows = adaptation_windows(warmup)
        assert windows[0][0] == 75 and windows[-1][1] == warmup - 50
        assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))
        sizes = [end - start for start, end in windows]
        assert sizes[0] == 25 and all(b == 2 * a for a, b in zip(sizes[:-2], sizes[1:-1]))  # doubling
        assert len(sizes) == 1 or sizes[-1] >= 2 * sizes[-2]  # the last window absorbs the remainder


def test_window_adaptation_replaces_the_metric_at_window_ends():
    """The metric changes exactly at the ends of the slow windows, to the regularised variance of the window's draws."""
    calls = []

    def find(state, step_size, metric):
        calls.append(metric)
        return step_size

    adaptation, windows = window_adaptation(100, 0.8, find_step_size=find)
    assert windows == [(15, 90)]
    g = torch.Generator().manual_seed(0)
    z_all = torch.randn(100, 2, 3, generator=g) * torch.tensor([1.0, 2.0, 3.0])
    ws = adaptation.init(HMCState(z_all[0], torch.zeros(2), torch.zeros(2, 3)), torch.full((2,), 0.1))
    for it in range(100):
        before = ws.metric
        ws = adaptation.update(ws, HMCState(z_all[it], torch.zeros(2), torch.zeros(2, 3)), {"accept_prob": torch.full((2,), 0.8)})
        assert (ws.metric is before) == (it != 89)
    ws = adaptation.final(ws)
    assert len(calls) == 2  # the start and the one window end
    var, n = z_all[15:90].var(0), 75  # the window's draws, per chain
    assert torch.allclose(ws.metric.inv_mass, n / (n + 5) * var + 1e-3 * 5 / (n + 5), rtol=1e-4)


# ---------------------------------------------------------------------- driver
def test_driver_adapts_keeps_thinned_draws_and_stops_on_non_finite():
    class S(NamedTuple):
        z: torch.Tensor
        log_density: torch.Tensor
        grad: torch.Tensor

    updates, finals = [], []

    class Count:
        init = None

        @staticmethod
        def update(params, state, info):
            updates.append(params)
            return params + 1

        @staticmethod
        def final(params):
            finals.append(params)
            return 100

    def transition(state, params):
        z = state.z + 1
        return S(z, z.sum(-1), z), {"p": torch.full((2,), float(params)), "lp": z.sum(-1)}

    start = S(torch.zeros(2, 1), torch.zeros(2), torch.zeros(2, 1))
    run = run_chains(transition, start, num_iterations=3 + 4 * 2, num_draws=4, draw_index=thinned(3, 2), params=0,
                     adaptation=Count, num_warmup=3, progress=False)  # fmt: skip
    assert updates == [0, 1, 2] and finals == [3] and run.params == 100
    assert run.z[0, :, 0].tolist() == [5.0, 7.0, 9.0, 11.0]  # the states after iterations 4, 6, 8, 10
    assert run.stats["p"][0].tolist() == [100.0] * 4 and run.num_kept == 4 and run.stopped_at is None

    def failing(state, params):
        z = state.z + 1
        lp = torch.where(z[:, 0] > 4, torch.tensor(float("nan")), z.sum(-1))
        return S(z, lp, z), {"lp": lp}

    run = run_chains(failing, start, num_iterations=10, num_draws=10, draw_index=thinned(0, 1), stop_on_non_finite=True, progress=False)
    assert run.stopped_at == 4 and run.num_kept == 4 and run.state.z[0, 0] == 4


# ---------------------------------------------------------------------- the initial metric
def test_hessian_from_batched_hessian_vector_products_is_exact():
    precision = random_spd(7, 3)
    vg = gaussian(precision)
    z = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(hessian(lambda points: vg(points)[0], z, probes=3), precision, atol=1e-12)

    def quartic(points):  # −log π = Σ z²/2 + z⁴/4: Hessian diag(1 + 3 z²)
        return -(0.5 * points**2 + 0.25 * points**4).sum(-1)

    assert torch.allclose(hessian(quartic, z), torch.diag(1 + 3 * z**2), atol=1e-12)


def test_curvature_metric_is_the_inverse_of_the_absolute_floored_hessian():
    vectors, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    h = vectors @ torch.diag(torch.tensor([100.0, 4.0, -2.0, 1e-5], dtype=torch.float64)) @ vectors.T
    dense = curvature_metric(h, 3, dense=True, floor=1e-2)
    expected = vectors @ torch.diag(torch.tensor([0.01, 0.25, 0.5, 100.0], dtype=torch.float64)) @ vectors.T
    assert dense.inv_mass.shape == (3, 4, 4) and torch.allclose(dense.inv_mass[2], expected, atol=1e-10)
    diagonal = curvature_metric(h, 2, dense=False, floor=1e-2)
    assert diagonal.inv_mass.shape == (2, 4) and torch.allclose(diagonal.inv_mass[0], expected.diagonal(), atol=1e-10)


def test_the_curvature_of_a_conjugate_regression_potential_is_its_posterior_precision():
    from tests.inference.conftest import make_conjugate_regression
    from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior
    from inference.optim.potential import Potential

    data = make_conjugate_regression()
    bnn = BayesianNetwork(data.net(), "all", NormalPrior(data.prior_sd), GaussianLikelihood(data.noise_sd), output_dim=1)
    potential = Potential(bnn, data.x, data.y)
    h = hessian(potential.log_density, torch.zeros(potential.dim))
    assert torch.allclose(h.double(), torch.linalg.inv(data.post_cov.double()), rtol=1e-4)
