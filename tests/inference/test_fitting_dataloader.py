"""``fit(bnn, loader, backend=...)``: a DataLoader feeds the minibatch backends batch by batch.

A loader that replays the tensor path's shuffles gives exactly the tensor fit (the SVI family,
map, mc-dropout; SG-MCMC with one full batch, since its tensor shuffles share the generator of
the chains' noise); SGLD from a fixed-order minibatch loader recovers the conjugate posterior;
full-batch backends, extra ``y`` / ``batch_size`` and bad batches are clear errors."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

from zoo.bnn import BayesianNetwork
from zoo.likelihoods import CategoricalLikelihood, GaussianLikelihood
from zoo.priors import NormalPrior

from inference import fit
from inference.backends import loader_backends
from inference.optim.batches import minibatches
from tests.inference.conftest import flat_linear_draws


def _bnn(likelihood=None, out=1):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, out))
    return BayesianNetwork(net, "all", likelihood=likelihood or GaussianLikelihood(learn_noise=True), output_dim=out)


def _data(n=50):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, :1] - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g)


class ReplayShuffles(Sampler):
    """Batches of indices in the order the tensor path draws them (same seed, same generator use)."""

    def __init__(self, num_data, batch_size, seed):
        self.num_data, self.batch_size = num_data, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self):
        return (index.tolist() for index in minibatches(self.num_data, self.batch_size, self.generator))

    def __len__(self):
        return -(-self.num_data // self.batch_size)


def _tensor_and_replayed_loader_fits(backend, epochs, **options):
    """The same fit on tensors (batches of 16, seed 3) and on a DataLoader replaying those batches."""
    x, y = _data()
    by_tensors = fit(_bnn(), x, y, backend=backend, seed=3, progress=False, epochs=epochs, batch_size=16, **options)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=ReplayShuffles(50, 16, seed=3))
    by_loader = fit(_bnn(), loader, backend=backend, seed=3, progress=False, epochs=epochs, **options)
    return by_tensors, by_loader


@pytest.mark.parametrize("backend, options", [
    ("svi", {"pretrain_epochs": 2}),  # fused ELBO path; pretraining reads the same batches
    ("svi", {"elbo_path": "pyro-trace"}),
    ("graves", {}),
])
def test_loader_with_the_same_batches_gives_the_tensor_fit_exactly(backend, options):
    x, y = _data()
    by_tensors, by_loader = _tensor_and_replayed_loader_fits(backend, epochs=3, **options)
    assert by_loader.info["history"]["loss"] == by_tensors.info["history"]["loss"]
    assert torch.equal(by_loader.predict(x, num_samples=5, seed=1).f, by_tensors.predict(x, num_samples=5, seed=1).f)
    assert by_loader.info["num_data"] == 50 and by_loader.info["data_loader"]["batches_per_epoch"] == 4


def test_shuffling_loader_fit_is_reproducible_and_learns():
    x, y = _data()
    labels = (x[:, 0] > 0).long()

    def run():
        loader = DataLoader(TensorDataset(x, labels), batch_size=20, shuffle=True)
        return fit(_bnn(CategoricalLikelihood(), out=2), loader, backend="svi-lrt", seed=0, progress=False, epochs=40)

    first, second = run(), run()
    assert first.info["history"]["loss"] == second.info["history"]["loss"]
    assert first.info["num_data"] == 50 and first.info["data_loader"] == {"batches_per_epoch": 3, "batch_size": 20}
    accuracy = (first.predict(x, num_samples=20, seed=0).mean.argmax(-1) == labels).float().mean()
    assert accuracy > 0.85


def test_backends_that_need_full_batches_say_which_accept_a_loader():
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    accepted = loader_backends()
    assert {"svi", "svi-lrt", "graves", "sparse-vd", "kingma-vd", "radial", "sgld", "psgld", "sghmc", "csgmcmc",
            "map", "ensemble", "mc-dropout"} <= set(accepted)
    for backend in ("nuts", "hmc", "laplace"):
        with pytest.raises(ValueError, match=f"backend '{backend}' needs the full training set.*" + ", ".join(accepted)):
            fit(_bnn(), loader, backend=backend, progress=False)


def test_bad_loader_calls_and_batches_are_clear_errors():
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    with pytest.raises(ValueError, match="without y"):
        fit(_bnn(), loader, y, progress=False)
    with pytest.raises(ValueError, match="drop batch_size"):
        fit(_bnn(), loader, progress=False, batch_size=10)
    with pytest.raises(ValueError, match="y is missing"):
        fit(_bnn(), x, progress=False)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(zip(x, y))

    with pytest.raises(ValueError, match="map-style dataset"):
        fit(_bnn(), DataLoader(Stream(), batch_size=10), progress=False, epochs=1)
    triples = DataLoader(TensorDataset(x, y, y), batch_size=10)
    with pytest.raises(ValueError, match=r"DataLoader batch 0 is a list; a batch must be a pair"):
        fit(_bnn(), triples, progress=False, epochs=1)
    bad = y.clone()
    bad[23] = float("nan")
    with pytest.raises(ValueError, match="DataLoader batch 2: .*y"):
        fit(_bnn(), DataLoader(TensorDataset(x, bad), batch_size=10), progress=False, epochs=1)


@pytest.mark.parametrize("backend, options", [
    ("map", {}),
    ("mc-dropout", {"num_samples": 4}),  # its dropout masks come from the global stream the loader must not move
])
def test_map_family_loader_with_the_same_batches_gives_the_tensor_fit(backend, options):
    by_tensors, by_loader = _tensor_and_replayed_loader_fits(backend, epochs=4, **options)
    assert by_loader.info["history"]["loss"] == by_tensors.info["history"]["loss"]
    for name, value in by_tensors.draws.items():
        assert torch.equal(by_loader.draws[name], value), name
    assert by_loader.info["num_data"] == 50 and by_loader.info["data_loader"]["batches_per_epoch"] == 4


def test_ensemble_reads_a_loader_in_process():
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    post = fit(_bnn(), loader, backend="ensemble", seed=0, progress=False, epochs=3, num_members=2)
    assert post.draws["0.weight"].shape[:2] == (2, 1) and post.info["num_data"] == 50
    assert not torch.equal(post.draws["0.weight"][0], post.draws["0.weight"][1])  # members start apart
    with pytest.raises(ValueError, match="use workers=1"):
        fit(_bnn(), loader, backend="ensemble", progress=False, epochs=1, num_members=2, workers=2)


def _linear(data):
    return BayesianNetwork(data.net(), "all", NormalPrior(data.prior_sd), GaussianLikelihood(data.noise_sd), output_dim=1)


@pytest.mark.parametrize("backend", ["sgld", "sghmc"])
def test_sgmcmc_full_batch_loader_gives_the_tensor_fit(conjugate_regression, backend):
    data = conjugate_regression
    options = {"num_chains": 2, "warmup_steps": 20, "num_samples": 30, "thin": 2, "map_steps": 25}
    by_tensors = fit(_linear(data), data.x, data.y, backend=backend, seed=2, progress=False, batch_size=None, **options)
    loader = DataLoader(TensorDataset(data.x, data.y), batch_size=len(data.x))
    by_loader = fit(_linear(data), loader, backend=backend, seed=2, progress=False, **options)
    # the tensor path's MAP start runs Adam as one fused step function, the loader's through
    # torch.optim.Adam: the same iterates up to float rounding, hence a tolerance, not equality
    assert by_loader.info["init_log_density"] == pytest.approx(by_tensors.info["init_log_density"], rel=1e-5)
    for name, value in by_tensors.draws.items():
        torch.testing.assert_close(by_loader.draws[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_sgld_from_a_fixed_order_loader_recovers_the_conjugate_posterior(conjugate_regression):
    """The settings and tolerances of test_sgmcmc's tensor minibatch SGLD test (batches of 10 of 40)."""
    data = conjugate_regression
    loader = DataLoader(TensorDataset(data.x, data.y), batch_size=10)
    post = fit(_linear(data), loader, backend="sgld", seed=1, progress=False, init="map", map_steps=200,
               num_chains=4, warmup_steps=300, num_samples=3000, thin=1, step_size=1e-3, step_decay=0.0)
    draws = flat_linear_draws(post.sample_params())
    assert ((draws.mean(0) - data.post_mean).abs() / data.post_sd).max() < 0.2
    assert ((draws.std(0) / data.post_sd) - 1).abs().max() < 0.25  # minibatch noise adds O(ε) variance
    assert post.info["num_data"] == 40 and post.info["data_loader"] == {"batches_per_epoch": 4, "batch_size": 10}

