"""Warm-up adaptation for HMC and NUTS, each part as ``init`` / ``update`` / ``final`` over a NamedTuple state.

* :func:`dual_averaging` — per-chain step size driven towards a target mean acceptance
  probability δ (Hoffman & Gelman 2014, Alg. 5 and eq. 6: μ = log(10 ε₀), γ = 0.05, t₀ = 10,
  κ = 0.75); the final step size is the iterate average x̄.
* :func:`welford_covariance` — running per-chain mean and (co)variance of the draws (Welford
  1962), turned into a regularised inverse mass matrix (n/(n+5))·Σ + 10⁻³·5/(n+5)·I, as in Stan; a
  dense Σ first has its correlations shrunk towards its diagonal (:func:`shrink_correlations`, Ledoit &
  Wolf 2004; Schäfer & Strimmer 2005), so that a window with fewer draws than dimensions gives every
  direction the variance its draws show rather than Stan's 10⁻³·5/(n+5).
* :func:`adaptation_windows` — Stan's windowed scheme (Stan reference manual, "HMC algorithm
  parameters: automatic parameter tuning"): a fast initial buffer (75 iterations), slow
  windows of 25, 50, 100, … iterations in which the metric is estimated, a fast final buffer
  (50); 15 % / 75 % / 10 % for warm-ups too short for that.
* :func:`find_step_size` — the initial step-size heuristic (Hoffman & Gelman 2014, Alg. 4) with the
  acceptance threshold 0.8 of Stan and NumPyro (Alg. 4's ½ starts at a step twice as large, which
  the dual averaging's first iterates, at up to 10 ε₀, push into divergence).
* :func:`metric_choice` — diagonal or dense metric, per chain or pooled, re-estimated or kept, from the
  dimension, the draws the last slow window will hold and the start (``"auto"`` options).
* :func:`window_adaptation` — all of them together: after every slow window the metric is
  replaced, the estimator restarted and the step size re-initialised by Alg. 4.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch

from inference.mcmc.integrators import IntegratorState, energy, energy_error, leapfrog
from inference.mcmc.mass_matrix import Metric, euclidean_metric, identity_metric, sample_momentum

__all__ = [
    "Adaptation", "DualAveragingState", "dual_averaging", "WelfordState", "welford_covariance",
    "adaptation_windows", "find_step_size", "WindowState", "window_adaptation", "metric_choice",
    "DENSE_MAX_DIM", "DENSE_DRAWS_PER_DIM", "STEP_SIZE_ACCEPT", "MetricPlan", "shrink_correlations",
]  # fmt: skip

#: the one-step acceptance probability :func:`find_step_size` brackets (Stan's ``init_stepsize``, NumPyro's
#: ``find_reasonable_step_size``)
STEP_SIZE_ACCEPT = 0.8
#: ``dense_mass="auto"`` chooses a dense metric up to this many dimensions (its O(D²) matrix-vector product
#: per leapfrog step stays below the gradient's cost of the networks sampled whole at that size)
DENSE_MAX_DIM = 200
#: ... and only when the last slow window holds at least this many (pooled) draws per dimension
DENSE_DRAWS_PER_DIM = 2


class Adaptation(NamedTuple):
    """An adaptation scheme: ``init(...) -> state``, ``update(state, ...) -> state``, ``final(state, ...)``."""

    init: Callable
    update: Callable
    final: Callable


# ---------------------------------------------------------------------- step size
class DualAveragingState(NamedTuple):
    """Per-chain dual-averaging state, each ``[C]`` except the iteration count ``t``.

    Attributes:
        log_step: log ε_t, the current iterate.
        log_avg: log ε̄_t, the weighted iterate average (the final step size).
        h_bar: H̄_t, the running average of δ − α_t.
        mu: μ = log(10 ε₀), the point the iterates shrink towards.
        t: updates so far.
    """

    log_step: torch.Tensor
    log_avg: torch.Tensor
    h_bar: torch.Tensor
    mu: torch.Tensor
    t: int


def dual_averaging(target_accept: float, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75) -> Adaptation:
    """Step-size adaptation by dual averaging (Hoffman & Gelman 2014, Alg. 5).

    ``init(step_size [C])``, ``update(state, accept_prob [C])`` (NaN counts as 0), ``final(state) -> ε̄ [C]``;
    the current step size is ``state.log_step.exp()``.
    """

    def init(step_size: torch.Tensor) -> DualAveragingState:
        zeros = torch.zeros_like(step_size)
        return DualAveragingState(torch.log(step_size), zeros, zeros, torch.log(10 * step_size), 0)

    def update(state: DualAveragingState, accept_prob: torch.Tensor) -> DualAveragingState:
        t = state.t + 1
        eta = 1.0 / (t + t0)
        accept_prob = torch.nan_to_num(accept_prob, nan=0.0)
        h_bar = (1 - eta) * state.h_bar + eta * (target_accept - accept_prob)
        log_step = state.mu - math.sqrt(t) / gamma * h_bar
        weight = t ** (-kappa)
        log_avg = weight * log_step + (1 - weight) * state.log_avg
        return DualAveragingState(log_step, log_avg, h_bar, state.mu, t)

    def final(state: DualAveragingState) -> torch.Tensor:
        return state.log_avg.exp()

    return Adaptation(init, update, final)


def find_step_size(value_and_grad, state, step_size, metric: Metric, generator, max_doublings: int = 40,
                   accept: float = STEP_SIZE_ACCEPT) -> torch.Tensor:
    """Per-chain initial step size ``[C]``: double or halve ``step_size`` until the acceptance
    probability of one leapfrog step from ``state`` (z, log π, ∇ log π) with fresh momenta
    crosses ``accept`` (Hoffman & Gelman 2014, Alg. 4, whose threshold is ½; 0.8 as in Stan and NumPyro);
    the step size returned is the first beyond the crossing."""
    z, lp, grad = state
    log_half = math.log(accept)

    def log_ratio(eps):
        point = IntegratorState(z, sample_momentum(metric, generator), lp, grad)
        energy0 = energy(metric.inv_mass, point)
        moved = leapfrog(value_and_grad, metric.inv_mass, point, eps.unsqueeze(-1))
        return -energy_error(energy(metric.inv_mass, moved), energy0)

    up = log_ratio(step_size) > log_half
    active = torch.ones_like(up)
    for _ in range(max_doublings):
        trial = torch.where(up, step_size * 2, step_size / 2)
        crossed = (log_ratio(trial) > log_half) != up
        step_size = torch.where(active, trial, step_size)
        active = active & ~crossed
        if not bool(active.any()):
            break
    return step_size


# ---------------------------------------------------------------------- mass matrix
class WelfordState(NamedTuple):
    """Running moments of ``n`` points per chain: ``mean`` ``[C, D]`` and ``m2`` = Σ (z − z̄)(z − z̄)ᵀ,
    ``[C, D, D]`` (dense) or its diagonal ``[C, D]``."""

    n: int
    mean: torch.Tensor
    m2: torch.Tensor


def shrink_correlations(cov: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ*, λ)``: the sample covariance ``cov`` ``[..., D, D]`` of ``n`` points with its correlations shrunk
    towards zero, Σ* = (1 − λ)·Σ + λ·diag(Σ), and the intensity λ ``[...]`` in [0, 1].

    λ is Ledoit & Wolf's (2004) optimal intensity for the diagonal target (Schäfer & Strimmer 2005, target
    "D"), λ = Σ_{i≠j} Var(s_ij) / Σ_{i≠j} s_ij², with the variance of a sample covariance of Gaussian
    points, Var(s_ij) = (s_ii s_jj + s_ij²)/(n − 1); in correlations r_ij,

        λ = Σ_{i≠j} (1 + r_ij²) / ((n − 1) Σ_{i≠j} r_ij²).

    Correlations that are noise (|r| ~ 1/√n, always the case for most pairs when n < D) give λ ≈ 1;
    strong correlations seen in many draws (a last layer's collinear features, n ≫ D) give λ ≈ 0, Stan's
    estimate.  Why it matters: with n ≤ D the sample covariance is singular, and Stan's regularisation
    (n/(n+5))·Σ + 10⁻³·5/(n+5)·I leaves D − n + 1 directions at a variance of 10⁻³·5/(n+5) — on the
    1 010 last-layer weights of LeNet-300-100 (digits), 100 pooled draws pinned 911 directions at 4.8e-5
    against a posterior variance of 0.013–1, the chains stopped moving in them and NUTS ran at tree depth
    10 with a step of 10⁻⁴ (issue 37).  Draws in a window are autocorrelated, so n
    overstates their information and λ errs towards Stan's estimate; D = 1 or constant draws give λ = 1.
    """
    dim = cov.shape[-1]
    var = cov.diagonal(dim1=-2, dim2=-1)
    diagonal = torch.diag_embed(var)
    if dim < 2 or n < 2:
        return diagonal, torch.ones(cov.shape[:-2], dtype=cov.dtype, device=cov.device)
    sd = var.clamp_min(torch.finfo(cov.dtype).tiny).sqrt()
    r2 = (cov / (sd.unsqueeze(-1) * sd.unsqueeze(-2))).square().clamp(max=1.0)
    off = r2.sum((-2, -1)) - r2.diagonal(dim1=-2, dim2=-1).sum(-1)  # Σ_{i≠j} r²
    pairs = dim * (dim - 1)
    lam = torch.where(off > 0, (pairs + off) / ((n - 1) * off.clamp_min(torch.finfo(cov.dtype).tiny)),
                      torch.ones_like(off)).clamp(0.0, 1.0)
    lam_ = lam.unsqueeze(-1).unsqueeze(-1)
    return (1 - lam_) * cov + lam_ * diagonal, lam


