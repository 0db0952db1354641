"""Shift data through the run layer: a CLI fit on rotated / held-out-class digits writes its shift record, the
report shows it, and the shift experiments' grids, tables and figures (lab.grids.shift)."""

import html
import json

import pandas as pd
import pytest

from lab.cli import main
from lab.grids.registry import EXPERIMENTS
from lab.report import render_section
from lab.report.rundata import NotApplicable, ReportRun
from lab.report.shift import shift as shift_section
from lab.grids.shift import DIGITS_METHODS, REGRESSION_METHODS, gap_tables, ood_tables, rotation_tables
from lab.grids.tables import make_figures
from zoo.data import BUNDLED_UCI, load_uci

_SMALL = ["--model", "mlp", "--hidden", "8", "--epochs", "3", "--quiet", "--seed", "0"]


@pytest.fixture(scope="module")
def rotated_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("shift") / "rotated"
    assert main(["fit", "--data", "digits-rotated:90", "--backend", "svi", "--stochastic", "last", *_SMALL, "--num-samples", "20",
                 "--report", "--out", str(out)]) == 0
    return out


def test_a_rotated_digits_run_stores_its_curve_and_reports_it(rotated_run):
    metrics = json.loads((rotated_run / "metrics.json").read_text())
    rows = metrics["shift"]["rotation"]
    assert [row["angle"] for row in rows] == [0.0, 90.0, 180.0]
    assert rows[0]["accuracy"] == metrics["accuracy"] and rows[0]["nll"] == pytest.approx(metrics["nll"])
    assert metrics["rot180_brier"] == rows[2]["brier"] and metrics["rot90_mi"] > 0
    page = html.unescape((rotated_run / "report.html").read_text())
    assert "Rotated test images (Ovadia et al. 2019)" in page and "angle (degrees)" in page
    config = json.loads((rotated_run / "config.json").read_text())
    assert config["data"]["shift_sets"] == {"rotation 0°": 450, "rotation 90°": 450, "rotation 180°": 450}


