"""Devices and dtypes: ``fit(..., device=...)``, ``--device``, and a float64 network end to end (on CPU)."""
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from inference.fitting import fit, resolve_device
from lab.cli import main
from zoo.bnn import BayesianNetwork
from zoo.likelihoods import CategoricalLikelihood, GaussianLikelihood
from zoo.priors import PretrainedNormalPrior

SVI = {"epochs": 3, "batch_size": 8, "num_samples": 6, "progress": False}


def _data(n=20):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=generator)
    return x, x[:, :1].sin() + 0.1 * torch.randn(n, 1, generator=generator)


def _bnn(x, **kwargs):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 1))
    return BayesianNetwork(net, "all", likelihood=GaussianLikelihood(learn_noise=True), example_input=x, **kwargs)


def test_fit_on_cpu_device_and_device_errors():
    x, y = _data()
    bnn = _bnn(x)
    posterior = fit(bnn, x, y, device="cpu", **SVI)
    assert next(bnn.parameters()).device.type == "cpu"
    assert posterior.predict(x, seed=0).f.device.type == "cpu"
    for bad in ("banana", "tpu", 3.5):
        with pytest.raises(ValueError, match="device"):
            fit(bnn, x, y, device=bad, **SVI)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available"):
            resolve_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="not available"):
            resolve_device("mps")


def test_double_converts_priors_latents_sites_and_target_scaling():
    x, _ = _data()
    bnn = _bnn(x, target_loc=torch.tensor([1.0]), target_scale=torch.tensor([2.0]))
    bnn.net[2].weight.requires_grad_(False)
    bnn.to(torch.float64)
    for name, prior in bnn.prior_distributions().items():
        assert prior.sample().dtype == torch.float64, name
    assert bnn.target_loc.dtype == bnn.target_scale.dtype == torch.float64
    assert all(s.reference.dtype == torch.float64 for s in bnn.sites)
    centred = BayesianNetwork(nn.Linear(2, 1).double(), "all", prior=PretrainedNormalPrior(), output_dim=1)
    assert centred.prior_distributions()["weight"].mean.dtype == torch.float64
    assert centred.target_scale.dtype == torch.float64  # the buffers take the network's dtype


def test_float64_network_fits_with_svi_end_to_end():
    x, y = _data()
    bnn = _bnn(x).double()
    posterior = fit(bnn, x, y, **SVI)  # float32 data follow the model's dtype
    draws = posterior.sample_params(4, seed=0)
    assert all(v.dtype == torch.float64 for v in draws.values())
    prediction = posterior.predict(x, y=y, seed=0)
    assert prediction.f.dtype == prediction.y.dtype == torch.float64
    assert torch.isfinite(prediction.log_lik).all()


@pytest.mark.filterwarnings("ignore:nuts:RuntimeWarning")  # a 30-iteration run only checks the dtypes
def test_float64_network_fits_with_nuts_end_to_end():
    x, y = _data(12)
    bnn = _bnn(x).double()
    posterior = fit(bnn, x, y, backend="nuts", num_chains=2, warmup_steps=20, num_samples=10, compile=False,
                    init="current", max_tree_depth=4, progress=False)
    assert all(v.dtype == torch.float64 for v in posterior.draws.values())
    assert posterior.sample_stats["step_size"].dtype == torch.float64  # the adapted state followed the chains
    assert posterior.predict(x, seed=0).f.dtype == torch.float64


def test_float64_classifier_with_a_data_loader():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(24, 2, generator=generator)
    labels = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    bnn = BayesianNetwork(nn.Linear(2, 2), "all", likelihood=CategoricalLikelihood(), output_dim=2).double()
    loader = DataLoader(TensorDataset(x, labels), batch_size=8)
    posterior = fit(bnn, loader, epochs=2, num_samples=5, progress=False)
    prediction = posterior.predict(x.double(), y=labels, seed=0)
    assert prediction.f.dtype == torch.float64 and prediction.y.dtype == torch.int64


def test_cli_device_flag_and_backend_options_in_help(capsys):
    result = subprocess.run([sys.executable, "-m", "zoo", "fit", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "--device" in result.stdout and "examples:" in result.stdout
    assert "max_tree_depth=10" in result.stdout.replace("\n", " ").replace("  ", " ")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data", "toy1d", "--device", "tpu", "--out", "unused"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
