"""``python -m zoo report``: HTML reports for an SVI run, an MCMC run and a classification run.

The MCMC run is built by hand so these tests need no sampler backend: two chains of exact
posterior draws of Bayesian linear regression on the toy 1-D data (closed form, see
tests/conftest.py) with HMC-style sample statistics, written as a run directory.
"""
import base64
import html
import io
import json
import re

import matplotlib.image
import numpy as np
import pytest
import torch

from inference import BACKENDS, SamplePosterior, evaluate, load_netcdf, save_netcdf
from inference.diagnostics import convergence_metrics
from lab.report import render_section, write_comparison, write_report
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior
from lab.cli import main
from zoo.datasets import load_dataset

IMAGE = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
NOISE_SD = 0.5  # standardised units


def _images_decode(page: str) -> int:
    images = IMAGE.findall(page)
    for encoded in images:
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(encoded)), format="png")
        assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50
    return len(images)


def _fit(out, *args):
    code = main(["fit", "--hidden", "16", "--epochs", "40", "--num-samples", "60", "--quiet", "--seed", "0",
                 "--out", str(out), *args])
    assert code == 0


@pytest.fixture(scope="module")
def svi_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "svi"
    _fit(out, "--data", "toy1d", "--model", "mlp", "--stochastic", "last", "--backend", "svi", "--report")
    return out


