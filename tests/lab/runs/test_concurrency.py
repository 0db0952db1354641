"""Many processes, one store (issue 41): concurrent ``zoo fit --out`` writers into one runs folder and
concurrent ``zoo experiment`` into one experiment folder.

Writers are forked from this process (so that eight of them start in milliseconds, not after eight
torch imports), released at the same instant, and each runs the command line's ``main`` exactly as
``python -m zoo`` does.  Every run must be complete (:func:`lab.runs.store.verify_run`), no temporary
folder may stay, and the tables must equal those of the same commands run one after another.
"""
import json
import os
import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from lab.cli import main
from lab.grids.runner import run_experiment
from lab.runs.locks import RunLock
from lab.runs.execution import RUN_FILES
from lab.runs.store import StoreError, verify_run

FIT = ["fit", "--data", "toy1d", "--backend", "map", "--hidden", "4", "--epochs", "5",
       "--quiet"]
EXPERIMENT = ["experiment", "smoke", "--workers", "0", "--batch-fits", "1", "--quiet"]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forks its writers")


def run_at_once(commands: list, folder: Path) -> list:
    """Run ``main(command)`` for every command in its own forked process, all released at once.

    Returns ``[(pid, exit status, stderr text)]`` in command order.  A child's stdout and stderr go to
    files in ``folder``.
    """
    gate_read, gate_write = os.pipe()
    children = []
    for k, command in enumerate(commands):
        pid = os.fork()
        if pid == 0:  # the writer: wait at the gate, then run the command
            status = 70
            try:
                os.close(gate_write)
                for fd, name in ((1, "out"), (2, "err")):
                    handle = os.open(folder / f"{name}-{k}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(handle, fd)
                    os.close(handle)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # (pytest replaced the Python streams)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                os.read(gate_read, 1)
                status = main(command)
            except BaseException as err:  # noqa: BLE001 - reported through the exit status and stderr
                os.write(2, f"UNCAUGHT {type(err).__name__}: {err}\n".encode())
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        children.append(pid)
    os.close(gate_read)
    os.write(gate_write, b"x" * len(commands))  # open the gate: every writer starts now
    os.close(gate_write)
    outcomes = []
    for k, pid in enumerate(children):
        _, status = os.waitpid(pid, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        outcomes.append((pid, code, (folder / f"err-{k}.txt").read_text()))
    return outcomes


def without_timings(record: dict) -> dict:
    """A metrics record without what differs between two identical runs: wall and CPU times."""
    return {k: v for k, v in record.items() if not k.endswith("_seconds")}


def table_without_timings(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    return table[[c for c in table.columns if not c.endswith("_seconds")]].sort_values("key").reset_index(drop=True)


def leftovers(folder: Path) -> list:
    """Temporary files and folders (``.NAME.partial-…``, ``.old-``, ``.tmp-``) anywhere under ``folder``."""
    return [p for p in folder.rglob(".*") if re.search(r"\.(partial|old|tmp)-", p.name)]


def test_eight_fit_writers_into_one_runs_folder_equal_a_sequential_run(tmp_path):
    runs = tmp_path / "runs"
    contested = runs / "contested"
    commands = [[*FIT, "--seed", str(seed), "--out", str(runs / f"seed-{seed}")] for seed in range(6)]
    commands += [[*FIT, "--seed", str(seed), "--out", str(contested), "--overwrite"] for seed in (0, 1)]
    outcomes = run_at_once(commands, tmp_path)
    assert [code for _, code, _ in outcomes] == [0] * 8, outcomes
    assert not leftovers(tmp_path) and sorted(p.name for p in runs.iterdir()) == [
        "contested", *(f"seed-{s}" for s in range(6))]
    sequential = tmp_path / "sequential"
    for seed in range(6):
        assert main([*FIT, "--seed", str(seed), "--out", str(sequential / f"seed-{seed}")]) == 0
    for seed in range(6):
        verify_run(runs / f"seed-{seed}", RUN_FILES)
        for name in ("metrics.json", "config.json"):
            concurrent = json.loads((runs / f"seed-{seed}" / name).read_text())
            alone = json.loads((sequential / f"seed-{seed}" / name).read_text())
            assert without_timings(concurrent) == without_timings(alone), (seed, name)
    verify_run(contested, RUN_FILES)  # two writers replaced each other: one run whole, never a mix
    metrics = json.loads((contested / "metrics.json").read_text())
    config = json.loads((contested / "config.json").read_text())
    assert metrics["seed"] == config["spec"]["seed"] in (0, 1)
    reference = json.loads((sequential / f"seed-{metrics['seed']}" / "metrics.json").read_text())
    assert without_timings(metrics) == without_timings(reference)


def test_eight_experiments_on_one_folder_wait_or_refuse_and_never_interleave(tmp_path):
    out, other = tmp_path / "exp", tmp_path / "other"
    commands = [[*EXPERIMENT, "--out", str(out), "--wait"] for _ in range(3)]  # take their turn
    commands += [[*EXPERIMENT, "--out", str(out)] for _ in range(3)]  # refuse if the folder is in use
    commands += [[*EXPERIMENT, "--out", str(other), "--runs", str(out / "runs")] for _ in range(2)]  # shared runs
    outcomes = run_at_once(commands, tmp_path)
    pids = {pid for pid, _, _ in outcomes}
    waiting, impatient, sharing = outcomes[:3], outcomes[3:6], outcomes[6:]
    assert all(code == 0 for _, code, _ in waiting), waiting
    for group in (impatient, sharing):  # one of each group may find its folder free; the others are refused
        refused = [err for _, code, err in group if code == 2]
        assert len(refused) >= len(group) - 1 and all(code in (0, 2) for _, code, _ in group), group
        for err in refused:
            holder = re.search(r"is in use by pid (\d+) on .*choose another --out", err)
            assert holder and int(holder.group(1)) in pids and "Traceback" not in err, err
    assert sum(code == 0 for _, code, _ in sharing) == 1
    assert not leftovers(tmp_path)
    reference = run_experiment("smoke", tmp_path / "sequential", workers=0, progress=False, batch_fits=1)
    assert not reference["failures"]
    for folder in (out, other):
        for run in (out / "runs").iterdir():
            verify_run(run, RUN_FILES)
        pd.testing.assert_frame_equal(table_without_timings(folder / "results.csv"),
                                      table_without_timings(tmp_path / "sequential" / "results.csv"))


def test_the_lock_waits_its_turn_then_refuses_with_the_holder(tmp_path):
    told = []
    with RunLock(tmp_path):
        started = time.monotonic()
        with pytest.raises(StoreError, match=rf"in use by pid {os.getpid()} on .*\(waited 1 s\).*--wait"):
            with RunLock(tmp_path, wait=0.6, on_wait=told.append):
                pass
        assert 0.5 < time.monotonic() - started < 5 and len(told) == 1 and f"pid {os.getpid()}" in told[0]
    with RunLock(tmp_path, wait=0.6):  # free again: taken at once
        pass


def test_a_negative_wait_is_refused(tmp_path, capsys):
    assert main([*EXPERIMENT, "--out", str(tmp_path / "x"), "--wait", "-1"]) == 2
    assert "--wait must be" in capsys.readouterr().err


# ------------------------------------------------------------------ the pieces: re-checked rename, stale temporaries
@pytest.fixture(scope="module")
def small_result():
    from lab.runs.spec import RunSpec
    from lab.runs.execution import execute

    return execute(RunSpec(data="toy1d", hidden=[4], epochs=3, num_samples=10), progress=False)


def _another_writer_gets_there_first(monkeypatch, target: Path, seed: int):
    """``os.replace`` in lab.runs.store: just before the first rename onto ``target``, a run of ``seed`` appears."""
    import lab.runs.store

    real = os.replace

    def replace(source, destination):
        if Path(destination) == target and not target.exists():
            target.mkdir()
            (target / "metrics.json").write_text(json.dumps({"seed": seed}))
            (target / "config.json").write_text(json.dumps({"seed": seed}))
        return real(source, destination)

    monkeypatch.setattr(lab.runs.store.os, "replace", replace)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_run_renamed_into_place_by_another_writer_meanwhile_is_kept_or_replaced_whole(tmp_path, monkeypatch,
                                                                                       small_result, overwrite):
    from lab.runs.execution import write_run

    target = tmp_path / "run"
    _another_writer_gets_there_first(monkeypatch, target, seed=99)
    if not overwrite:
        with pytest.raises(StoreError, match="already holds a run"):
            write_run(small_result, target)
        assert json.loads((target / "metrics.json").read_text()) == {"seed": 99}  # the other writer's run
    else:
        write_run(small_result, target, overwrite=True)
        verify_run(target, RUN_FILES)  # ours, whole: the other one was swapped out and deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    import socket
    import subprocess

    from lab.runs.store import remove_stale_temporaries

    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    names = {f".run.partial-{host}-{dead.pid}-abc123": "dead", f".run.old-{host}-{dead.pid}-x_9": "dead",
             f".results.csv.tmp-{host}-{dead.pid}-q1": "dead", f".run.partial-{host}-{os.getpid()}-live": "live",
             f".run.partial-elsewhere-{dead.pid}-abc": "other host", ".run.partial-junk": "not ours",
             "run": "a run", f".a.tmp-b.partial-{host}-{dead.pid}-zz": "dead"}
    for name in names:
        (tmp_path / name).mkdir() if "csv" not in name else (tmp_path / name).write_text("half")
    removed = {p.name for p in remove_stale_temporaries(tmp_path)}
    assert removed == {n for n, kind in names.items() if kind == "dead"}
    assert {p.name for p in tmp_path.iterdir()} == {n for n, kind in names.items() if kind != "dead"}