def welford_covariance(dense: bool) -> Adaptation:
    """Welford's running (co)variance (Welford 1962) as an inverse mass matrix estimator.

    ``init(num_chains, dim, like=None)`` (zeros with ``like``'s dtype and device),
    ``update(state, z [C, D])``, ``final(state, pooled) -> M⁻¹`` ``[C, D]``
    or ``[C, D, D]``: the sample (co)variance (divisor n − 1) per chain, or of all chains' points
    together (``pooled``; the same matrix for every chain), regularised towards 10⁻³·I as in Stan; a dense
    one first with its correlations shrunk towards its diagonal by :func:`shrink_correlations` (n the
    points it is estimated from: C·n when pooled).
    """

    def init(num_chains: int, dim: int, like: Optional[torch.Tensor] = None) -> WelfordState:
        options = {} if like is None else {"dtype": like.dtype, "device": like.device}
        m2 = torch.zeros(num_chains, dim, dim, **options) if dense else torch.zeros(num_chains, dim, **options)
        return WelfordState(0, torch.zeros(num_chains, dim, **options), m2)

    def update(state: WelfordState, z: torch.Tensor) -> WelfordState:
        n = state.n + 1
        delta = z - state.mean
        mean = state.mean + delta / n
        after = z - mean
        return WelfordState(n, mean, state.m2 + (delta.unsqueeze(-1) * after.unsqueeze(-2) if dense else delta * after))

    def final(state: WelfordState, pooled: bool = False) -> torch.Tensor:
        m2, mean, n = state.m2, state.mean, state.n
        if pooled:  # Σ_c [M2_c + n (μ_c − μ)(μ_c − μ)ᵀ] over C·n points
            spread = mean - mean.mean(0)
            extra = spread.unsqueeze(-1) * spread.unsqueeze(-2) if dense else spread * spread
            m2 = (m2 + n * extra).sum(0, keepdim=True).expand_as(m2)
            n = n * mean.shape[0]
        cov = m2 / max(n - 1, 1)
        shrink = 1e-3 * 5.0 / (n + 5.0)
        if dense:
            cov, _ = shrink_correlations(cov, n)
            return (n / (n + 5.0)) * cov + shrink * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        return (n / (n + 5.0)) * cov + shrink

    return Adaptation(init, update, final)


