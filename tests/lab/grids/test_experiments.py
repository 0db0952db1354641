"""The experiment runner: caching, dependencies, failures, tables, the CLI, locking, workers and Ray."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lab.grids import uci as uci_grids
from lab.runs.spec import RunSpec
from zoo.architectures import build_architecture, output_modules
from lab.cli import main
from zoo.data import Dataset
from lab.grids.runner import run_experiment
from lab.grids.experiment import Experiment, GridRun, frozen_features
from lab.grids.worker import is_finished, outdated
from lab.grids.registry import EXPERIMENTS
from lab.runs.store import RunLock, seal
from lab.grids.tables import summarise

ROOT = Path(__file__).resolve().parents[3]


def _mtimes(out):
    return {p.parent.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*/metrics.json")}


def test_smoke_grid_writes_tables_and_second_run_skips_everything(tmp_path, monkeypatch):
    EXPERIMENTS_BUILD = EXPERIMENTS["smoke"].build
    out = tmp_path / "smoke"
    first = run_experiment("smoke", out, workers=0, progress=False)
    assert first["skipped"] == 0 and not first["failures"]
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 6 and {"key", "variant", "seed", "rmse", "test_ll", "coverage_90", "run_seconds"} <= set(
        results.columns)
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["variant"]) == ["det", "full", "frozen head"] and list(summary["n"]) == [2, 2, 2]
    table = (out / "summary.md").read_text()
    assert "| variant | n | rmse | test_ll | coverage_90 |" in table and " ± " in table
    summed = results["run_seconds"].sum()
    assert f"Wall time of this invocation: {first['wall_seconds']:.0f} s (6 runs fitted, 0 found done" in table
    assert f"summed run times of the 6 runs in the table: {summed:.0f} s" in table
    assert first["wall_seconds"] >= 0.9 * summed  # one process (workers=0): the runs happen within the wall time
    before = _mtimes(out)
    second = run_experiment("smoke", out, workers=0, progress=False)
    assert second["skipped"] == 6 and _mtimes(out) == before  # nothing re-run
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), results)
    # damaged runs (a truncated posterior.nc, a deleted posterior/, a rewritten metrics.json) and an
    # unsealed one are re-run, and only they
    runs = {r.key: r for r in EXPERIMENTS["smoke"].build(False, None)}
    nc = out / "runs" / "full-1" / "posterior.nc"
    nc.write_bytes(nc.read_bytes()[: nc.stat().st_size // 2])
    shutil.rmtree(out / "runs" / "full-0" / "posterior")
    (out / "runs" / "det-1" / "metrics.json").write_text(json.dumps({"rmse": 1.0}))
    (out / "runs" / "head-1" / "COMPLETE").unlink()
    damaged = ("full-1", "full-0", "det-1", "head-1")
    assert not any(is_finished(out / "runs", runs[key]) for key in damaged)
    third = run_experiment("smoke", out, workers=0, progress=False)
    assert third["skipped"] == 2 and all(is_finished(out / "runs", runs[key]) for key in damaged)
    assert len(pd.read_csv(out / "results.csv")) == 6
    # a run whose spec changed is not taken from the cache
    changed = GridRun("det-0", RunSpec(**{**runs["det-0"].spec.to_dict(), "epochs": 4}), {})
    assert is_finished(out / "runs", runs["det-0"]) and not is_finished(out / "runs", changed)
    assert outdated(out / "runs", [changed, runs["det-1"]]) == ["det-0"]  # said, not silently left out
    grid = EXPERIMENTS["smoke"]
    monkeypatch.setattr(grid, "build", lambda fast, root: [changed if r.key == "det-0" else r
                                                           for r in EXPERIMENTS_BUILD(fast, root)])
    fourth = run_experiment("smoke", out, workers=0, progress=False, only="^full-")
    assert fourth["outdated"] == ["det-0"] and fourth["skipped"] == 2


def test_frozen_features_span_the_networks_heads():
    torch.manual_seed(0)
    net = build_architecture("multilstm", 3, 3, hidden=5)
    x = torch.randn(40, 4, 3)
    data = Dataset("seq", "regression", x[:30], torch.randn(30, 3), x[30:], torch.randn(10, 3),
                   torch.zeros(1, 1, 3), torch.ones(1, 1, 3), torch.zeros(3), torch.ones(3))
    features = frozen_features(data, net)
    kept = features.info["whitened"]["kept"]
    assert features.x_train.shape == (30, kept) and features.info["whitened"]["of"] == 15
    assert torch.equal(features.y_train, data.y_train)
    z = features.x_train.double()
    assert torch.allclose(z.T @ z / 30, torch.eye(kept, dtype=torch.double), atol=1e-4)  # whitened
    # a linear head on the features reproduces the three heads exactly, on training and test inputs
    design = torch.cat([z, torch.ones(30, 1, dtype=torch.double)], 1)
    with torch.no_grad():
        coef = torch.linalg.lstsq(design, net(x[:30]).double()).solution
        test_design = torch.cat([features.x_test.double(), torch.ones(10, 1, dtype=torch.double)], 1)
        assert torch.allclose(test_design @ coef, net(x[30:]).double(), atol=1e-4)
    # unwhitened (for log-variance heads): the heads' own input, so the heads' weights apply as they are
    states = frozen_features(data, net, whiten=False)
    assert states.info["whitened"] is None and states.x_train.shape == (30, 15)
    heads = [net.get_submodule(n) for n in output_modules(net, x[:2])]
    with torch.no_grad():
        outputs = torch.cat([h(states.x_test) for h in heads], 1)
        assert torch.allclose(outputs, net(x[30:]), atol=1e-5)


def test_summarise_mean_and_standard_error():
    results = pd.DataFrame({"variant": ["a", "a", "a", "b"], "seed": [0, 1, 2, 0], "rmse": [1.0, 2.0, 3.0, 5.0]})
    summary = summarise(results, ("variant",)).set_index("variant")
    assert summary.loc["a", "n"] == 3 and summary.loc["a", "rmse_mean"] == 2.0
    assert summary.loc["a", "rmse_se"] == pytest.approx(1.0 / np.sqrt(3))
    assert np.isnan(summary.loc["b", "rmse_se"])  # one run: no error bar, not a fake zero


def test_failed_run_is_reported_and_its_dependants_skipped(tmp_path, monkeypatch, capsys):
    common = dict(data="toy1d", model="mlp", hidden=[4], epochs=1, num_samples=5)
    ok = GridRun("ok", RunSpec(**common), {"variant": "ok"})
    bad = GridRun("bad", RunSpec(**common, backend_options={"no_such_option": 1}), {"variant": "bad"})
    child = GridRun("child", RunSpec(**common), {"variant": "child"}, dataset="frozen-features", after="bad")
    diverged = GridRun("diverged", RunSpec(data="toy1d", hidden=[4], backend="hmc", num_samples=5, backend_options=dict(
        num_chains=1, warmup_steps=0, step_size=50.0, adapt_step_size=False, init="current", num_steps=2,
        compile=False)), {"variant": "diverged"})  # every transition diverges: a failed run, not a result
    broken = Experiment("broken", "a grid with a failing run", lambda fast, root: [ok, bad, child, diverged],
                        ("variant",), ("rmse",))
    monkeypatch.setitem(EXPERIMENTS, "broken", broken)
    with pytest.warns(RuntimeWarning, match="diverged"):
        report = run_experiment("broken", tmp_path, workers=0, progress=False)
    assert set(report["failures"]) == {"bad", "child", "diverged"} and "no_such_option" in report["failures"]["bad"]
    assert report["failures"]["diverged"].startswith("RunFailed: hmc: every one of the 5 post-warm-up transitions")
    assert not (tmp_path / "runs" / "diverged").exists()
    assert "prerequisite bad failed" in (tmp_path / "failures.txt").read_text()
    assert len(pd.read_csv(tmp_path / "results.csv")) == 1
    assert "3 run(s) failed" in (tmp_path / "summary.md").read_text()
    with pytest.warns(RuntimeWarning, match="diverged"):
        assert main(["experiment", "broken", "--out", str(tmp_path), "--workers", "0", "--quiet"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize("argv, message", [
    (["experiment", "no-such-grid"], "valid experiments: euler-stochasticity"),
    (["experiment", "smoke", "--workers", "-1"], "--workers"),
    (["experiment", "uci-benchmark", "--data-root", "/no/such/folder"], "--data-root"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, argv, message, capsys):
    assert main([*argv, "--out", str(tmp_path / "x"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and message in err


def test_uci_data_root_without_datasets_is_a_clear_error(tmp_path, capsys):
    assert main(["experiment", "uci-benchmark", "--data-root", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "holds no UCI-layout dataset folder" in capsys.readouterr().err


def test_grids_cover_the_seeds_variants():
    euler = EXPERIMENTS["euler-stochasticity"].build(False, None)
    variants = {r.labels["variant"] for r in euler}
    assert {"deterministic", "last-layer SVI", "full SVI", "last-layer SGLD"} <= variants
    heads = [r for r in euler if r.labels["variant"].startswith("last")]
    assert all(r.after and r.dataset == ("frozen-states" if r.spec.likelihood == "heteroscedastic" else "frozen-features")
               for r in heads)
    assert any(r.dataset == "frozen-states" for r in heads)
    uci = EXPERIMENTS["uci-benchmark"].build(True, None)
    assert {r.labels["split"] for r in uci} == {0, 1, 2} and {r.spec.stochastic for r in uci} == {"all", "last"}
    assert len({r.labels["dataset"] for r in uci}) == 5
    structured = EXPERIMENTS["structured-stochasticity"].build(True, None)
    assert {r.labels["variant"] for r in structured} >= {"vanilla MFVI", "heavy-map", "light-const", "random-zero"}
    assert all(r.spec.noise == 0.1 and r.spec.hidden == [50, 50] for r in structured)
    assert uci_grids.uci_published({"dataset": "energy"})["MC dropout (published)"] == "1.66 / −1.99"


def test_cli_fast_smoke_run_in_worker_processes(tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["experiment", "smoke", "--fast", "--out", str(out), "--workers", "2", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "6 finished runs in the tables; this invocation: 0 found done, 0 failed" in printed and "summary.md" in printed
    inline = run_experiment("smoke", tmp_path / "inline", workers=0, progress=False)["results"]
    pooled = pd.read_csv(out / "results.csv")
    # the same seeds give the same numbers in worker processes and in this process
    np.testing.assert_allclose(pooled.sort_values("key")["rmse"], inline.sort_values("key")["rmse"], rtol=1e-5)


def test_experiment_refuses_an_output_folder_in_use(tmp_path, capsys):
    with RunLock(tmp_path):
        assert main(["experiment", "smoke", "--out", str(tmp_path), "--workers", "0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"is in use by pid {os.getpid()} on " in err and "choose another --out" in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def _descendants(pid: int) -> set:
    """Process ids below ``pid`` (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), set()).add(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        children = parents.get(todo.pop(), set()) - found
        found |= children
        todo.extend(children)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; workers die with the parent on Linux")
def test_second_experiment_exits_2_and_sigkill_leaves_no_worker_behind(tmp_path, capsys):
    out = tmp_path / "exp"
    first = subprocess.Popen([sys.executable, "-m", "zoo", "experiment", "smoke", "--out", str(out), "--workers", "2",
                              "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any((out / "runs").glob("*")) and time.monotonic() < deadline:  # workers are fitting
            assert first.poll() is None
            time.sleep(0.05)
        workers = _descendants(first.pid)
        assert len(workers) >= 2 and first.poll() is None
        assert main(["experiment", "smoke", "--out", str(out), "--workers", "0", "--quiet"]) == 2
        assert f"is in use by pid {first.pid} on " in capsys.readouterr().err
    finally:
        first.kill()
        first.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)]
    with RunLock(out):  # the kernel released the dead experiment's lock
        pass


def test_ray_executor_on_a_local_instance(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (optional extra: pip install 'bnn-zoo[ray]')")
    report = run_experiment("smoke", tmp_path / "ray", executor="ray", workers=2, progress=False)
    assert not report["failures"] and len(report["results"]) == 6
    inline = run_experiment("smoke", tmp_path / "inline", workers=0, progress=False)["results"]
    np.testing.assert_allclose(report["results"].sort_values("key")["rmse"], inline.sort_values("key")["rmse"],
                               rtol=1e-5)
    again = run_experiment("smoke", tmp_path / "ray", executor="ray", workers=2, progress=False)
    assert again["skipped"] == 6


def test_uci_grid_runs_on_any_folder_of_uci_layout_datasets(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("alpha", "beta"):
        folder = tmp_path / name
        folder.mkdir()
        np.savetxt(folder / "data.txt", rng.normal(size=(30, 4)))
        np.savetxt(folder / "index_features.txt", [0, 1, 2], fmt="%d")
        np.savetxt(folder / "index_target.txt", [3], fmt="%d")
        for k in range(4):
            order = rng.permutation(30)
            np.savetxt(folder / f"index_train_{k}.txt", order[:24], fmt="%d")
            np.savetxt(folder / f"index_test_{k}.txt", order[24:], fmt="%d")
    (tmp_path / "notes").mkdir()  # not a dataset: ignored
    runs = EXPERIMENTS["uci-benchmark"].build(True, str(tmp_path))
    assert {r.labels["dataset"] for r in runs} == {"alpha", "beta"} and {r.labels["split"] for r in runs} == {0, 1, 2}
    assert all(r.spec.data == f"uci:{tmp_path / r.labels['dataset']}" for r in runs)
    assert len(EXPERIMENTS["uci-benchmark"].build(False, str(tmp_path))) == len(runs) // 3 * 4  # all 4 splits


def test_uci_grid_has_the_likelihood_axis_split_major_and_shares_runs_with_bdl_baselines():
    uci = EXPERIMENTS["uci-benchmark"].build(True, None)
    assert len(uci) == 5 * 3 * 3 * 6  # datasets × splits × likelihoods × (svi, radial, sgld) × {all, last}
    assert {r.spec.likelihood for r in uci} == {"gaussian", "heteroscedastic", "studentt"}
    assert {(r.spec.backend, r.spec.stochastic) for r in uci} == {(b, s) for b in ("svi", "radial", "sgld")
                                                                  for s in ("all", "last")}
    sgld = [r.spec.backend_options for r in uci if r.spec.backend == "sgld"]
    assert sgld and all("step_size" not in options for options in sgld)  # the default: from the start's curvature
    splits = [r.labels["split"] for r in uci]
    assert splits == sorted(splits)  # split-major: a sweep stopped early leaves every row the same n
    bdl = EXPERIMENTS["bdl-baselines"].build(True, None)
    uci_specs = {r.key: r.spec for r in uci}
    shared = [r for r in bdl if r.labels["method"] in ("svi", "radial", "sgld") and r.labels["dataset"] != "digits"]
    assert len(shared) == 5 * 3 * 3 and all(uci_specs[r.key] == r.spec for r in shared)
    methods = {r.labels["method"] for r in bdl}
    assert {"map", "ensemble", "mc-dropout", "swag", "multiswag", "laplace (last)", "laplace (all)"} <= methods
    digits = [r for r in bdl if r.labels["dataset"] == "digits"]
    assert {r.spec.model for r in digits} == {"lenet300100"} and len(digits) == len(methods)
    assert len({r.key for r in bdl}) == len(bdl)
    nuts = EXPERIMENTS["uci-nuts"].build(True, None)
    assert len(nuts) == 15 and all(r.spec.backend == "nuts" and r.spec.stochastic == "last" for r in nuts)


def test_euler_grid_has_likelihood_rows_on_the_frozen_body_and_the_full_net():
    euler = EXPERIMENTS["euler-stochasticity"].build(True, None)
    rows = {r.labels["variant"]: r for r in euler if r.labels["formulation"].startswith("angles")}
    for likelihood in ("heteroscedastic", "studentt"):
        head, full = rows[f"last-layer SVI · {likelihood}"], rows[f"full SVI · {likelihood}"]
        assert head.spec.likelihood == full.spec.likelihood == likelihood
        assert head.after == rows["deterministic"].key  # a log-variance head reads the states unwhitened
        assert head.dataset == ("frozen-states" if likelihood == "heteroscedastic" else "frozen-features")
        assert full.after is None and full.spec.prior == "pretrained"
    assert rows["full SVI"].spec.likelihood is None  # the Gaussian rows keep their specs (finished runs stay valid)


def test_only_time_limit_and_shared_run_folder(tmp_path):
    shared = tmp_path / "store"
    first = run_experiment("smoke", tmp_path / "a", workers=0, progress=False, only="^head-0$", runs_dir=shared)
    assert set(first["results"]["key"]) == {"det-0", "head-0"}  # the match and the run it needs
    assert not (tmp_path / "a" / "runs").exists() and (shared / "head-0" / "COMPLETE").is_file()
    again = run_experiment("smoke", tmp_path / "a", workers=0, progress=False, only="^full-0$", runs_dir=shared)
    assert again["skipped"] == 0  # only full-0 was fitted, but the tables keep the runs finished before
    assert set(again["results"]["key"]) == {"det-0", "head-0", "full-0"}
    assert set(pd.read_csv(tmp_path / "a" / "results.csv")["key"]) == {"det-0", "head-0", "full-0"}
    second = run_experiment("smoke", tmp_path / "b", workers=0, progress=False, runs_dir=shared, time_limit=1e-3)
    assert second["skipped"] == 3 and second["not_started"] == 3 and len(second["results"]) == 3  # none started
    assert "Incomplete: stopped at the time limit with 3 run(s) of the grid not started" in (
        tmp_path / "b" / "summary.md").read_text()
    with pytest.raises(ValueError, match="matches no run key"):
        run_experiment("smoke", tmp_path / "c", workers=0, progress=False, only="^nothing$")


def test_a_spec_written_before_a_field_existed_is_still_finished(tmp_path):
    run_experiment("smoke", tmp_path, workers=0, progress=False, only="^det-0$")
    run = next(r for r in EXPERIMENTS["smoke"].build(False, None) if r.key == "det-0")
    config_path = tmp_path / "runs" / "det-0" / "config.json"
    config = json.loads(config_path.read_text())
    del config["spec"]["likelihood_options"]  # as written by the code before the field
    config_path.write_text(json.dumps(config))
    seal(config_path.parent)  # an intact run of the older format
    assert is_finished(tmp_path / "runs", run)
    config["spec"]["epochs"] += 1  # a real difference still counts
    config_path.write_text(json.dumps(config))
    seal(config_path.parent)
    assert not is_finished(tmp_path / "runs", run)
