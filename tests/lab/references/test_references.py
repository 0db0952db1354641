"""Reference posteriors (lab.references.build) and scoring runs against them (lab.references.fidelity, python -m zoo fidelity).

The references here are the seconds-long ``--tiny`` builds (two chains of ten draws): they exercise the
build, the store, the checks and the scoring; the real references are data built on demand
(``python -m zoo reference build NAME``; RESULTS, section 10).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from lab.cli import main
from lab.report import open_run, render_section
from lab.report.compare import runs_table
from lab.references.fidelity import score_run, write_fidelity
from lab.references.diagnostics import predictive_diagnostics
from lab.references.problems import PROBLEMS, get_problem, problem_data, problem_model
from lab.references.build import ARRAYS, MANIFEST, build_reference, load_reference, reference_path
from lab.runs.store import StoreError, replace_run_file, verify_run

TOY_FIT = ["fit", "--data", "toy1d", "--hidden", "50", "--activation", "tanh", "--prior", "fan-in", "--prior-scale",
           "3", "--quiet"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A references root holding the tiny toy1d reference, built through the CLI."""
    path = tmp_path_factory.mktemp("references")
    previous = os.environ["BNN_ZOO_REFERENCES"]
    os.environ["BNN_ZOO_REFERENCES"] = str(path)
    try:
        assert main(["reference", "build", "toy1d", "--tiny", "--quiet"]) == 0
        yield path
    finally:
        os.environ["BNN_ZOO_REFERENCES"] = previous


@pytest.fixture
def in_root(root, monkeypatch):
    monkeypatch.setenv("BNN_ZOO_REFERENCES", str(root))
    return root


def test_tiny_reference_is_sealed_data_with_its_manifest(in_root, capsys):
    reference = load_reference("toy1d")
    manifest = reference.manifest
    verify_run(reference.path, (MANIFEST, ARRAYS))
    assert manifest["tiny"] is True and manifest["meets_targets"] is False
    assert manifest["sampler"]["seeds"] == {"a": [1000], "b": [2000]}
    assert manifest["model"]["sites"]["fc1.weight"] == [50, 1] and manifest["model"]["prior"] == "FanInNormalPrior(scale=3.0)"
    assert set(manifest["versions"]) >= {"bnn-zoo", "torch", "pyro", "arviz", "numpy", "python"}
    assert set(manifest["noise_floor"]) == {"w2", "reference_coverage_90"}
    a = reference.half("a")
    assert a["test/loc"].shape == (2, 10, 500, 1) and a["grid/loc"].shape == (2, 10, 200, 1)
    assert a["test/scale"].shape == (2, 10, 1, 1) and a["test/loc"].dtype == np.float32
    assert reference.mixture().loc.shape == (20, 500, 1)
    assert manifest["rhat_max"] == max(manifest["diagnostics"][h]["rhat_max"] for h in "ab")
    assert main(["reference", "list"]) == 0
    assert "toy1d         built (tiny)" in capsys.readouterr().out


def test_reference_build_refuses_before_any_work(in_root, capsys):
    assert main(["reference", "build", "toy1d", "--tiny", "--quiet"]) == 2  # already built, no --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert main(["reference", "build", "nope"]) == 2
    assert "valid references: toy1d, moons" in capsys.readouterr().err


def test_load_reference_refuses_missing_and_damaged_folders(in_root, tmp_path):
    with pytest.raises(StoreError, match="build it with: python -m zoo reference build moons"):
        load_reference("moons")
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (MANIFEST, ARRAYS, "COMPLETE"):
        (copy / name).write_bytes((in_root / "toy1d" / name).read_bytes())
    load_reference(copy)
    with open(copy / ARRAYS, "r+b") as fh:  # one flipped byte
        fh.seek(200)
        byte = fh.read(1)
        fh.seek(200)
        fh.write(bytes([byte[0] ^ 1]))
    with pytest.raises(StoreError, match="differs from what was written"):
        load_reference(copy)
    with pytest.raises(ValueError, match="unknown reference"):
        reference_path("nope")