def adaptation_windows(warmup: int, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25) -> list:
    """Stan's slow (metric) windows ``[(start, end)]`` in iterations; none below 20 warm-up iterations."""
    if warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > warmup:
        init_buffer, term_buffer = int(0.15 * warmup), int(0.1 * warmup)
        base_window = warmup - init_buffer - term_buffer
    windows, start, size, last = [], init_buffer, base_window, warmup - term_buffer
    while start < last:
        end = start + size
        if end + 2 * size > last:
            end = last
        windows.append((start, end))
        start, size = end, 2 * size
    return windows


class MetricPlan(NamedTuple):
    """How the warm-up treats the metric: ``dense`` or diagonal, ``pooled`` over the chains or per chain, and
    ``estimate``: re-estimated from the draws in Stan's windows, or kept as it starts."""

    dense: bool
    pooled: bool
    estimate: bool


def metric_choice(dense_mass, pool_adaptation, adapt_mass, dim: int, num_warmup: int, num_chains: int,
                  curvature: bool = False, output_layer: bool = False) -> MetricPlan:
    """The :class:`MetricPlan` for the options ``dense_mass``, ``pool_adaptation`` and ``adapt_mass`` (each
    ``True``, ``False`` or ``"auto"``), a start from the curvature (``curvature``) or the identity, and a
    posterior over an output layer alone (``output_layer``) or a network.

    ``"auto"``:

    * dense when ``dim`` ≤ :data:`DENSE_MAX_DIM` and the last slow window of :func:`adaptation_windows`
      holds, over all chains, at least :data:`DENSE_DRAWS_PER_DIM` draws per dimension (the defaults, 200
      warm-up iterations of 4 chains: a last window of 50 iterations, 200 draws, so up to 100
      dimensions), or when the metric starts from the curvature of an output layer (computed up to
      :data:`~inference.mcmc.initial_metric.CURVATURE_MAX_DIM` dimensions: its matrix-vector product,
      D² per chain and leapfrog step, stays below the output layer's gradient, N·D, for D < N).  A
      diagonal metric cannot follow the correlations of a last layer's posterior (its features are
      correlated): every NUTS trajectory then hits the tree-depth cap, where a dense one takes a few
      dozen steps;
    * pooled (one matrix from all chains' draws, C times the draws) when dense;
    * estimated from the draws, except a dense metric from the curvature of an output layer, which is
      kept: a last layer's posterior is close to its Laplace approximation, and the windows' estimates
      from 100–200 draws were worse (energy's last layer: 42 leapfrog steps per iteration after them
      against 8 with the curvature; docs/mcmc.md, "Metric").  A network's curvature at the MAP is no
      such description: its metric is re-estimated, as Stan's and NumPyro's.
    """
    windows = adaptation_windows(num_warmup)
    draws = num_chains * (windows[-1][1] - windows[-1][0]) if windows else 0
    laplace = curvature and output_layer
    enough = draws >= DENSE_DRAWS_PER_DIM * dim
    dense = dense_mass if dense_mass != "auto" else ((dim <= DENSE_MAX_DIM and enough) or laplace)
    pooled = pool_adaptation if pool_adaptation != "auto" else bool(dense)
    estimate = adapt_mass if adapt_mass != "auto" else not (dense and laplace)
    return MetricPlan(bool(dense), bool(pooled), bool(estimate))


