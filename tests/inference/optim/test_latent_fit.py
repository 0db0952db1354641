"""The likelihood's latents at their optimum for fixed network outputs (inference/optim/latent_fit.py)."""
from __future__ import annotations

import torch

from inference.optim.latent_fit import fit_latents, fit_predictive_latents
from zoo import GaussianLikelihood

LIKELIHOOD = GaussianLikelihood(learn_noise=True, precision_concentration=2.0, precision_rate=0.5)


def _outputs(n=400, draws=50, spread=0.5):
    g = torch.Generator().manual_seed(0)
    f = torch.randn(n, 1, generator=g)
    y = f + 0.3 * torch.randn(n, 1, generator=g)
    return f, y, f + spread * torch.randn(draws, n, 1, generator=g)  # draws around the mean outputs


def _objective(f_draws, y, precision):
    """Σ_n log (1/S) Σ_s N(y_n | f_sn, 1/τ) + log Gamma(τ | 2, 0.5), in float64."""
    latents = {"noise_precision": torch.tensor([[precision]], dtype=torch.float64)}
    log_lik = LIKELIHOOD.log_prob(f_draws.double(), y.double(), latents)
    prior = LIKELIHOOD.latent_priors(1, dtype=torch.float64)["noise_precision"]
    return float((log_lik.logsumexp(0) - torch.log(torch.tensor(float(f_draws.shape[0])))).sum()
                 + prior.log_prob(latents["noise_precision"][0]))


def test_identical_draws_give_the_closed_form_map():
    f, y, _ = _outputs()
    start = {"noise_precision": torch.ones(1)}
    fitted = fit_predictive_latents(LIKELIHOOD, f.expand(7, -1, -1), y, start)["noise_precision"]
    exact = (2.0 - 1 + 400 / 2) / (0.5 + ((y - f) ** 2).sum(0) / 2)
    torch.testing.assert_close(fitted, exact, rtol=1e-5, atol=0)
    torch.testing.assert_close(fitted, fit_latents(LIKELIHOOD, f, y, start)["noise_precision"], rtol=1e-5, atol=0)


def test_a_spread_mixture_gets_the_precision_that_maximises_its_predictive_density():
    """The draws' own spread (sd 0.5 around outputs 0.3 from the targets) already widens the mixture: the
    fitted noise is smaller than the one fitted to any single draw's residuals, and it is the optimum of
    the mixture's log density plus the log prior (larger or smaller precisions score lower)."""
    f, y, draws = _outputs()
    start = {"noise_precision": torch.ones(1)}
    tau = float(fit_predictive_latents(LIKELIHOOD, draws, y, start)["noise_precision"])
    single = float(fit_latents(LIKELIHOOD, draws[0], y, start)["noise_precision"])
    assert tau > 1.5 * single
    best = _objective(draws, y, tau)
    for factor in (0.9, 0.97, 1.03, 1.1):
        assert _objective(draws, y, tau * factor) < best
