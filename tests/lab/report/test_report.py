"""``python -m zoo report``: HTML reports for an SVI run, an MCMC run and a classification run.

The MCMC run is built by hand so these tests need no sampler backend: two chains of exact
posterior draws of Bayesian linear regression on the toy 1-D data (closed form, see
tests/inference/conftest.py) with HMC-style sample statistics, written as a run folder by
:func:`lab.runs.execution.write_run`.  Reports read the run's files (or its in-memory result) and never
predict again or re-create the data.
"""
import base64
import dataclasses
import html
import io
import json
import re
import shutil

import arviz as az
import matplotlib.image
import numpy as np
import pytest
import torch

from inference import BACKENDS, Posterior, SamplePosterior, evaluate, load_netcdf, load_posterior
from inference.evaluation.arviz_export import loo_subset, quiet_arviz
from inference.evaluation.diagnostics import convergence_metrics
from inference.evaluation.member_metrics import member_metrics
from inference.evaluation.metrics import ece_from_probs
from lab.cli import main
from lab.report import RUN_SECTIONS, ReportRun, open_run, render_run, render_section, write_comparison, write_report
from lab.report.likelihood import binned_residuals, fixed_rows, latent_rows, noise_sd, pit_tail_rows
from lab.report.predictive import LEVELS, coverage_curve, pit_values
from lab.runs.spec import RunSpec
from lab.runs.execution import RunResult, execute, write_run
from zoo import BayesianNetwork, GaussianLikelihood, NormalPrior
from zoo.likelihoods import StudentTLikelihood
from zoo.data import load_dataset

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
def heteroscedastic_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "het"
    _fit(out, "--data", "toy1d", "--model", "mlp", "--stochastic", "last", "--backend", "svi",
         "--likelihood", "heteroscedastic", "--beta", "0.25")
    return out


@pytest.fixture(scope="module")
def studentt_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "studentt"
    _fit(out, "--data", "toy1d", "--model", "mlp", "--stochastic", "last", "--backend", "svi",
         "--likelihood", "studentt")
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
    prediction = posterior.predict(data.x_test, y=y_test, seed=0)
    idata = posterior.to_arviz(data.x_test, y_test, seed=0, prediction=prediction)
    index = loo_subset(data.n_train, seed=0)
    train_idata = posterior.to_arviz(data.x_train[index], data.y_train_original()[index], seed=0, include_weights=False)
    metrics = {**evaluate(prediction, y_test), **convergence_metrics(idata),
               "fit_seconds": 1.5, "backend": "nuts", "stochastic": "all", "model": "linear", "data": "toy1d",
               "seed": 0, "split": 0, "task": "regression", "num_random": 2, "n_train": data.n_train}
    metrics["members"] = member_metrics(posterior, data.x_test, y_test, prediction, seed=0)
    metrics["member_disagreement"] = metrics["members"]["disagreement"]
    spec = RunSpec(data="toy1d", model="linear", stochastic="all", backend="nuts")
    config = {"spec": spec.to_dict(), "backend_options": {"num_chains": 2}, "data": data.summary()}
    write_run(RunResult(spec, metrics, config, posterior, prediction, idata, train_idata, data), out)
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
    assert (mcmc_run / "elsewhere" / "r.html").read_text().count("<section") == len(RUN_SECTIONS)
    assert "Not applicable: 'nuts' gives draws, not a variational posterior" in page
    assert _images_decode(page) >= 7  # trace, rank, energy, stats, Pareto k, coverage, PIT, bands


def test_comparison_ranks_runs_by_loo(svi_run, mcmc_run, tmp_path):
    out = tmp_path / "compare.html"
    assert main(["report", str(svi_run), str(mcmc_run), "--out", str(out)]) == 0
    page = _html(out)
    assert "elpd_loo" in page and "weight" in page and "az.compare" in page
    assert 'href="' in page and "report.html" in page
    assert _images_decode(page) == 2  # az.compare plot, calibration overlay


def test_missing_parts_become_one_line_notes(mcmc_run):
    """A run without train.nc or a saved posterior still renders, saying what it lacks."""
    complete = open_run(mcmc_run)
    bare = ReportRun("bare", complete.metrics, complete.config, complete.idata)
    page = html.unescape(render_run(bare))
    assert 'class="error"' not in page
    assert "Not applicable: the run has no training-set InferenceData (train.nc)" in page
    assert "Not applicable: the run has no saved posterior" in page
    assert "coverage (this curve)" in page and "r_hat" in page and "— in memory" in page