def test_a_map_run_on_held_out_classes_says_its_mutual_information_is_zero(tmp_path):
    out = tmp_path / "ood"
    assert main(["fit", "--data", "digits-ood:0-2", "--backend", "map", "--stochastic", "all", *_SMALL,
                 "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ood_auroc_mi"] is None and metrics["ood_mi_identically_zero"] is True
    assert 0.0 <= metrics["ood_auroc_entropy"] <= 1.0 and metrics["shift"]["ood"][0]["n_out"] + metrics["n_test"] == 450
    section = html.unescape(render_section(out, "Shift"))
    assert "the mutual information is identically zero" in section and "held-out classes 3,4,5,6,7,8,9" in section


def test_the_shift_section_of_an_ordinary_run_or_a_bad_record_is_one_line(rotated_run):
    assert "Not applicable: the run's data have no shift sets" in html.unescape(
        render_section(_in_memory({}), "Shift"))
    bad = {"shift": {"rotation": [{"angle": 0.0, "accuracy": "<script>", "nll": 1, "ece": 0, "brier": 0,
                                   "entropy": 0, "mi": 0}]}}
    with pytest.raises(NotApplicable, match="not a finite number"):
        shift_section(_in_memory(bad))
    with pytest.raises(NotApplicable, match="no list of ood rows"):
        shift_section(_in_memory({"shift": {"ood": "x"}}))


def _in_memory(metrics):
    return ReportRun("run", metrics, {}, idata=None)


def test_a_bad_shift_spec_on_the_command_line_exits_2_naming_the_option(tmp_path, capsys):
    assert main(["fit", "--data", "digits-rotated:400", *_SMALL, "--out", str(tmp_path / "a")]) == 2
    assert "digits-rotated:STEP" in capsys.readouterr().err
    assert main(["fit", "--data", "uci-gap:yacht", "--split", "6", *_SMALL, "--out", str(tmp_path / "b")]) == 2
    assert "--split 6 names no input feature of uci-gap:yacht" in capsys.readouterr().err


# ---------------------------------------------------------------------- the grids


def test_the_shift_grids_hold_every_backend_and_seed():
    from inference.backends import BACKENDS

    rotation = EXPERIMENTS["shift-rotation"].build(False, None)
    assert {r.spec.backend for r in rotation} == set(BACKENDS) == {b for b, _, _ in DIGITS_METHODS.values()}
    assert len(rotation) == 3 * len(DIGITS_METHODS) and {r.spec.data for r in rotation} == {"digits-rotated"}
    assert {r.spec.data for r in EXPERIMENTS["shift-ood"].build(True, None)} == {"digits-ood"}
    gap = EXPERIMENTS["uci-gap"].build(False, None)
    assert {b for b, _, _ in REGRESSION_METHODS.values()} == set(BACKENDS)
    for name in ("yacht", "energy", "concrete"):
        features = load_uci(name).input_dim
        splits = {(r.labels["splits"], r.spec.split) for r in gap if r.labels["dataset"] == name}
        assert splits == {("gap", k) for k in range(features)} | {("standard", k) for k in range(3)}
    assert set(BUNDLED_UCI) >= {"yacht", "energy", "concrete"}
    assert len({r.key for r in gap}) == len(gap)
    # a grid's samplers run without the new user's time budget (it stopped every digits SG-MCMC run at 120 s)
    for run in rotation + gap:
        if run.spec.backend in {"nuts", "hmc", "sgld", "psgld", "sghmc", "csgmcmc"}:
            assert run.spec.backend_options["time_budget"] is None, run.key


def _summary(rows):
    return pd.DataFrame(rows)


def test_rotation_and_ood_tables_and_figures(tmp_path):
    rotation = _summary([{"method": m, "n": 3, **{f"rot{a}_{k}_mean": v for a in (0, 90, 180)
                                                   for k, v in (("accuracy", 0.9 - a / 400), ("nll", 0.1 + a / 100),
                                                                ("ece", 0.01), ("brier", 0.2))}}
                         for m in ("map", "svi")])
    text = rotation_tables(rotation)
    assert "| map | 3 | 0.900 | 0.675 | 0.450 | 0.675 |" in text and "**NLL against the rotation angle**" in text
    ood = _summary([{"method": "map", "n": 3, "accuracy_mean": 0.99, "accuracy_se": 0.001,
                     "ood_auroc_entropy_mean": 0.9, "ood_auroc_entropy_se": 0.01, "ood_auroc_mi_mean": float("nan"),
                     "ood_auroc_mi_se": float("nan"), "ood_mi_identically_zero_mean": 1.0},
                    {"method": "svi", "n": 3, "accuracy_mean": 0.98, "accuracy_se": 0.002,
                     "ood_auroc_entropy_mean": 0.92, "ood_auroc_entropy_se": 0.01, "ood_auroc_mi_mean": 0.88,
                     "ood_auroc_mi_se": 0.02, "ood_mi_identically_zero_mean": 0.0}])
    text = ood_tables(ood)
    assert "MI ≡ 0 (one deterministic predictive)" in text and "0.880 ± 0.020" in text
    gap = _summary([{"dataset": "yacht", "splits": s, "method": "svi", "n": n, "test_ll_mean": ll, "test_ll_se": 0.1,
                     "coverage_90_mean": 0.8, "coverage_90_se": 0.01} for s, n, ll in (("gap", 6, -3.0),
                                                                                        ("standard", 3, -1.0))])
    assert "| svi | -1.00 ± 0.10 | -3.00 ± 0.10 | -2.00 | 0.80 ± 0.01 | 6 |" in gap_tables(gap)
    for name, summary in (("shift-rotation", rotation), ("shift-ood", ood), ("uci-gap", gap)):
        (path,) = make_figures(name, summary, tmp_path)
        assert path.stat().st_size > 1000
