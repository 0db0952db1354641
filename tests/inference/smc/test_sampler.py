"""Tempered SMC against known answers: the weights of a well separated two-mode mixture, the conjugate Bayesian
linear regression (posterior moments and the log evidence in closed form), and the tempering schedule."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributions import MultivariateNormal

from inference.smc import SMCConfig, build_smc, run_smc, smc_posterior
from tests.inference.conftest import flat_linear_draws, make_conjugate_regression
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior

PRIOR_SD = 4.0
MODES = torch.tensor([[-5.0, -5.0], [5.0, 5.0]])
MODE_WEIGHTS = torch.tensor([0.3, 0.7])
MODE_SD = 0.5


def mixture_target(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log prior, log 'likelihood')`` ``[N]`` of a N(0, 4² I) prior and a 'likelihood' ℓ = log mixture − log prior,
    so that π₁ is the mixture 0.3 N((−5, −5), 0.5² I) + 0.7 N((5, 5), 0.5² I): modes 20 sd apart."""
    log_prior = (-0.5 * (z / PRIOR_SD) ** 2 - math.log(PRIOR_SD) - 0.5 * math.log(2 * math.pi)).sum(-1)
    components = (-0.5 * ((z.unsqueeze(-2) - MODES) / MODE_SD) ** 2 - math.log(MODE_SD) - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_mixture = torch.logsumexp(components + MODE_WEIGHTS.log(), -1)
    return log_prior, log_mixture - log_prior


def test_smc_recovers_the_weights_of_two_separated_modes():
    """A HMC chain started in one mode never sees the other (the barrier is ~50 nats); SMC from the prior weighs
    them 0.3 / 0.7.  Tolerance: 5 sd of the share in N i.i.d. draws, inflated ×2 for the runs' correlated particles."""
    num = 2000
    generator = torch.Generator().manual_seed(0)
    init, step = build_smc(mixture_target, num_moves=3, num_leapfrog=8)
    run = run_smc(init, step, PRIOR_SD * torch.randn(num, 2, generator=generator), generator, progress=False)
    share = float((run.z[:, 0] < 0).double().mean())
    assert share == pytest.approx(0.3, abs=2 * 5 * math.sqrt(0.21 / num))
    near = (run.z - MODES[(run.z[:, 0] > 0).long()]).norm(dim=-1)
    assert float(near.max()) < 8 * MODE_SD  # every particle sits in a mode
    assert run.log_evidence == pytest.approx(0.0, abs=0.3)  # π₁ = mixture × 1 is normalised: Z = 1


def _linear_bnn(data, dtype=torch.float32):
    torch.manual_seed(0)
    net = nn.Linear(data.x.shape[1], 1).to(dtype)
    return BayesianNetwork(net, "all", NormalPrior(data.prior_sd), GaussianLikelihood(noise_sd=data.noise_sd),
                           output_dim=1)


def log_evidence(data) -> float:
    """log p(y) = log N(y; 0, σ² I + σ_p² Φ Φᵀ), Φ = [X, 1] (the weights integrated out)."""
    phi = torch.cat([data.x, torch.ones(len(data.x), 1)], 1).double()
    cov = data.noise_sd**2 * torch.eye(len(phi), dtype=torch.float64) + data.prior_sd**2 * phi @ phi.T
    return float(MultivariateNormal(torch.zeros(len(phi), dtype=torch.float64), cov).log_prob(data.y.double().squeeze(-1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_smc_matches_the_conjugate_regression_posterior_and_evidence(dtype):
    data = make_conjugate_regression(n=40, d=2, prior_sd=1.0)
    num = 2000
    config = SMCConfig(num_particles=num, num_moves=4, num_leapfrog=8)
    post = smc_posterior(_linear_bnn(data, dtype), data.x.to(dtype), data.y.to(dtype), config, seed=4, progress=False)
    draws = flat_linear_draws(post.draws).double()
    assert draws.shape == (num, 3) and post.draws["weight"].dtype == dtype
    ess = num * 0.5  # resampled to ESS ≥ ρ N at the last stage, then moved: at least ρ N effective draws
    sd = data.post_sd.double()
    assert bool(((draws.mean(0) - data.post_mean.double()).abs() < 5 * sd / math.sqrt(ess)).all())
    assert bool(((draws.std(0) / sd - 1).abs() < 5 * math.sqrt(1 / (2 * ess))).all())
    # Var(log Ẑ) ≈ Σ_t (N / ESS_t − 1) / N for well-mixed moves (Chopin 2004's asymptotic variance, mixing perfectly)
    info = post.info
    evidence_sd = math.sqrt(sum(num / e - 1 for e in info["ess"]) / num)
    assert info["log_evidence"] == pytest.approx(log_evidence(data), abs=5 * evidence_sd)


def test_the_schedule_keeps_the_conditional_ess_at_its_target_and_ends_at_one():
    data = make_conjugate_regression(n=40, d=2)
    num = 500
    post = smc_posterior(_linear_bnn(data), data.x, data.y, SMCConfig(num_particles=num, target_ess=0.6, num_moves=1),
                         seed=0, progress=False)
    betas, ess = post.info["betas"], post.info["ess"]
    assert betas[-1] == 1.0 and all(b1 > b0 for b0, b1 in zip(betas, betas[1:])) and betas[0] > 0
    assert len(betas) == post.info["num_stages"] >= 3
    assert all(e / num == pytest.approx(0.6, abs=1e-4) for e in ess[:-1])  # bisection to the target
    assert ess[-1] / num >= 0.6 - 1e-4 and post.info["final_ess"] == ess[-1]
    again = smc_posterior(_linear_bnn(data), data.x, data.y, SMCConfig(num_particles=num, target_ess=0.6, num_moves=1),
                          seed=0, progress=False)
    assert torch.equal(again.draws["weight"], post.draws["weight"])  # one seed fixes every draw


def test_a_run_that_cannot_reach_beta_one_stops_with_an_error():
    data = make_conjugate_regression(n=40, d=2)
    with pytest.raises(RuntimeError, match="after max_stages = 2 stages"):
        smc_posterior(_linear_bnn(data), data.x, data.y, SMCConfig(num_particles=50, num_moves=1, max_stages=2),
                      seed=0, progress=False)