def test_incomplete_or_changed_run_folders_are_refused(svi_run, tmp_path, capsys):
    half = tmp_path / "half"
    shutil.copytree(svi_run, half)
    for name in ("COMPLETE", "report.html"):
        (half / name).unlink()
    assert main(["report", str(half)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no COMPLETE marker" in err and "\n" not in err
    assert not (half / "report.html").exists()
    damaged = tmp_path / "damaged"
    shutil.copytree(svi_run, damaged)
    (damaged / "metrics.json").write_text("{}")
    with pytest.raises(ValueError, match="damaged"):
        write_report(damaged)


def test_reports_never_predict_or_load_data(svi_run, mcmc_run, heteroscedastic_run, monkeypatch):
    """Every section of a run folder's report comes from its files: predicting or loading data fails here."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a report must not predict, export or load data again")

    for name in ("predict", "to_arviz"):
        monkeypatch.setattr(Posterior, name, forbidden)
    for where in ("zoo.data.load_dataset", "zoo.data.registry.load_dataset", "lab.runs.execution.load_dataset"):
        monkeypatch.setattr(where, forbidden)
    for run in (svi_run, mcmc_run, heteroscedastic_run):
        page = html.unescape(render_run(run))
        assert 'class="error"' not in page, re.findall(r'class="error">([^<]*)', page)
        assert "elpd_loo" in page and "PIT histogram" in page and "predictive bands" in page


def test_report_values_equal_those_of_predicting_again(svi_run):
    """The stored PIT values, coverage curve and LOO equal what re-creating the data and re-predicting gives."""
    run = open_run(svi_run)
    posterior = load_posterior(svi_run / "posterior")
    data = load_dataset("toy1d", seed=0)
    pred = posterior.predict(data.x_test, y=data.y_test_original(), seed=0)
    np.testing.assert_array_equal(pit_values(run), pred.pit.numpy().ravel())
    again = np.array([np.mean((pred.pit.numpy() >= (1 - p) / 2) & (pred.pit.numpy() <= (1 + p) / 2)) for p in LEVELS])
    np.testing.assert_allclose(coverage_curve(pit_values(run)), again, rtol=0, atol=1e-6)
    index = loo_subset(data.n_train, seed=0)
    train = posterior.to_arviz(data.x_train[index], data.y_train_original()[index], seed=0, include_weights=False)
    stored = run.train_idata
    np.testing.assert_array_equal(stored.log_likelihood["obs"].values, train.log_likelihood["obs"].values)
    with quiet_arviz():
        assert az.loo(stored).elpd_loo == az.loo(train).elpd_loo
    assert run.metrics["coverage_90"] == pytest.approx(coverage_curve(pit_values(run), [0.9])[0], abs=1e-7)


def test_report_from_an_in_memory_result_matches_the_folder(tmp_path):
    spec = RunSpec(data="toy1d", hidden=[8], stochastic="last", epochs=30, num_samples=40)
    result = execute(spec, tmp_path / "run", progress=False)
    unwritten = dataclasses.replace(result, directory=None)
    assert ReportRun.from_result(unwritten).name == "toy1d-mlp-last-svi-seed0"
    in_memory = ReportRun.from_result(unwritten, name="run")
    for title in ("LOO", "Calibration", "Predictive bands", "Convergence", "Variational layers", "Likelihood"):
        from_files = render_section(tmp_path / "run", title)
        assert render_section(result, title) == from_files == render_section(in_memory, title), title
    with pytest.raises(ValueError, match="in memory only"):
        write_report(unwritten)
    page = write_report(unwritten, tmp_path / "mem.html").read_text()
    assert page.count("<section") == len(RUN_SECTIONS) and "in memory" in page


def test_classification_report_has_reliability_and_ece(tmp_path):
    out = tmp_path / "moons"
    _fit(out, "--data", "moons", "--model", "mlp", "--stochastic", "all", "--backend", "svi")
    page = _html(write_report(out))
    assert "Reliability diagram" in page and "ECE" in page and "elpd_loo" in page
    run = open_run(out)
    labels = torch.as_tensor(run.idata.observed_data["obs"].values)
    stored_ece = ece_from_probs(torch.as_tensor(run.predictions()["probs"].values), labels)
    assert stored_ece == json.loads((out / "metrics.json").read_text())["ece"]
    assert "Not applicable: predictive bands are drawn for regression only" in page
    assert "Not applicable: classification runs use the categorical likelihood" in page
    assert _images_decode(page) >= 5


def test_bad_run_directory_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no COMPLETE marker" in err and "\n" not in err
    with pytest.raises(ValueError, match="at least 2 runs"):
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


def test_trace_plots_survive_draws_with_tiny_relative_spread(mcmc_run):
    """float32 log joints like −46610 ± 0.3 (a large, well-fitted model) still get trace and rank plots."""
    complete = open_run(mcmc_run)
    idata = load_netcdf(mcmc_run / "posterior.nc")
    noise = np.random.default_rng(0).normal(0, 0.3, idata.posterior["log_joint"].shape)
    idata.posterior["log_joint"] = idata.posterior["log_joint"] * 0 + (-46610 + noise).astype(np.float32)
    section = render_section(ReportRun("tiny-spread", complete.metrics, complete.config, idata), "Convergence")
    assert "could not draw" not in section and section.count("<img") == 2


def _member_rows(section: str) -> dict:
    """``{row label: [cells]}`` of the members table."""
    rows = re.findall(r"<tr><td>([^<]*)</td>((?:<td>[^<]*</td>)*)</tr>", section)
    return {label: [float(c) for c in re.findall(r"<td>([^<]*)</td>", cells)] for label, cells in rows}


def test_members_section_of_an_ensemble_shows_each_member_and_the_mixture(tmp_path):
    spec = RunSpec(data="toy1d", hidden=[8], stochastic="all", backend="ensemble", epochs=20,
                   backend_options={"num_members": 3})
    result = execute(spec, tmp_path / "ens", progress=False)
    stored = json.loads((tmp_path / "ens" / "metrics.json").read_text())["members"]
    section = html.unescape(render_section(tmp_path / "ens", "Members"))
    assert section == html.unescape(render_section(result, "Members"))  # folder and in-memory result agree
    rows = _member_rows(section)
    assert list(rows) == ["member 0", "member 1", "member 2", "mean of members", "mixture (BMA)"]
    for label, metrics in [*zip(["member 0", "member 1", "member 2"], stored["per_member"]),
                           ("mean of members", stored["member_mean"]), ("mixture (BMA)", stored["mixture"])]:
        np.testing.assert_allclose(rows[label], [metrics[k] for k in ("rmse", "test_ll", "coverage_50", "coverage_90",
                                                                       "coverage_95")], rtol=1e-3)
    assert f"Disagreement {stored['disagreement']:.3g}:" in section and "near 1 the members' spread" in section
    assert 0 <= stored["disagreement"] <= 1 and _images_decode(section) == 1
    other = tmp_path / "svi"
    execute(dataclasses.replace(spec, backend="svi", backend_options={}, num_samples=20), other, progress=False)
    compared = _html(write_comparison([tmp_path / "ens", other], tmp_path / "c.html"))
    assert "<th>member_disagreement</th>" in compared and f"{stored['disagreement']:.4g}" in compared


def test_members_section_of_chains_that_sample_one_posterior_shows_little_disagreement(mcmc_run, svi_run):
    """Two chains of exact draws of one posterior: the chains' predictive means differ by Monte Carlo error only."""
    section = html.unescape(render_section(mcmc_run, "Members"))
    stored = open_run(mcmc_run).metrics["members"]
    # chain means differ by Monte Carlo error ~ sd_f · sqrt(2 / 150) ≪ the predictive sd, which includes the noise
    assert 0 < stored["disagreement"] < 0.05 and "2 members (chains)" in section
    assert list(_member_rows(section)) == ["member 0", "member 1", "mean of members", "mixture (BMA)"]
    assert "Not applicable: one member" in html.unescape(render_section(svi_run, "Members"))
    complete = open_run(mcmc_run)
    older = ReportRun("older", {k: v for k, v in complete.metrics.items() if k != "members"}, complete.config,
                complete.idata)
    assert "Not applicable: 2 chains, but metrics.json holds no member metrics" in html.unescape(
        render_section(older, "Members"))


def test_members_section_of_a_classification_ensemble_reads_disagreement_in_nats(tmp_path):
    spec = RunSpec(data="moons", hidden=[8], stochastic="all", backend="ensemble", epochs=10,
                   backend_options={"num_members": 2})
    execute(spec, tmp_path / "moons", progress=False)
    stored = json.loads((tmp_path / "moons" / "metrics.json").read_text())["members"]
    section = html.unescape(render_section(tmp_path / "moons", "Members"))
    assert f"Disagreement {stored['disagreement']:.3g} nats" in section and "ln K = 0.693 for K = 2 classes" in section
    rows = _member_rows(section)
    assert rows["mixture (BMA)"][0] == pytest.approx(stored["mixture"]["accuracy"], rel=1e-3)
    assert 0 <= stored["disagreement"] <= np.log(2)


# ---------------------------------------------------------------------- the likelihood section
def test_run_sections_include_the_likelihood_section():
    titles = [title for title, _ in RUN_SECTIONS]
    assert len(RUN_SECTIONS) == 12 and len(set(titles)) == 12
    assert titles.index("Likelihood: observation model, its latents and residual check") == \
        titles.index("Predictive bands (1-D inputs)") + 1


def _cells(section: str) -> dict:
    """``{first cell: [other cells]}`` of every table row of a section."""
    rows = re.findall(r"<tr><td>([^<]*)</td>((?:<td>[^<]*</td>)*)</tr>", section)
    return {label: re.findall(r"<td>([^<]*)</td>", cells) for label, cells in rows}


def test_likelihood_section_of_a_heteroscedastic_run_bins_residuals_by_predicted_noise(heteroscedastic_run):
    section = html.unescape(render_section(heteroscedastic_run, "Likelihood"))
    assert 'class="error"' not in section
    assert "β-NLL weight β = 0.25" in section and "HeteroscedasticGaussianLikelihood(beta=0.25)" in section
    assert "Not applicable: this likelihood has no latent parameters" in section
    assert "PIT QQ plot" in section and _images_decode(section) == 2  # QQ plot, binned residuals
    run = open_run(heteroscedastic_run)
    pred = run.predictions()
    y = run.idata.observed_data["obs"].values.reshape(-1)
    noise = noise_sd(pred["sd"].values[:, 0], pred["epistemic_sd"].values[:, 0])
    rows = binned_residuals(noise, pred["sd"].values[:, 0], np.abs(y - pred["mean"].values[:, 0]))
    assert [r[0] for r in rows] == [100] * 5 and sorted(r[1] for r in rows) == [r[1] for r in rows]
    assert f"<td>0</td><td>100</td><td>{rows[0][1]:.4g}</td>" in section


def test_stored_summaries_give_the_predicted_noise_sd(heteroscedastic_run):
    """sqrt(sd² − epistemic_sd²) of the stored summaries is sqrt(E_s[σ²(x)]) of predicting again."""
    run = open_run(heteroscedastic_run)
    pred = load_posterior(heteroscedastic_run / "posterior").predict(
        load_dataset("toy1d", seed=0).x_test, num_samples=run.predictions().attrs["num_samples"], seed=0)
    stored = noise_sd(run.predictions()["sd"].values, run.predictions()["epistemic_sd"].values)
    assert pred.noise_var.shape[1] == stored.shape[0]  # heteroscedastic: one noise variance per point
    np.testing.assert_allclose(stored, pred.noise_var.mean(0).sqrt().numpy(), rtol=2e-3)
    assert stored.max() > 2 * stored.min()  # the variance head varies with x


def test_likelihood_section_of_a_studentt_run_shows_scale_and_dof_posteriors(studentt_run):
    section = html.unescape(render_section(studentt_run, "Likelihood"))
    run = open_run(studentt_run)
    scale = float(run.posterior.bnn.target_scale[0])
    post = run.idata.posterior
    cells = _cells(section)
    dof = post["dof"].values.ravel()
    s = scale / np.sqrt(post["noise_precision"].values.ravel())
    for label, draws in (("degrees of freedom ν", dof), ("scale s", s)):
        row = [float(c) for c in cells[label][1:7]]
        np.testing.assert_allclose(row[:3], [draws.mean(), *np.quantile(draws, [0.05, 0.95])], rtol=1e-3)
        with quiet_arviz():
            assert row[5] == pytest.approx(az.ess(draws.reshape(1, -1), method="bulk"), rel=1e-3)
    # priors: ν ~ Gamma(2, 0.1); s = 1/√precision with precision ~ Gamma(1, 0.01) = Exponential(mean 100)
    np.testing.assert_allclose([float(c) for c in cells["degrees of freedom ν"][4:6]],
                               [3.5536, 47.439], rtol=1e-3)
    np.testing.assert_allclose(float(cells["scale s"][5]), scale / np.sqrt(-100 * np.log(0.95)), rtol=1e-3)
    assert "<th>r_hat</th>" not in section and "<th>ess_bulk</th>" in section  # one chain: no R-hat column
    assert _images_decode(section) == 1 and "does not vary with x" in section
    bare = ReportRun("bare", run.metrics, run.config, run.idata)  # no saved posterior: the spec, standardised units
    fallback = html.unescape(render_section(bare, "Likelihood"))
    assert "from the run spec (config.json)" in fallback and "standardised target units" in fallback
    assert float(_cells(fallback)["scale s"][1]) == pytest.approx(float(cells["scale s"][1]) / scale, rel=1e-3)


def test_likelihood_latents_of_two_chains_get_rhat_and_a_warning_when_chains_disagree():
    data = load_dataset("toy1d", seed=0)
    bnn = BayesianNetwork(torch.nn.Linear(1, 1), stochastic="all", prior=NormalPrior(1.0),
                          likelihood=StudentTLikelihood(learn_scale=True, learn_dof=True),
                          example_input=data.x_train[:2], target_loc=data.y_loc, target_scale=data.y_scale)
    g = torch.Generator().manual_seed(0)
    chains, draws = 2, 100
    params = {"weight": 1 + 0.01 * torch.randn(chains, draws, 1, 1, generator=g),
              "bias": 0.01 * torch.randn(chains, draws, 1, generator=g),
              "noise_precision": 4 + torch.rand(chains, draws, 1, generator=g),
              "dof": torch.tensor([5.0, 9.0]).view(2, 1, 1) + torch.randn(chains, draws, 1, generator=g)}
    posterior = SamplePosterior(bnn, params, info={"backend": "nuts", "seed": 0})
    y = data.y_test_original()
    idata = posterior.to_arviz(data.x_test, y, seed=0, prediction=posterior.predict(data.x_test, y=y, seed=0))
    run = ReportRun("two-chains", {"task": "regression"}, {"spec": {}}, idata, posterior=posterior)
    rows, header = latent_rows(run, bnn.likelihood, data.y_scale.double().numpy())
    assert header[-1] == "r_hat"
    with quiet_arviz():
        assert rows[1][-1] == pytest.approx(az.rhat(params["dof"][..., 0].numpy()))
    assert rows[1][-1] > 1.1 and rows[0][-1] < 1.05  # ν: chains at 5 and 9; the scale: one distribution
    section = html.unescape(render_section(run, "Likelihood"))
    assert "R-hat > 1.01 for degrees of freedom ν (target 0)" in section and "scale s (target 0)" not in section


def test_fixed_noise_is_shown_in_both_units(mcmc_run):
    section = html.unescape(render_section(mcmc_run, "Likelihood"))
    scale = float(open_run(mcmc_run).posterior.bnn.target_scale[0])
    assert _cells(section)["noise sd σ"] == ["0.5", f"{NOISE_SD * scale:.4g}"]
    assert "Not applicable: this likelihood has no latent parameters" in section
    fixed = fixed_rows(StudentTLikelihood(learn_scale=True, dof=5.0, learn_dof=False))
    assert fixed == [["degrees of freedom ν", 5.0, 5.0]]


def test_pit_tail_check_flags_heavy_tails_against_the_closed_form():
    """Unit-variance t₃ residuals under a unit-variance Gaussian: tail shares as scipy's t CDF gives them."""
    import scipy.stats
    rng = np.random.default_rng(0)
    n = 20000
    calibrated = pit_tail_rows(scipy.stats.norm.cdf(rng.standard_normal(n)))
    assert [r[-1] for r in calibrated] == ["as expected"] * 4
    t3 = scipy.stats.t(3, scale=np.sqrt(1 / 3))  # sd 1
    rows = {r[0]: r for r in pit_tail_rows(scipy.stats.norm.cdf(t3.rvs(n, random_state=rng)))}
    z = scipy.stats.norm.ppf
    expected = {"PIT < 0.05 (lower 5 % tail)": t3.cdf(z(0.05)),
                "PIT < 0.005 or > 0.995 (outer 1 %)": 2 * t3.cdf(z(0.005)),
                "0.25 ≤ PIT ≤ 0.75 (central 50 %)": t3.cdf(z(0.75)) - t3.cdf(z(0.25))}
    for label, share in expected.items():
        assert rows[label][1] == pytest.approx(share, abs=4 * np.sqrt(share * (1 - share) / n)), label
    assert [rows[k][-1] for k in expected] == ["too few", "too many", "too many"]


def test_binned_residuals_follow_a_noise_sd_that_grows_with_x():
    rng = np.random.default_rng(1)
    n = 10000
    noise = 0.1 + rng.uniform(size=n)
    residual = np.abs(noise * rng.standard_normal(n))
    right = binned_residuals(noise, noise, residual)
    assert len(right) == 5 and all(abs(r[-1] - 1) < 0.06 for r in right)  # SE of a bin's ratio ≈ 0.016
    constant = np.full(n, np.sqrt(np.mean(noise**2)))
    wrong = [r[-1] for r in binned_residuals(noise, constant, residual)]
    assert wrong == sorted(wrong) and wrong[0] < 0.5 and wrong[-1] > 1.4
