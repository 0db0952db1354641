"""On a CUDA device: every backend fits, predicts and exports there, and the exact ones still
recover the conjugate posterior.  Skipped on machines without CUDA (CI); run on a GPU machine
with ``python -m pytest -q tests/inference/backends/test_cuda.py``.

Everything the user hands over lives on the CPU (data, network): ``fit(..., device="cuda")``
moves the network, and every tensor a posterior returns must be on the device the network is on.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.inference.conftest import flat_linear_draws
from inference.backends import BACKENDS
from inference.fitting import fit
from inference.variational.pruning import prune
from tests.inference.backends.test_backends_x_likelihoods import TINY, check_tiny_fit, tiny_problem
from tests.inference.mcmc.test_hmc import assert_matches, linear_bnn, rhat_max
from zoo import BayesianNetwork
from zoo.architectures import MLP
from zoo.likelihoods import make_likelihood

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

LIKELIHOODS = {"gaussian": {"learn_noise": True}, "studentt": {"learn_scale": True, "learn_dof": True}}


def _on_cuda(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cuda"


@pytest.mark.parametrize("likelihood_name", list(LIKELIHOODS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_backend_fits_predicts_and_exports_on_cuda(backend, likelihood_name):
    bnn, x, y, y_std = tiny_problem(backend, likelihood_name, **LIKELIHOODS[likelihood_name])
    posterior = fit(bnn, x, y_std, backend=backend, seed=0, progress=False, device="cuda", **TINY[backend])
    assert all(_on_cuda(p) for p in bnn.parameters())
    prediction, draws = check_tiny_fit(posterior, x.cuda(), y.cuda())
    assert _on_cuda(prediction.f) and _on_cuda(prediction.log_lik)
    assert all(_on_cuda(v) for v in draws.values()), {k: v.device for k, v in draws.items()}


@pytest.mark.parametrize("compile", [False, True])
def test_nuts_recovers_the_conjugate_posterior_on_cuda(conjugate_regression, compile):
    data = conjugate_regression
    post = fit(linear_bnn(data), data.x, data.y, backend="nuts", seed=0, progress=False, device="cuda",
               num_chains=4, warmup_steps=150, num_samples=600, init="current", compile=compile)
    draws = {k: v.cpu() for k, v in post.draws.items()}
    samples = flat_linear_draws({k: v.cpu() for k, v in post.sample_params().items()})
    assert_matches(samples, data.post_mean, data.post_cov, rhat_max(draws))
    assert post.info["divergences"] == 0


def test_laplace_is_exact_on_cuda(conjugate_regression):
    c = conjugate_regression
    post = fit(linear_bnn(c), c.x, c.y, backend="laplace", seed=0, progress=False, device="cuda",
               prior_precision="model", map_steps=1000, num_samples=4000)
    assert torch.allclose(post.mean.cpu(), c.post_mean, atol=1e-4)
    assert torch.allclose(post.covariance.cpu(), c.post_cov, rtol=1e-3, atol=1e-3 * float(c.post_cov.abs().max()))


@pytest.mark.parametrize("hessian", ["diag", "kfac"])
@pytest.mark.parametrize("stochastic", ["all", "last"])
def test_laplace_structures_on_cuda(hessian, stochastic):
    torch.manual_seed(0)
    x = torch.randn(32, 3)
    y = x[:, :1].sin() + 0.1 * torch.randn(32, 1)
    bnn = BayesianNetwork(MLP(3, 1, hidden=(8,)), stochastic, likelihood=make_likelihood("gaussian"), example_input=x)
    post = fit(bnn, x, y, backend="laplace", seed=0, progress=False, device="cuda", hessian=hessian,
               map_steps=50, num_samples=8)
    prediction = post.predict(x.cuda(), y=y.cuda(), seed=0)
    assert _on_cuda(prediction.f) and bool(torch.isfinite(prediction.log_lik).all())


@pytest.mark.parametrize("mode", ["principled", "random"])
def test_pruning_a_sparse_vd_posterior_on_cuda(mode):
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x[:, :1] + 0.1 * torch.randn(64, 1)
    bnn = BayesianNetwork(MLP(3, 1, hidden=(16,)), "all", likelihood=make_likelihood("gaussian"), example_input=x)
    post = fit(bnn, x, y, backend="sparse-vd", seed=0, progress=False, device="cuda", epochs=20, batch_size=16)
    pruned, report = prune(post, mode=mode, seed=0)
    assert report["mode"] == mode
    assert _on_cuda(pruned.predict(x.cuda(), seed=0).f)


def test_svi_recovers_the_conjugate_posterior_mean_on_cuda(conjugate_regression):
    problem = conjugate_regression
    post = fit(linear_bnn(problem), problem.x, problem.y, backend="svi", seed=0, progress=False, device="cuda",
               epochs=2000, batch_size=None, lr=0.03, lr_final_factor=0.003, num_particles=8, init_scale=0.05)
    draws = flat_linear_draws({k: v.cpu() for k, v in post.sample_params(8000, seed=1).items()})
    z = (draws.mean(0) - problem.post_mean) / problem.post_sd  # Monte Carlo error ≈ 0.011 sd
    assert z.abs().max() < 0.1, z


def test_cli_fit_on_cuda_writes_a_complete_run(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "zoo", "fit", "--data", "uci:energy", "--model", "mlp",
                             "--stochastic", "all", "--backend", "svi", "--device", "cuda", "--split", "0",
                             "--seed", "0", "--option", "epochs=3", "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "metrics.json").exists() and (out / "posterior.nc").exists()