def test_tiny_run_is_scored_on_fit_and_by_the_command(in_root, tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TOY_FIT, "--backend", "map", "--epochs", "20", "--out", str(run)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["fidelity_reference"] == "toy1d"  # a built reference has this run's data and network
    assert metrics["fidelity"]["toy1d"]["num_draws"] == 1
    capsys.readouterr()
    assert main(["fidelity", str(run), "--reference", "toy1d"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) >= {"w2", "noise_floor", "reference_coverage_90", "ratio_to_noise_floor"}
    assert printed["w2"] == pytest.approx(metrics["fidelity_w2"])  # the same prediction: the run's seed
    assert printed["noise_floor"]["w2"] == load_reference("toy1d").manifest["noise_floor"]["w2"]
    verify_run(run)  # still complete and consistent
    again = json.loads((run / "metrics.json").read_text())
    assert again["fidelity_w2"] == pytest.approx(printed["w2"]) and again["rmse"] == metrics["rmse"]
    section = render_section(run, "Fidelity")
    assert "W2 to the reference predictive" in section and "misses its convergence targets" in section
    assert "fidelity_w2" in runs_table([open_run(run)], {})


def test_report_section_without_a_reference(tmp_path):
    run = tmp_path / "run"
    assert main([*TOY_FIT, "--hidden", "4", "--backend", "map", "--epochs", "2", "--out", str(run)]) == 0
    assert "not scored against a reference posterior" in render_section(run, "Fidelity")


@pytest.mark.parametrize("extra, message", [
    (["--hidden", "8"], "model differs from reference toy1d's in its net"),
    (["--seed", "1"], "other training data"),
])
def test_fidelity_refuses_another_model_or_other_data(in_root, tmp_path, capsys, extra, message):
    run = tmp_path / "run"
    args = [a for a in TOY_FIT if a not in ("--hidden", "50")] if "--hidden" in extra else list(TOY_FIT)
    assert main([*args, *extra, "--backend", "map", "--epochs", "5", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["fidelity", str(run), "--reference", "toy1d"]) == 2
    assert message in capsys.readouterr().err


def test_fidelity_refuses_a_damaged_run_and_an_unknown_reference(in_root, tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TOY_FIT, "--backend", "map", "--epochs", "5", "--out", str(run)]) == 0
    assert main(["fidelity", str(run), "--reference", "nope"]) == 2
    assert "unknown reference 'nope'" in capsys.readouterr().err
    (run / "config.json").write_text("{}")
    assert main(["fidelity", str(run), "--reference", "toy1d"]) == 2
    assert "damaged" in capsys.readouterr().err
    assert main(["fidelity", str(tmp_path / "none"), "--reference", "toy1d"]) == 2


def test_replace_run_file_keeps_the_run_whole(tmp_path):
    run = tmp_path / "run"
    assert main([*TOY_FIT, "--hidden", "4", "--backend", "map", "--epochs", "2", "--out", str(run)]) == 0
    (run / "report.html").write_text("<p>written after the run</p>")  # unlisted, as fit --report leaves it
    replace_run_file(run, "metrics.json", '{"new": 1}')
    files = verify_run(run)["files"]
    assert json.loads((run / "metrics.json").read_text()) == {"new": 1}
    assert "report.html" in files and (run / "report.html").read_text() == "<p>written after the run</p>"
    assert not [p for p in run.parent.iterdir() if ".partial-" in p.name]
    for bad in ("COMPLETE", "posterior/x", ""):
        with pytest.raises(StoreError, match="top-level file"):
            replace_run_file(run, bad, "x")
    (run / "config.json").write_text("{}")
    with pytest.raises(StoreError, match="damaged"):
        replace_run_file(run, "metrics.json", "{}")


def test_write_fidelity_adds_records_by_reference(in_root, tmp_path):
    run = tmp_path / "run"
    assert main([*TOY_FIT, "--backend", "map", "--epochs", "5", "--out", str(run)]) == 0
    record = score_run(run, "toy1d")
    metrics = write_fidelity(run, {**record, "reference": "other"})
    assert set(metrics["fidelity"]) == {"toy1d", "other"} and metrics["fidelity_reference"] == "other"
    verify_run(run)


def test_predictive_diagnostics_on_known_chains():
    g = torch.Generator().manual_seed(0)
    iid = torch.randn(4, 500, 3, 1, generator=g).numpy()
    stuck = iid + np.array([0, 0, 0, 3.0]).reshape(4, 1, 1, 1)  # one chain elsewhere
    constant = np.ones((4, 500, 2, 1), dtype=np.float32)
    good = predictive_diagnostics({"test/loc": iid, "test/scale": constant})
    assert good["rhat_max"] < 1.01 and 1500 < good["ess_bulk_min"] <= 2600
    assert good["by_quantity"]["test/scale"]["constant"] == 2 and good["by_quantity"]["test/loc"]["quantities"] == 3
    assert predictive_diagnostics({"test/loc": stuck})["rhat_max"] > 1.3  # one chain 3 sd away
    # two fits of two chains, each fit mixing but the second 3 sd away: within each fit R-hat ≈ 1, over the half not
    modes = iid + np.array([0, 0, 3.0, 3.0]).reshape(4, 1, 1, 1)
    split = predictive_diagnostics({"test/loc": modes}, chains_per_fit=2)
    assert split["rhat_max"] > 1.3 and len(split["within_fits"]) == 2
    assert all(fit["rhat_max"] < 1.01 and fit["ess_bulk_min"] > 500 for fit in split["within_fits"])  # 1 000 iid draws
    assert max(fit["rhat_max"] for fit in predictive_diagnostics({"test/loc": stuck}, 2)["within_fits"]) > 1.3
    for bad in (1, 3):
        with pytest.raises(ValueError, match="chains_per_fit"):
            predictive_diagnostics({"test/loc": iid}, chains_per_fit=bad)
    with pytest.raises(ValueError, match="at least 2 chains"):
        predictive_diagnostics({"test/loc": iid[:1]})
    with pytest.raises(ValueError, match="share"):
        predictive_diagnostics({"a": iid, "b": iid[:, :10]})


def test_every_problem_builds_its_model_on_its_data():
    """The problems' specs are valid and their models the sizes RESULTS describes (frozen bodies aside)."""
    sizes = {"toy1d": 152, "moons": 354, "energy-small": 102, "yacht-small": 82}
    for name, expected in sizes.items():
        problem = get_problem(name)
        bnn = problem_model(problem, problem_data(problem), seed=0)
        assert bnn.num_random == expected, name
    assert {p.name for p in PROBLEMS.values() if p.frozen_body} == {"energy-last", "digits-last"}
    with pytest.raises(ValueError, match="frozen body"):
        problem_data(get_problem("energy-last"))


@pytest.mark.slow
def test_tiny_frozen_body_reference(tmp_path):
    """A last-layer problem: the body is trained, stored with the reference, and its features are the data."""
    path = build_reference("energy-last", tmp_path / "energy-last", tiny=True, progress=False)
    reference = load_reference(path)
    body = reference.body()
    assert body is not None and body["fc1.weight"].shape == (50, 8)
    data = problem_data(reference.problem, body)
    assert data.x_train.shape == (691, 50) and reference.manifest["data"]["fingerprint"] == data.fingerprint()
    assert reference.manifest["model"]["sites"] == {"out.weight": [1, 50], "out.bias": [1]}


def test_tiny_smc_reference_stores_one_chain_per_run(tmp_path):
    """An SMC problem (yacht-small): each half is independent SMC runs, each run's particles one "chain" of the
    diagnostics; the manifest names the sampler, its settings and every run's final-stage ESS."""
    from lab.references.problems import TINY_SMC

    problem = get_problem("yacht-small")
    assert problem.method == "smc" and problem.fits >= 8 and get_problem("toy1d").method == "nuts"
    path = build_reference(problem, tmp_path / "yacht-small", tiny=True, progress=False)
    reference = load_reference(path)
    manifest = reference.manifest
    assert manifest["sampler"]["backend"] == "smc" and manifest["sampler"]["options"] == TINY_SMC
    assert manifest["sampler"]["seeds"] == {"a": [1000, 1001], "b": [2000, 2001]}
    particles, tests = TINY_SMC["num_particles"], len(problem_data(problem).x_test)
    assert reference.half("b")["test/loc"].shape == (2, particles, tests, 1)
    assert reference.half("a")["test/scale"].shape == (2, particles, 1, 1)
    assert manifest["diagnostics"]["a"]["chains"] == 2 and "within_fits" not in manifest["diagnostics"]["a"]
    for record in manifest["fits"]["a"]:
        assert 1 <= record["final_ess"] <= particles and record["betas"][-1] == 1.0
        assert math.isfinite(record["log_evidence"]) and record["num_stages"] == len(record["betas"])
    with pytest.raises(ValueError, match="num_particles must be at least 2"):
        build_reference(problem, tmp_path / "bad", sampler={**TINY_SMC, "num_particles": 1}, progress=False)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="unknown method 'mh'; valid methods: nuts, smc"):
        dataclasses.replace(problem, method="mh")
