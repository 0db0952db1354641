"""Every run against the trivial predictor: the numbers, the failed-fit flag and where it shows (issue 29)."""
import json
import math

import pandas as pd
import pytest
import torch
from scipy import stats

from inference.prediction import Prediction
from inference.evaluation.sanity import SCALE_LIMIT, fit_check, trivial_predictor_metrics
from lab.cli import main
from lab.grid_runs import Experiment, GridRun
from lab.grid_worker import run_one
from lab.run_spec import RunSpec
from lab.tables import write_tables
from lab.tables import summarise
from zoo.likelihoods import PredictiveMixture

TINY = ["--hidden", "8", "--epochs", "10", "--num-samples", "20", "--quiet"]
#: a deliberately broken configuration: fixed observation noise of 100 standardised sds
BROKEN = ["--data", "toy1d", *TINY, "--noise", "100"]
#: a short fit that beats the trivial predictor (energy: RMSE about 0.2x the training mean's)
FINE = ["--data", "uci:energy", *TINY]


def _gaussian_prediction(loc, sd, y):
    """A regression Prediction with S Gaussian draws of the mean ``loc`` [S, N, 1] and noise sd ``sd``."""
    scale = torch.full_like(loc, sd)
    log_lik = torch.distributions.Normal(loc, scale).log_prob(y.unsqueeze(0)).sum(-1)
    mixture = PredictiveMixture(loc, scale)
    return Prediction("regression", loc, loc, scale ** 2, log_lik, mixture.cdf(y), mixture)


def test_trivial_predictor_matches_closed_forms():
    y_train = torch.tensor([[1.0], [2.0], [4.0], [5.0]])
    y = torch.tensor([[0.0], [3.0], [7.0]])
    out = trivial_predictor_metrics("regression", y_train, y)
    mean, sd = 3.0, math.sqrt(2.5)  # training mean and (population) sd
    assert out["rmse"] == pytest.approx(math.sqrt((9 + 0 + 16) / 3))
    assert out["test_ll"] == pytest.approx(stats.norm(mean, sd).logpdf([0.0, 3.0, 7.0]).mean())
    labels = trivial_predictor_metrics("classification", torch.tensor([0, 1, 1, 2]), torch.tensor([1, 2, 0]),
                                       num_classes=3)
    assert labels["accuracy"] == pytest.approx(1 / 3)  # always class 1, the most frequent
    assert labels["nll"] == pytest.approx(-(math.log(0.5) + 2 * math.log(0.25)) / 3)


def test_fit_check_flags_worse_than_trivial_and_exploding_scale_only():
    generator = torch.Generator().manual_seed(0)
    y_train = torch.randn(200, 1, generator=generator) * 2 + 10
    y = torch.randn(50, 1, generator=generator) * 2 + 10
    good = _gaussian_prediction(y.unsqueeze(0) + 0.1 * torch.randn(20, 50, 1, generator=generator), 0.5, y)
    metrics = {"rmse": float(((good.mean - y) ** 2).mean().sqrt()), "test_ll": float(good.log_predictive_density().mean())}
    check = fit_check(good, y, y_train, metrics)
    assert not check["failed_fit"] and check["failed_fit_reason"] == ""
    assert check["rmse_ratio"] == pytest.approx(metrics["rmse"] / check["trivial_rmse"]) and check["rmse_ratio"] < 0.2
    assert check["test_ll_gain"] == pytest.approx(metrics["test_ll"] - check["trivial_test_ll"])
    # the mean 3 target-sds off: worse than the training mean in RMSE and LL
    shifted = _gaussian_prediction(good.f + 6.0, 0.5, y)
    metrics = {"rmse": float(((shifted.mean - y) ** 2).mean().sqrt()),
               "test_ll": float(shifted.log_predictive_density().mean())}
    check = fit_check(shifted, y, y_train, metrics, train={"train_ll": -0.5, "trivial_train_ll": -2.1})
    assert check["failed_fit"] and "test RMSE" in check["failed_fit_reason"] and "test LL" in check["failed_fit_reason"]
    assert f"{metrics['rmse']:.4g}" in check["failed_fit_reason"]  # it names the numbers
    assert "beats it on its training data" in check["failed_fit_reason"]
    # one test point's predictive sd beyond SCALE_LIMIT target ranges, everything else good
    wide = torch.full_like(good.f, 0.5)
    spread = float(y_train.max() - y_train.min())
    wide[:, 0] = 2 * SCALE_LIMIT * spread
    mixture = PredictiveMixture(good.f, wide)
    exploding = Prediction("regression", good.f, good.f, wide ** 2, good.log_lik, mixture.cdf(y), mixture)
    check = fit_check(exploding, y, y_train, {"rmse": 0.1, "test_ll": 10.0})
    assert check["failed_fit"] and check["max_scale_to_range"] == pytest.approx(2 * SCALE_LIMIT, rel=1e-3)
    assert "range" in check["failed_fit_reason"] and "RMSE" not in check["failed_fit_reason"]


