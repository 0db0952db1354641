"""The SG-MCMC stability rule (inference.sgmcmc.stability): the start jitter, the collapse check, the
step back-off, and the backends' use of them (docs/mcmc.md, "SG-MCMC step sizes")."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.inference.conftest import make_conjugate_regression
from inference import fit
from inference.mcmc.driver import ChainRun
from inference.optim.potential import Potential
from inference.sgmcmc.stability import (
    BACKOFF_FACTOR, COLLAPSE_WINDOW, CollapseCheck, SamplerDivergedError, backed_off_runs, collapse_check,
    start_jitter,
)  # fmt: skip
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior


def linear_bnn(data):
    return BayesianNetwork(data.net(), "all", NormalPrior(data.prior_sd), GaussianLikelihood(data.noise_sd), output_dim=1)


def test_start_jitter_is_at_most_the_stiffest_posterior_sd():
    assert start_jitter(0.01, 100.0) == 0.01  # 2/√100 = 0.2 > 0.01
    assert start_jitter(0.01, 1e8) == pytest.approx(2e-4)
    assert start_jitter(0.01, 0.0) == 0.01 and start_jitter(0.01, math.inf) == 0.01


def _states(values):
    return [SimpleNamespace(log_density=torch.tensor(v, dtype=torch.float64)) for v in values]


def test_collapse_check_compares_the_window_mean_with_the_start():
    check = CollapseCheck(reference=0.0, threshold=100.0, window=4)
    # one bad step inside a window whose mean stays above -100 is not a collapse
    assert not any(check(t, s) for t, s in enumerate(_states([[-10.0, -5.0], [-300.0, -5.0], [-10.0, -5.0], [-10.0, -5.0]])))
    fresh = check.fresh()
    seen = [fresh(t, s) for t, s in enumerate(_states([[-10.0, -5.0]] * 3 + [[-10.0, -500.0]] * 3))]
    # chain 1's first full window [−5, −5, −5, −500] has mean −128.75 < −100: a collapse at step index 3
    assert seen == [False, False, False, True, True, True]
    assert "chain 1" in fresh.reason and "steps 3-6" in fresh.reason


def test_collapse_threshold_from_the_dimension_the_minibatch_noise_and_the_reference_rows():
    data = make_conjugate_regression(n=100)
    potential = Potential(linear_bnn(data), data.x, data.y)
    z0 = torch.zeros(potential.dim)
    full = collapse_check(potential, z0, potential.x, potential.y, batch_ratio=1.0)
    assert full.threshold == pytest.approx(10.0 * potential.dim / 2)  # no minibatch noise: 5 D
    assert full.reference == pytest.approx(float(potential.log_density(z0.unsqueeze(0))), rel=1e-6)
    mini = collapse_check(potential, z0, potential.x, potential.y, batch_ratio=10.0)  # n = 10 of N = 100
    per_row = linear_bnn(data).log_likelihood(potential.unpack(z0.unsqueeze(0))[0], data.x, data.y).reshape(-1).double()
    noise = 100 * float(per_row.std(unbiased=False)) * math.sqrt(1 - 0.1) / math.sqrt(10) / math.sqrt(COLLAPSE_WINDOW)
    assert mini.threshold == pytest.approx(full.threshold + 5 * noise, rel=1e-6)
    # the reference on m = 20 of the N = 100 rows carries its own sampling error σ_0, added in quadrature
    part = collapse_check(potential, z0, potential.x[:20], potential.y[:20], batch_ratio=10.0)
    s20 = float(per_row[:20].std(unbiased=False))
    window, reference = (100 * s20 * math.sqrt(1 - 0.1) / math.sqrt(10) / math.sqrt(COLLAPSE_WINDOW),
                         100 * s20 * math.sqrt(1 - 0.2) / math.sqrt(20))
    assert part.threshold == pytest.approx(full.threshold + 5 * math.hypot(window, reference), rel=1e-6)


def _run(stopped_at, num_kept=0):
    return ChainRun(None, {}, num_kept, None, None, 0, 0.0, 0.0, stopped_at)


def test_backed_off_runs_divide_the_step_until_it_is_stable():
    limit = 1e-3
    tried = []

    def run(step):
        tried.append(step)
        return (_run(5) if step > limit else _run(None, 10)), "diverged"

    with pytest.warns(RuntimeWarning, match="restarting from the starts with step size"):
        attempt, reason, step, record = backed_off_runs(run, 0.05, 8, "sgld")
    assert attempt.stopped_at is None and step == pytest.approx(0.05 / BACKOFF_FACTOR ** 3) and step < limit
    assert [r["step_size"] for r in record] == pytest.approx(tried[:-1]) and len(record) == 3
    assert all(r["diverged_at_step"] == 6 and r["reason"] == "diverged" for r in record)
    # out of back-offs: the last (stopped) attempt comes back; a divergence after a kept draw is not backed off
    with pytest.warns(RuntimeWarning):
        attempt, _, step, record = backed_off_runs(run, 0.05, 2, "sgld")
    assert attempt.stopped_at == 5 and len(record) == 2
    attempt, _, step, record = backed_off_runs(lambda s: (_run(7, num_kept=3), "late"), 0.05, 8, "sgld")
    assert attempt.stopped_at == 7 and record == [] and step == 0.05


def test_a_step_far_above_the_stability_limit_is_backed_off_and_the_run_completes(conjugate_regression):
    """SGLD on the conjugate posterior (largest precision eigenvalue λ) is unstable for ε > 4/λ; a step
    30× that limit overflows, and the back-off divides it by 4 until it is below the limit."""
    data = conjugate_regression
    largest = float(torch.linalg.eigvalsh(torch.linalg.inv(data.post_cov.double())).max())
    options = dict(batch_size=None, init="current", num_chains=2, warmup_steps=200, num_samples=50, thin=1,
                   step_decay=0.0)
    with pytest.warns(RuntimeWarning, match="before the first kept draw"):
        post = fit(linear_bnn(data), data.x, data.y, backend="sgld", seed=0, progress=False,
                   step_size=30 * 4 / largest, **options)
    backoffs = post.info["step_size_backoffs"]
    assert 1 <= len(backoffs) <= 3 and post.info["config"]["step_size"] < 4 / largest
    assert post.info["config"]["step_size"] == pytest.approx(30 * 4 / largest / BACKOFF_FACTOR ** len(backoffs))
    assert bool(torch.isfinite(post.sample_stats["lp"]).all())
    with pytest.raises(SamplerDivergedError, match="max_backoffs") as caught:
        fit(linear_bnn(data), data.x, data.y, backend="sgld", seed=0, progress=False, step_size=30 * 4 / largest,
            max_backoffs=0, **options)
    assert caught.value.posterior is not None and caught.value.step_size == pytest.approx(30 * 4 / largest)


def test_max_backoffs_is_checked():
    data = make_conjugate_regression()
    with pytest.raises(ValueError, match="max_backoffs must be non-negative"):
        fit(linear_bnn(data), data.x, data.y, backend="sgld", seed=0, progress=False, max_backoffs=-1)
