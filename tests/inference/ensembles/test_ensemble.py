"""The ``ensemble`` backend (deep ensembles): members that differ and mix, shared deterministic parameters,
workers and Ray, bad options, and the members in a run's metrics."""
from __future__ import annotations

import pytest
import torch

from inference import load_posterior
from inference.fitting import fit
from inference.posterior import member_posteriors
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import GaussianLikelihood

OPTIONS = dict(epochs=15, batch_size=16, progress=False)


def _data(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 2, n).unsqueeze(1)
    return x, torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g)


def _bnn(stochastic="all", hidden=8):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
    return BayesianNetwork(net, stochastic=stochastic, likelihood=GaussianLikelihood(learn_noise=True), output_dim=1)


def test_members_differ_and_mix(tmp_path):
    x, y = _data()
    posterior = fit(_bnn(), x, y, backend="ensemble", seed=0, num_members=3, **OPTIONS)
    assert posterior.num_chains == 3 and posterior.default_num_samples == 3
    weights = posterior.draws["0.weight"][:, 0]  # [K, hidden, 1]
    assert all((weights[i] - weights[j]).abs().max() > 0.1 for i in range(3) for j in range(i))
    assert posterior.draws["noise_precision"].unique().numel() == 3  # noise learned per member
    # member 0 is the MAP fit of the same seed (to float rounding: the members train as one stacked program)
    single = fit(_bnn(), x, y, backend="map", seed=0, **OPTIONS)
    for k in single.draws:
        torch.testing.assert_close(posterior.draws[k][0], single.draws[k][0], atol=1e-5, rtol=1e-5)
    # the mixture's predictive variance is at least the members' mean predictive variance
    x_test = torch.linspace(-4, 4, 33).unsqueeze(1)
    mixture = posterior.predict(x_test, seed=0)
    member_var = torch.stack([member.predict(x_test, seed=0).sd ** 2 for member in member_posteriors(posterior)])
    assert bool((mixture.sd**2 >= member_var.mean(0) - 1e-6).all())
    assert float((mixture.sd**2 - member_var.mean(0)).mean()) > 1e-3  # and strictly above where members disagree
    loaded = load_posterior(posterior.save(tmp_path / "ensemble"))
    assert torch.equal(loaded.predict(x_test, seed=2).f, posterior.predict(x_test, seed=2).f)


def test_shared_deterministic_parameters():
    """With a partially stochastic net, member 0 fits the deterministic layer and the others keep it."""
    x, y = _data()
    bnn = _bnn(stochastic="last")
    posterior = fit(bnn, x, y, backend="ensemble", seed=0, num_members=2, **OPTIONS)
    assert set(posterior.draws) == {"2.weight", "2.bias", "noise_precision"}
    assert all(p.requires_grad for p in bnn.deterministic_parameters())  # unfrozen again after the fit
    assert (posterior.draws["2.weight"][0] - posterior.draws["2.weight"][1]).abs().max() > 1e-2


@pytest.mark.slow  # starting spawned workers (each imports torch and pyro) takes ~10-25 s on a busy machine
def test_worker_processes_reproduce_the_sequential_fit():
    x, y = _data(24)
    sequential = fit(_bnn(), x, y, backend="ensemble", seed=0, num_members=2, epochs=5, progress=False)
    parallel = fit(_bnn(), x, y, backend="ensemble", seed=0, num_members=2, epochs=5, workers=2, progress=False)
    assert all(torch.equal(sequential.draws[k], parallel.draws[k]) for k in sequential.draws)


@pytest.mark.slow  # starting a local Ray instance and its workers takes ~20-60 s on a busy machine
def test_ray_tasks_reproduce_the_sequential_fit():
    x, y = _data(24)
    sequential = fit(_bnn(), x, y, backend="ensemble", seed=0, num_members=2, epochs=5, progress=False)
    on_ray = fit(_bnn(), x, y, backend="ensemble", seed=0, num_members=2, epochs=5, workers=2, executor="ray",
                 progress=False)
    assert all(torch.equal(sequential.draws[k], on_ray.draws[k]) for k in sequential.draws)
    assert not torch.equal(on_ray.draws["0.weight"][0], on_ray.draws["0.weight"][1])


@pytest.mark.parametrize("options, message", [
    ({"num_members": 0}, r"num_members \(K\) must be at least 1"),
    ({"workers": 0}, "workers must be at least 1"),
    ({"executor": "dask"}, "unknown executor 'dask'; valid: local, ray"),
    ({"num_members": 2.5}, "must be an integer"),
])
def test_bad_options(options, message):
    x, y = _data(8)
    with pytest.raises(ValueError, match=message):
        fit(_bnn(), x, y, backend="ensemble", progress=False, **options)


def test_run_metrics_hold_the_members(tmp_path):
    from lab.runs.spec import RunSpec
    from lab.runs.execution import execute

    spec = RunSpec(data="toy1d", backend="ensemble", hidden=[8], epochs=5, backend_options={"num_members": 2})
    result = execute(spec, tmp_path / "run", progress=False)
    members = result.metrics["members"]
    assert members["num_members"] == 2 and len(members["per_member"]) == 2
    assert members["mixture"]["test_ll"] == pytest.approx(result.metrics["test_ll"])
    assert result.metrics["member_disagreement"] == members["disagreement"]
    assert result.idata.posterior.sizes["chain"] == 2  # members as ArviZ chains