@pytest.fixture(scope="module")
def mcmc_run(tmp_path_factory):
    """A 2-chain SamplePosterior of exact conjugate draws with fake HMC statistics, as a run directory."""
    out = tmp_path_factory.mktemp("runs") / "nuts"
    data = load_dataset("toy1d", seed=0)
    torch.manual_seed(1)
    bnn = BayesianNetwork(torch.nn.Linear(1, 1), stochastic="all", prior=NormalPrior(1.0),
                          likelihood=GaussianLikelihood(noise_sd=NOISE_SD), example_input=data.x_train[:2],
                          target_loc=data.y_loc, target_scale=data.y_scale)
    phi = torch.cat([data.x_train, torch.ones(data.n_train, 1)], 1).double()
    cov = torch.linalg.inv(phi.T @ phi / NOISE_SD**2 + torch.eye(2, dtype=torch.float64))
    mean = cov @ phi.T @ data.y_train.double()[:, 0] / NOISE_SD**2
    g = torch.Generator().manual_seed(0)
    chains, draws = 2, 150
    flat = (mean + torch.randn(chains * draws, 2, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T)
    flat = flat.float().reshape(chains, draws, 2)
    stats = {
        "diverging": torch.zeros(chains, draws, dtype=torch.bool).index_fill_(1, torch.tensor([7, 80]), True),
        "energy": 3 + torch.randn(chains, draws, generator=g),
        "step_size": torch.tensor([[0.31], [0.27]]).expand(chains, draws),
        "acceptance_rate": 0.7 + 0.25 * torch.rand(chains, draws, generator=g),
        "tree_depth": torch.randint(2, 5, (chains, draws), generator=g),
    }
    posterior = SamplePosterior(bnn, {"weight": flat[..., :1].unsqueeze(-1), "bias": flat[..., 1:]}, stats,
                                info={"backend": "nuts", "seed": 0, "fit_seconds": 1.5})
    y_test = data.y_test_original()
    idata = posterior.to_arviz(data.x_test, y_test, seed=0)
    metrics = {**evaluate(posterior.predict(data.x_test, y=y_test, seed=0), y_test), **convergence_metrics(idata),
               "fit_seconds": 1.5, "backend": "nuts", "stochastic": "all", "model": "linear", "data": "toy1d",
               "seed": 0, "split": 0, "task": "regression", "num_random": 2}
    out.mkdir(parents=True)
    posterior.save(out / "posterior")
    save_netcdf(idata, out / "posterior.nc")
    spec = {"data": "toy1d", "model": "linear", "stochastic": "all", "backend": "nuts", "split": 0, "seed": 0}
    (out / "config.json").write_text(json.dumps({"spec": spec, "backend_options": {"num_chains": 2}, "data": data.summary()}))
    (out / "metrics.json").write_text(json.dumps(metrics))
    return out


def _html(path):
    """The page's text with HTML entities resolved; fails on any section that errored."""
    text = path.read_text()
    assert 'class="error"' not in text, re.findall(r'class="error">([^<]*)', text)
    return html.unescape(text)


def test_svi_report_has_every_section(svi_run):
    page = _html(svi_run / "report.html")  # written by fit --report
    for needle in ("R-hat", "ess_bulk", "ess_tail", "mcse_mean", "elpd_loo", "elpd_waic", "Pareto k", "coverage",
                   "PIT", "ELBO", "KL annealing", "Predictive bands", "log α", "fit_seconds"):
        assert needle in page, needle
    assert "Not applicable: backend 'svi' records no per-draw sampler statistics" in page
    assert "R-hat: not applicable — 1 chain" in page
    assert _images_decode(page) >= 7  # trace, ELBO, Pareto k, coverage, PIT, bands, log α


def test_mcmc_report_has_sampler_and_rhat_sections(mcmc_run, capsys):
    assert main(["report", str(mcmc_run)]) == 0
    assert str(mcmc_run / "report.html") in capsys.readouterr().out
    page = _html(mcmc_run / "report.html")
    for needle in ("r_hat", "ess_bulk", "elpd_loo", "coverage", "divergences", "BFMI", "energy plot", "tree depth",
                   "rank plots", "4 divergent transitions"):
        assert needle in page, needle
    assert "Not applicable: backend 'nuts' records no optimisation history" in page
    assert main(["report", str(mcmc_run), "--out", str(mcmc_run / "elsewhere" / "r.html")]) == 0
    assert (mcmc_run / "elsewhere" / "r.html").read_text().count("<section") == 8
    assert "Not applicable: 'nuts' gives draws, not a variational posterior" in page
    assert _images_decode(page) >= 7  # trace, rank, energy, stats, Pareto k, coverage, PIT, bands


def test_comparison_ranks_runs_by_loo(svi_run, mcmc_run, tmp_path):
    out = tmp_path / "compare.html"
    assert main(["report", str(svi_run), str(mcmc_run), "--out", str(out)]) == 0
    page = _html(out)
    assert "elpd_loo" in page and "weight" in page and "az.compare" in page
    assert 'href="' in page and "report.html" in page
    assert _images_decode(page) == 2  # az.compare plot, calibration overlay


def test_missing_parts_become_one_line_notes(mcmc_run, tmp_path):
    """Without the saved posterior or the data the report still renders, saying what it lacks."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("metrics.json", "posterior.nc"):
        (bare / name).write_bytes((mcmc_run / name).read_bytes())
    page = _html(write_report(bare))
    assert "Not applicable: config.json has no run spec" in page
    assert "Not applicable: the saved posterior is unavailable" in page
    assert "posterior-predictive draws" in page  # PIT fell back to posterior.nc
    assert "this LOO is pessimistic" in page  # LOO fell back to the test-set log-likelihood
    assert "elpd_loo" in page and "r_hat" in page


def test_classification_report_has_reliability_and_ece(tmp_path):
    out = tmp_path / "moons"
    _fit(out, "--data", "moons", "--model", "mlp", "--stochastic", "all", "--backend", "svi")
    page = _html(write_report(out))
    assert "Reliability diagram" in page and "ECE" in page and "elpd_loo" in page
    assert "Not applicable: predictive bands are drawn for regression only" in page
    assert _images_decode(page) >= 5


def test_bad_run_directory_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no metrics.json" in err and "\n" not in err
    with pytest.raises(ValueError, match="at least 2 run directories"):
        write_comparison([tmp_path])


def test_comparison_refuses_different_test_sets(svi_run, tmp_path):
    other = tmp_path / "other"
    _fit(other, "--data", "toy1d", "--model", "mlp", "--stochastic", "last", "--backend", "svi", "--seed", "1")
    page = _html(write_comparison([svi_run, other], tmp_path / "c.html"))
    assert "Not applicable: az.compare needs one shared data set" in page
    assert np.isfinite(json.loads((other / "metrics.json").read_text())["rmse"])


@pytest.mark.skipif("sparse-vd" not in BACKENDS, reason="sparse variational dropout backend not registered")
def test_pruned_variational_run_reports_log_alpha_and_sparsity(tmp_path):
    out = tmp_path / "svd"
    _fit(out, "--data", "toy1d", "--model", "mlp", "--stochastic", "all", "--backend", "sparse-vd",
         "--prune", "principled")
    page = _html(write_report(out))
    assert "Pruning rule: log alpha > t" in page and "Pruned: principled" in page
    assert "log alpha histograms" in page and _images_decode(page) >= 6


def test_render_section_by_title(mcmc_run):
    section = html.unescape(render_section(mcmc_run, "sampler"))
    assert section.startswith("<section") and "BFMI" in section and "r_hat" not in section
    assert "Not applicable" in render_section(mcmc_run, "Variational objective")
    with pytest.raises(ValueError, match="sections: Run, configuration"):
        render_section(mcmc_run, "posterior art")


def test_trace_plots_survive_draws_with_tiny_relative_spread(mcmc_run, tmp_path):
    """float32 log joints like −46610 ± 0.3 (a large, well-fitted model) still get trace and rank plots."""
    idata = load_netcdf(mcmc_run / "posterior.nc")
    noise = np.random.default_rng(0).normal(0, 0.3, idata.posterior["log_joint"].shape)
    idata.posterior["log_joint"] = idata.posterior["log_joint"] * 0 + (-46610 + noise).astype(np.float32)
    bare = tmp_path / "tiny-spread"
    bare.mkdir()
    save_netcdf(idata, bare / "posterior.nc")
    (bare / "metrics.json").write_bytes((mcmc_run / "metrics.json").read_bytes())
    section = render_section(bare, "Convergence")
    assert "could not draw" not in section and section.count("<img") == 2
