"""Where the failed-fit flag shows (issue 29): a run's metrics, its summary line and report, ``--strict``, and the
experiment tables' failed_fit column and count."""
import json

import pandas as pd

from inference.evaluation.sanity import SCALE_LIMIT
from lab.cli import main
from lab.grids.experiment import Experiment, GridRun
from lab.grids.worker import run_one
from lab.runs.spec import RunSpec
from lab.grids.tables import write_tables
from lab.grids.tables import summarise

TINY = ["--hidden", "8", "--epochs", "10", "--num-samples", "20", "--quiet"]
#: a deliberately broken configuration: fixed observation noise of 100 standardised sds
BROKEN = ["--data", "toy1d", *TINY, "--noise", "100"]
#: a short fit that beats the trivial predictor (energy: RMSE about 0.2x the training mean's)
FINE = ["--data", "uci:energy", *TINY]


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
