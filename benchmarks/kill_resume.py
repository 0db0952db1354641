"""Kill-and-resume campaigns of an experiment grid (issue 41): SIGKILL at random moments, then resume.

``local``: ``python -m zoo experiment smoke-24 --workers 2 --batch-fits 1`` (24 runs: a deterministic
MLP, full SVI, and last-layer SVI on the first one's frozen body, 8 seeds) is killed (``SIGKILL`` to
the experiment process; its worker processes die with it) ``--kills`` times in a row, then run once
more to the end.  A kill lands a uniform random time after the process has taken the folder's lock
(imports done), within the uninterrupted grid's time to its first finished run plus one and a half
runs per worker (once every run is done: within the time of an invocation that only writes the
tables), so that the moments cover worker start-up, fits, run writes and table writes.  After every kill: no worker process is left, every
run folder is complete (:func:`lab.runs.store.verify_run`) or absent — only hidden temporaries of dead
writers may be there, and the next start removes them.  At the end: no temporary left anywhere,
one row per run, and ``results.csv`` equal to an uninterrupted run's but for wall/CPU times.

``ray``: ``--executor ray --workers 2`` on a local Ray instance; once a Ray worker process is
executing a run (``ray::run_one``) it is killed with ``SIGKILL``; the grid must finish with no
failure (Ray runs the killed run again, :data:`lab.grids.executors.RAY_RETRIES`), every run complete, one
row per run, no temporary left, the table equal to the uninterrupted local one.  ``--kills`` grids,
one worker killed in each.

    nice -n 10 python benchmarks/kill_resume.py local --kills 20 --seed 0
    nice -n 10 python benchmarks/kill_resume.py ray --kills 5 --seed 0

The last line is ``kills <n> lost 0 duplicated 0 temporaries 0 table_equal True`` when all held.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


#: seconds a worker may outlive a killed experiment: one still starting (importing torch) when its parent
#: died asks for PR_SET_PDEATHSIG only in its initializer, sees that the parent is gone and exits then
STARTING_WORKER_SECONDS = 300


def command(grid: str) -> list:
    return [sys.executable, "-m", "zoo", "experiment", grid, "--batch-fits", "1", "--quiet"]
TEMPORARY = re.compile(r"\.(partial|old|tmp)-")


def _environment() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def grid_keys(grid: str) -> list:
    sys.path.insert(0, str(ROOT))
    from lab.grids.registry import EXPERIMENTS

    return sorted(r.key for r in EXPERIMENTS[grid].build(False, None))


def temporaries(folder: Path) -> list:
    return sorted(str(p) for p in folder.rglob(".*") if TEMPORARY.search(p.name))


def check_runs(out: Path, keys: list) -> dict:
    """Every run folder under ``out/runs`` complete (verified) or absent; returns counts."""
    from lab.runs.execution import RUN_FILES
    from lab.runs.store import verify_run

    runs = out / "runs"
    visible = sorted(p.name for p in runs.iterdir() if not p.name.startswith(".")) if runs.is_dir() else []
    unknown = set(visible) - set(keys)
    if unknown:
        raise AssertionError(f"folders that are not runs of the grid: {sorted(unknown)}")
    for name in visible:
        verify_run(runs / name, RUN_FILES)  # raises StoreError on a partial or mixed run
    return {"complete": len(visible), "temporaries": len(temporaries(out))}


def table(path: Path):
    import pandas as pd

    frame = pd.read_csv(path)
    frame = frame[[c for c in frame.columns if not c.endswith("_seconds")]]
    return frame.sort_values("key").reset_index(drop=True)


def _descendants(pid: int) -> set:
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


def _holder(out: Path) -> int | None:
    try:
        return json.loads((out / ".lock").read_text())["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _run(grid: str, out: Path, extra=(), timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([*command(grid), "--out", str(out), *extra], cwd=ROOT, env=_environment(),
                          capture_output=True, text=True, timeout=timeout)


def _timed(grid: str, out: Path) -> tuple:
    """Run the grid into ``out`` to the end: (seconds from taking the lock to the end, to the first finished run)."""
    process = subprocess.Popen([*command(grid), "--out", str(out), "--workers", "2"], cwd=ROOT, env=_environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while _holder(out) != process.pid and process.poll() is None:
        time.sleep(0.02)
    locked, first = time.perf_counter(), None
    while process.poll() is None:
        if first is None and any((out / "runs").glob("*/COMPLETE")):
            first = time.perf_counter() - locked
        time.sleep(0.05)
    if process.returncode != 0:
        raise RuntimeError(f"the uninterrupted grid failed (exit {process.returncode})")
    working = time.perf_counter() - locked
    return working, working if first is None else first


def reference(folder: Path, grid: str) -> tuple:
    """An uninterrupted run: (its table, seconds from taking the lock to the end, to the first finished run,
    and of a second invocation that finds every run done: start-up and tables)."""
    out = folder / "reference"
    working, first = _timed(grid, out)
    done, _ = _timed(grid, out)
    return table(out / "results.csv"), working, first, done


def local_campaign(kills: int, seed: int, folder: Path, log=print, grid: str = "smoke-24") -> dict:
    keys = grid_keys(grid)
    expected, working, first, done = reference(folder, grid)
    per_run = max((working - first) * 2 / max(len(keys) - 2, 1), 0.5)  # two workers
    window = first + 1.5 * per_run  # worker start-up, then about one and a half runs per worker
    log(f"uninterrupted grid: {len(expected)} runs, {working:.1f} s after taking the lock, the first finished "
        f"after {first:.1f} s, {done:.1f} s when every run is done; kills drawn uniformly in [0, {window:.1f}] s "
        f"after the lock ([0, {done:.1f}] s once every run is done)")
    rng = random.Random(seed)
    out = folder / "killed"
    landed = {"alive": 0, "exited": 0, "writing": 0}
    for k in range(kills):
        finished = check_runs(out, keys)["complete"] if (out / "runs").is_dir() else 0
        delay = rng.uniform(0, window if finished < len(keys) else done)
        process = subprocess.Popen([*command(grid), "--out", str(out), "--workers", "2"], cwd=ROOT,
                                   env=_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while _holder(out) != process.pid and process.poll() is None:
            time.sleep(0.01)
        time.sleep(delay)
        workers = _descendants(process.pid)
        writing = [p for p in temporaries(out) if ".partial-" in p]
        alive = process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed = time.monotonic()
        while any(_alive(p) for p in workers) and time.monotonic() < killed + STARTING_WORKER_SECONDS:
            time.sleep(0.05)
        left = [p for p in workers if _alive(p)]
        if left:
            raise AssertionError(f"kill {k + 1}: worker processes outlived the experiment: {left}")
        landed["slowest_worker_exit_s"] = max(landed.get("slowest_worker_exit_s", 0.0), time.monotonic() - killed)
        state = check_runs(out, keys)
        landed["alive" if alive else "exited"] += 1
        landed["writing"] += bool(writing and alive)
        log(f"kill {k + 1:2d} at {delay:5.2f} s: {'alive' if alive else 'had exited'}, "
            f"{state['complete']} runs complete, {state['temporaries']} temporaries of dead writers, "
            f"{len(writing)} run writes in progress")
    finished = _run(grid, out, ["--workers", "2"])
    if finished.returncode != 0:
        raise AssertionError(f"the resumed grid failed ({finished.returncode}): {finished.stderr[-2000:]}")
    state = check_runs(out, keys)
    resumed = table(out / "results.csv")
    equal = resumed.equals(expected)
    summary = {"kills": kills, **landed, "lost": len(keys) - state["complete"],
               "duplicated": int(resumed["key"].duplicated().sum()), "rows": len(resumed),
               "temporaries": state["temporaries"], "table_equal": bool(equal)}
    return summary


def ray_worker_running_a_run(pid: int) -> int | None:
    """A descendant of ``pid`` whose process title says it executes ``run_one``."""
    for child in _descendants(pid):
        try:
            title = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::run_one"):
            return child
    return None


def ray_campaign(kills: int, seed: int, folder: Path, log=print, timeout: float = 900, grid: str = "smoke") -> dict:
    keys = grid_keys(grid)
    expected = reference(folder, grid)[0]
    rng = random.Random(seed)
    totals = {"kills": 0, "lost": 0, "duplicated": 0, "temporaries": 0, "failures": 0, "table_equal": True}
    for k in range(kills):
        out = folder / f"ray-{k}"
        started = time.monotonic()
        process = subprocess.Popen([*command(grid), "--out", str(out), "--workers", "2", "--executor", "ray"], cwd=ROOT,
                                   env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        victim = None
        while victim is None and process.poll() is None and time.monotonic() - started < timeout:
            victim = ray_worker_running_a_run(process.pid)
            time.sleep(0.05)
        if victim is None:
            raise AssertionError(f"grid {k + 1}: no Ray worker was seen running a run")
        time.sleep(rng.uniform(0, 1.0))  # somewhere in the run: loading, fitting or writing
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
        totals["kills"] += 1
        try:
            _, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"grid {k + 1}: the experiment did not finish within {timeout:.0f} s") from None
        state = check_runs(out, keys)
        failures = (out / "failures.txt").read_text().splitlines() if (out / "failures.txt").exists() else []
        resumed = table(out / "results.csv") if (out / "results.csv").exists() else None
        equal = resumed is not None and resumed.equals(expected)
        totals["lost"] += len(keys) - state["complete"]
        totals["duplicated"] += 0 if resumed is None else int(resumed["key"].duplicated().sum())
        totals["temporaries"] += state["temporaries"]
        totals["failures"] += len(failures) + (process.returncode != 0)
        totals["table_equal"] &= bool(equal)
        log(f"grid {k + 1}: killed Ray worker {victim}; exit {process.returncode}, {state['complete']} runs complete, "
            f"{len(failures)} failures, {state['temporaries']} temporaries, table equal: {equal}"
            + (f"\n{err[-1500:]}" if process.returncode else ""))
    return totals


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("executor", choices=("local", "ray"))
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grid", help="the experiment grid (default: smoke-24 locally, smoke with Ray)")
    parser.add_argument("--folder", help="where the grids are written (default: a temporary folder)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="kill-resume-") as scratch:
        folder = Path(args.folder or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        campaign = local_campaign if args.executor == "local" else ray_campaign
        grid = args.grid or ("smoke-24" if args.executor == "local" else "smoke")
        summary = campaign(args.kills, args.seed, folder, log=lambda line: print(line, flush=True), grid=grid)
        print(f"{args.executor}: {json.dumps(summary)} in {time.perf_counter() - started:.0f} s")
        print(f"kills {summary['kills']} lost {summary['lost']} duplicated {summary['duplicated']} "
              f"temporaries {summary['temporaries']} table_equal {summary['table_equal']}")
        held = not summary["lost"] and not summary["duplicated"] and not summary["temporaries"] and summary[
            "table_equal"] and not summary.get("failures")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