# ---------------------------------------------------------------------- together
class WindowState(NamedTuple):
    """The warm-up state: the current ``step_size`` ``[C]`` and ``metric`` (what a transition
    uses), the estimators' states and the warm-up ``iteration`` count."""

    step_size: torch.Tensor
    metric: Metric
    dual_averaging: DualAveragingState
    welford: WelfordState
    iteration: int


def window_adaptation(
    num_warmup: int,
    target_accept: float,
    *,
    dense: bool = False,
    pooled: bool = False,
    adapt_step_size: bool = True,
    adapt_mass: bool = True,
    find_step_size: Callable,
) -> tuple[Adaptation, list]:
    """Stan's windowed adaptation of the step size and the metric, and its windows.

    ``find_step_size(state, step_size, metric) -> step_size`` re-initialises the step size
    (:func:`find_step_size` with the potential and generator bound).

    * ``init(state, step_size [C], metric=None) -> WindowState``: ``metric`` (e.g. from the curvature at
      the start, :mod:`inference.mcmc.initial_metric`), the identity by default; step size from
      ``find_step_size`` when it is adapted and there is a warm-up.
    * ``update(ws, state, info) -> WindowState`` after every warm-up transition, with the
      chains' new ``state`` (z, log π, ∇ log π) and the transition's ``info["accept_prob"]``.
    * ``final(ws) -> WindowState`` at the end of warm-up: the step size becomes ε̄.
    """
    step_adapt, mass_adapt = dual_averaging(target_accept), welford_covariance(dense)
    windows = adaptation_windows(num_warmup) if adapt_mass else []
    window_ends = {end for _, end in windows}

    def init(state, step_size: torch.Tensor, metric: Optional[Metric] = None) -> WindowState:
        num_chains, dim = state.z.shape
        metric = identity_metric(num_chains, dim, dense, like=state.z) if metric is None else metric
        step_size = step_size.to(state.z.device)
        if adapt_step_size and num_warmup > 0:
            step_size = find_step_size(state, step_size, metric)
        return WindowState(step_size, metric, step_adapt.init(step_size), mass_adapt.init(num_chains, dim, state.z), 0)

    def update(ws: WindowState, state, info: dict) -> WindowState:
        it, step_size, metric, da, welford = ws.iteration, ws.step_size, ws.metric, ws.dual_averaging, ws.welford
        if adapt_step_size:
            da = step_adapt.update(da, info["accept_prob"])
            step_size = da.log_step.exp()
        if any(start <= it < end for start, end in windows):
            welford = mass_adapt.update(welford, state.z)
        if it + 1 in window_ends:
            metric = euclidean_metric(mass_adapt.final(welford, pooled))
            welford = mass_adapt.init(*state.z.shape, state.z)
            if adapt_step_size:
                step_size = find_step_size(state, step_size, metric)
                da = step_adapt.init(step_size)
        return WindowState(step_size, metric, da, welford, it + 1)

    def final(ws: WindowState) -> WindowState:
        return ws._replace(step_size=step_adapt.final(ws.dual_averaging)) if adapt_step_size else ws

    return Adaptation(init, update, final), windows
