"""The SG-MCMC fits stacked (inference.sgmcmc.fit.fit_sgmcmc_stacked, through fit_many): their MAP starts as one
program, then each fit's own chains, against one-at-a-time fits."""
import pytest
import torch
from torch import nn

from tests.inference.conftest import K, _data, _model
from inference import fit
from inference.fitting import fit_many
from zoo import GaussianLikelihood
from zoo.bnn import BayesianNetwork


@pytest.mark.parametrize("backend,stochastic", [("sgld", "all"), ("sghmc", "all")])
def test_sgmcmc_fits_stack_their_map_starts_then_run_their_own_chains(backend, stochastic):
    """The samplers' MAP starts train as one program, each equal to its fit's own start; the chains from there
    are the one-at-a-time fit's (draws and default step size to float rounding).  (A last-layer model's start
    chooses its body's epochs on its own held-out rows and is not stacked: tests/inference/optim/test_start.py.)"""
    def model(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return BayesianNetwork(net, stochastic=stochastic, likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)

    options = dict(map_steps=100, num_samples=30, warmup_steps=30, num_chains=2)
    data = [_data(k) for k in range(K)]
    bnns = [model(k) for k in range(K)]
    fits = fit_many(bnns, [d[0] for d in data], [d[1] for d in data], backend=backend, seeds=[10, 11, 12], **options)
    for k, posterior in enumerate(fits):
        alone = model(k)
        single = fit(alone, *data[k], backend=backend, seed=10 + k, progress=False, **options)
        for name, value in single.draws.items():
            torch.testing.assert_close(posterior.draws[name], value, atol=1e-4, rtol=1e-4)
        assert posterior.info["step_size_rule"]["step_size"] == pytest.approx(
            single.info["step_size_rule"]["step_size"], rel=1e-4)
        assert posterior.info["multifit"] == {"fits": K, "index": k} and posterior.info["map_steps"] == single.info["map_steps"]
        for ours, theirs in zip(bnns[k].net.parameters(), alone.net.parameters()):
            torch.testing.assert_close(ours.detach(), theirs.detach(), atol=1e-5, rtol=1e-5)


def test_a_sampler_without_a_map_start_is_not_stacked():
    data = [_data(k) for k in range(2)]
    with pytest.raises(ValueError, match="no MAP start to stack"):
        fit_many([_model(k) for k in range(2)], [d[0] for d in data], [d[1] for d in data], backend="sgld",
                 init="current", num_samples=5, warmup_steps=5)
