"""Interrupted grids (issue 41): an experiment killed with SIGKILL at random moments, then resumed, and a Ray
worker killed mid-grid.  The campaigns are ``benchmarks/kill_resume.py``; the suite runs a short local
one (2 kills), the full ones (20 local kills, 5 Ray grids) are marked slow.

After every kill each run folder is complete or absent; after the resume no temporary is left, every
run is there once, and ``results.csv`` equals an uninterrupted grid's but for wall and CPU times.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; workers die with the "
                                "parent on Linux")


def _campaigns():
    spec = importlib.util.spec_from_file_location("kill_resume", ROOT / "benchmarks" / "kill_resume.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_held(summary: dict) -> None:
    assert summary["lost"] == 0 and summary["duplicated"] == 0 and summary["temporaries"] == 0, summary
    assert summary["table_equal"] and not summary.get("failures"), summary


def test_a_grid_killed_twice_then_resumed_loses_nothing(tmp_path):
    summary = _campaigns().local_campaign(2, seed=0, folder=tmp_path, log=lambda line: None, grid="smoke")
    _assert_held(summary)
    assert summary["kills"] == 2 and summary["rows"] == 6


@pytest.mark.slow
def test_a_grid_killed_twenty_times_then_resumed_loses_nothing(tmp_path):
    summary = _campaigns().local_campaign(20, seed=0, folder=tmp_path, log=print)
    _assert_held(summary)
    assert summary["alive"] >= 10  # most kills hit a running grid (not one that had already finished)


@pytest.mark.slow
def test_killing_ray_workers_mid_grid_refits_the_runs_and_loses_nothing(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (optional extra: pip install 'bnn-zoo[ray]')")
    summary = _campaigns().ray_campaign(5, seed=0, folder=tmp_path, log=print)
    _assert_held(summary)
    assert summary["kills"] == 5
