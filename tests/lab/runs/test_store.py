"""Run folders: written whole or not at all, never mixed, re-checked on resume, locked per experiment."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lab.runs.execution
import lab.runs.store
from lab.runs.evaluation import RunFailed
from lab.runs.spec import RunSpec
from lab.runs.execution import RUN_FILES, execute, write_run
from lab.runs.store import COMPLETE, RunLock, StoreError, WriteError, check_destination, staged_directory, verify_run

ROOT = Path(__file__).resolve().parents[3]
SPEC = RunSpec(data="toy1d", hidden=[4], epochs=3, num_samples=10)


@pytest.fixture(scope="module")
def result():
    return execute(SPEC, progress=False)


def _snapshot(directory: Path) -> dict:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _attempt(result, attempt: int):
    """``result`` labelled ``attempt`` in both its metrics and its config (a mixed folder would disagree)."""
    result.metrics["attempt"] = attempt
    result.config["attempt"] = attempt
    return result


def _assert_whole(directory: Path, allowed: set) -> None:
    verify_run(directory, RUN_FILES)
    metrics = json.loads((directory / "metrics.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    assert metrics["attempt"] == config["attempt"] and metrics["attempt"] in allowed


def test_written_run_is_sealed_and_verified(tmp_path, result):
    directory = write_run(_attempt(result, 0), tmp_path / "run")
    manifest = verify_run(directory, RUN_FILES)
    assert set(manifest["files"]) == {"metrics.json", "config.json", "posterior.nc", "train.nc",
                                      "posterior/posterior.pt", "posterior/posterior.json", "posterior/info.json"}
    assert (directory / "posterior.nc").stat().st_size == manifest["files"]["posterior.nc"]["size"]
    assert not [p for p in tmp_path.iterdir() if p.name != "run"]  # no temporary sibling left
    assert oct(directory.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "posterior.nc").write_bytes((d / "posterior.nc").read_bytes()[:100]), "bytes"),
    (lambda d: shutil.rmtree(d / "posterior"), "missing"),
    (lambda d: (d / "metrics.json").write_text((d / "metrics.json").read_text().replace("0", "1")), "SHA-256"),
    (lambda d: (d / COMPLETE).unlink(), "unfinished or interrupted"),
    (lambda d: (d / COMPLETE).write_text("{"), "unreadable"),
])
def test_verify_run_catches_truncated_deleted_changed_and_unsealed_files(tmp_path, result, damage, message):
    directory = write_run(_attempt(result, 0), tmp_path / "run")
    damage(directory)
    with pytest.raises(StoreError, match=message):
        verify_run(directory, RUN_FILES)


def test_existing_run_is_kept_unless_overwrite_then_replaced_whole(tmp_path, result):
    directory = write_run(_attempt(result, 0), tmp_path / "run")
    (directory / "report.html").write_text("stale")
    before = _snapshot(directory)
    with pytest.raises(StoreError, match="already holds a run; pass --overwrite"):
        write_run(_attempt(result, 1), directory)
    assert _snapshot(directory) == before
    write_run(_attempt(result, 2), directory, overwrite=True)
    _assert_whole(directory, {2})
    assert not (directory / "report.html").exists()  # replaced whole: nothing of the old run is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_destination_checks(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        check_destination(tmp_path / "file")
    with pytest.raises(StoreError, match="is a file"):
        check_destination(tmp_path / "file" / "run")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("x")
    with pytest.raises(StoreError, match="not a run; refusing"):
        check_destination(tmp_path / "notes", overwrite=True)
    (tmp_path / "empty").mkdir()
    assert check_destination(tmp_path / "empty") == tmp_path / "empty"
    assert check_destination(tmp_path / "a" / "b") == tmp_path / "a" / "b"  # parents are made when writing
    if os.path.isdir("/proc/self"):
        with pytest.raises(StoreError, match="cannot write"):
            check_destination("/proc/self/run")


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
def test_error_or_interrupt_while_writing_leaves_the_old_run(tmp_path, result, monkeypatch, error):
    directory = write_run(_attempt(result, 0), tmp_path / "run")
    before = _snapshot(directory)

    def interrupted(idata, path):
        Path(path).write_bytes(b"half")
        raise error

    monkeypatch.setattr(lab.runs.execution, "save_netcdf", interrupted)  # runs in the forked writer (lab.runs.isolated)
    with pytest.raises(KeyboardInterrupt if isinstance(error, KeyboardInterrupt) else WriteError,
                       match=None if isinstance(error, KeyboardInterrupt) else "No space left on device.*unchanged"):
        write_run(_attempt(result, 1), directory, overwrite=True)
    assert _snapshot(directory) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _kill_self(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def _patch(owner, name, make) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def _kill_between_renames() -> None:
    """No atomic swap: kill after the old run is moved aside, before the new one is moved in."""
    _patch(lab.runs.store, "_exchange", lambda f: lambda a, b: False)
    _patch(lab.runs.store.os, "replace", lambda f: lambda a, b: (f(a, b), _kill_self() if ".old-" in str(b) else None))


KILL_POINTS = {  # installed in the child, which dies (SIGKILL) at that step of replacing the run
    "while writing files": lambda: _patch(
        lab.runs.execution, "_write_json", lambda f: lambda path, obj: (Path(path).write_bytes(b"half"), _kill_self())),
    "before sealing": lambda: _patch(lab.runs.store, "seal", lambda f: _kill_self),
    "sealing, before the marker": lambda: _patch(
        lab.runs.store.os, "replace", lambda f: lambda a, b: _kill_self() if str(b).endswith(COMPLETE) else f(a, b)),
    "before the swap": lambda: _patch(lab.runs.store, "_exchange", lambda f: _kill_self),
    "after the swap": lambda: _patch(lab.runs.store, "_exchange", lambda f: lambda a, b: (f(a, b), _kill_self())),
    "deleting the old run": lambda: _patch(
        lab.runs.store.shutil, "rmtree", lambda f: lambda path, **kw: (next(Path(path).rglob("*.json")).unlink(),
                                                                  _kill_self())),
    "between the two renames (no atomic swap)": _kill_between_renames,
}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_at_each_step_of_a_write_leaves_the_old_run_or_none(tmp_path, result, point):
    directory = write_run(_attempt(result, 0), tmp_path / "run")
    pid = os.fork()
    if pid == 0:  # the child replaces the run and is killed at the chosen step
        try:
            KILL_POINTS[point]()
            write_run(_attempt(result, 1), directory, overwrite=True)
        finally:
            os._exit(3)  # only reached if the kill point was never hit
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"child exited: {status}"
    if point.startswith("between"):
        assert not directory.exists()  # the old run moved aside, the new one not yet in place
    else:
        _assert_whole(directory, {0, 1})
    # the next write finds no obstacle, and removes what the killed writer left behind
    write_run(_attempt(result, 2), directory, overwrite=True)
    _assert_whole(directory, {2})
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_sigkill_of_the_fit_command_at_random_moments(tmp_path):
    directory = tmp_path / "run"
    command = [sys.executable, "-m", "zoo", "fit", "--data", "toy1d", "--hidden", "4", "--epochs", "40",
               "--num-samples", "20", "--quiet", "--out", str(directory), "--overwrite"]
    subprocess.run([*command, "--seed", "0"], cwd=ROOT, check=True, capture_output=True)  # a cold start
    # when a warm run's folder appears (its rename into place; interpreter shutdown follows and takes seconds)
    probe = tmp_path / "probe"
    started = time.perf_counter()
    process = subprocess.Popen([*command[:-2], str(probe), "--seed", "0"], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    while not probe.exists() and process.poll() is None:
        time.sleep(0.01)
    duration = time.perf_counter() - started
    process.wait()
    interrupted = 0  # kills that landed before the run's folder was renamed into place
    for k, fraction in enumerate((0.8, 0.9, 0.97)):  # (imports take ~70%) fit, predict/export, writing
        process = subprocess.Popen([*command, "--seed", str(k + 1)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        time.sleep(fraction * duration)
        process.kill()
        process.wait()
        verify_run(directory, RUN_FILES)
        metrics = json.loads((directory / "metrics.json").read_text())
        config = json.loads((directory / "config.json").read_text())
        assert metrics["seed"] == config["spec"]["seed"]  # one run's files, never two runs' mixed
        assert metrics["seed"] <= k + 1  # the killed run's files or an earlier run's, never a later one's
        interrupted += metrics["seed"] != k + 1
    assert interrupted >= 1  # at least one kill hit a run mid-way (else the test checked nothing)


def test_all_divergent_sampler_is_a_failed_run_and_writes_nothing(tmp_path):
    spec = RunSpec(data="toy1d", hidden=[4], backend="hmc", num_samples=5,
                   backend_options=dict(num_chains=1, warmup_steps=0, step_size=50.0, adapt_step_size=False,
                                        init="current", num_steps=2, compile=False))
    with pytest.warns(RuntimeWarning, match="diverged"), pytest.raises(RunFailed, match="every one of the 5"):
        execute(spec, tmp_path / "run", progress=False)
    assert not list(tmp_path.iterdir())


def test_non_finite_draws_are_a_failed_run(tmp_path, monkeypatch):
    from inference.posterior import SamplePosterior

    def nan_fit(bnn, x, y, **kwargs):
        draws = {site.name: torch.full((1, 3, *site.shape), float("nan")) for site in bnn.sites}
        return SamplePosterior(bnn, draws, info={"backend": "nan-sampler"})

    monkeypatch.setattr(lab.runs.execution, "fit", nan_fit)
    with pytest.raises(RunFailed, match="non-finite draws"):
        execute(SPEC, tmp_path / "run", progress=False)
    assert not list(tmp_path.iterdir())


def test_lock_names_its_holder_and_is_released(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(StoreError, match=f"in use by pid {os.getpid()} on "):
            with RunLock(tmp_path):
                pass
    with RunLock(tmp_path):  # released on exit
        pass


def test_staged_directory_refuses_a_run_that_appeared_meanwhile(tmp_path, result):
    target = tmp_path / "run"
    with pytest.raises(StoreError, match="already holds a run"):
        with staged_directory(target) as staging:
            (staging / "metrics.json").write_text("{}")
            write_run(_attempt(result, 5), target)  # another writer finishes first
    _assert_whole(target, {5})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