def test_classification_worse_than_class_frequencies_is_flagged():
    y_train = torch.tensor([0] * 8 + [1] * 2)
    y = torch.tensor([0, 0, 0, 1])
    logits = torch.tensor([[-3.0, 3.0]]).expand(5, 4, 2)  # always class 1, confidently
    log_lik = torch.log_softmax(logits, -1)[:, torch.arange(4), y]
    pred = Prediction("classification", logits, torch.ones(5, 4, dtype=torch.long), log_lik=log_lik)
    metrics = {"accuracy": 0.25, "test_ll": float(pred.log_predictive_density().mean())}
    check = fit_check(pred, y, y_train, metrics)
    assert check["trivial_accuracy"] == 0.75 and check["accuracy_ratio"] == pytest.approx(1 / 3)
    assert check["failed_fit"] and "accuracy 0.25" in check["failed_fit_reason"]


def test_broken_fit_is_flagged_in_metrics_summary_and_report(tmp_path, capsys):
    out = tmp_path / "broken"
    assert main(["fit", *BROKEN, "--report", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["failed_fit"] is True and metrics["test_ll_gain"] < 0
    assert metrics["max_scale_to_range"] > SCALE_LIMIT
    assert {"trivial_rmse", "trivial_test_ll", "rmse_ratio", "train_ll", "trivial_train_ll"} <= set(metrics)
    printed = capsys.readouterr().out
    assert "WARNING: failed fit" in printed and f"{metrics['test_ll']:.4g}" in printed
    report = (out / "report.html").read_text()
    first_section = report.index("<section")
    assert report.index('<p class="error failed-fit">Failed fit: ') == report.index("<p", first_section)  # the top line
    good = tmp_path / "good"
    assert main(["fit", *FINE, "--out", str(good)]) == 0
    assert json.loads((good / "metrics.json").read_text())["failed_fit"] is False
    assert "WARNING" not in capsys.readouterr().out


def test_strict_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "strict"
    assert main(["fit", *BROKEN, "--strict", "--out", str(out)]) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    assert err.startswith("error: svi: failed fit (strict): ") and len(err.strip().splitlines()) == 1


def test_experiment_tables_have_the_failed_fit_column_and_count(tmp_path):
    common = dict(model="mlp", hidden=[8], epochs=10, num_samples=20)
    variants = (("broken", {"data": "toy1d", "noise": 100.0}), ("fine", {"data": "uci:energy"}))
    runs = [GridRun(f"{variant}-{seed}", RunSpec(seed=seed, **common, **spec), {"variant": variant, "seed": seed})
            for variant, spec in variants for seed in ((0, 1) if variant == "broken" else (0,))]
    root = tmp_path / "runs"
    for run in runs:
        run_one(run, root)
    experiment = Experiment("t", "test grid", lambda fast, root: runs, ("variant",), ("rmse", "test_ll"))
    results, summary, _ = write_tables(experiment, runs, root, tmp_path, {})
    assert "failed_fit" in pd.read_csv(tmp_path / "results.csv").columns
    assert summary.set_index("variant")["failed_fit"].to_dict() == {"broken": 2, "fine": 0}
    table = (tmp_path / "summary.md").read_text()
    assert "| variant | n | rmse | test_ll | failed_fit |" in table
    assert "2 run(s) flagged failed_fit" in table and "broken-0, broken-1\n" in table
    # runs written before the flag existed (no column) count as not flagged
    old = summarise(pd.DataFrame({"variant": ["a", "a"], "seed": [0, 1], "rmse": [1.0, 2.0]}), ("variant",))
    assert list(old["failed_fit"]) == [0]
