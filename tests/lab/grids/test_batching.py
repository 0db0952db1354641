"""The runner's batches (lab.grids.batches): grid runs grouped by what they share, fitted as one stacked program,
each run folder written as if the run were alone."""
import json

import pytest

from lab.grids.experiment import GridRun
from lab.grids.batches import RunBatch, group_runs
from lab.runs.spec import RunSpec


def test_runs_that_differ_in_split_or_seed_are_grouped():
    def run(key, backend="svi", split=0, seed=0, **extra):
        return GridRun(key, RunSpec(data="uci:yacht", backend=backend, split=split, seed=seed, **extra), {})

    runs = [run("a"), run("b", split=1), run("c", seed=2), run("d", backend="sgld"), run("e", split=3, lr=0.1),
            run("f", split=4)]
    grouped = group_runs(runs, size=2)
    assert [[r.key for r in g.runs] if isinstance(g, RunBatch) else g.key for g in grouped] == \
        [["a", "b"], ["c", "f"], "d", "e"]
    assert group_runs(runs, size=1) == runs


def test_a_batch_of_grid_runs_writes_each_run_folder_as_alone(tmp_path):
    """lab.grids.batches: two runs differing in seed fitted together; each folder verifies and holds the metrics of
    the same run fitted alone (lab.grids.worker.run_one), to float rounding."""
    from lab.grids.worker import is_finished, run_one
    from lab.grids.batches import run_batch

    runs = [GridRun(f"full-{seed}", RunSpec(data="toy1d", hidden=[8], seed=seed, epochs=3, num_samples=20), {})
            for seed in (0, 1)]
    batch = group_runs(runs, size=10)[0]
    assert isinstance(batch, RunBatch)
    outcome = run_batch(batch, tmp_path / "batched", lambda run: None)
    assert outcome == {"full-0": None, "full-1": None}
    for run in runs:
        assert is_finished(tmp_path / "batched", run)
        alone = run_one(run, tmp_path / "alone")
        batched = json.loads((tmp_path / "batched" / run.key / "metrics.json").read_text())
        assert batched["batched_fits"] == 2
        assert batched["test_ll"] == pytest.approx(alone["test_ll"], rel=1e-4)


def test_a_batch_that_cannot_be_stacked_runs_its_runs_alone(tmp_path):
    """No random weights (stochastic='none') block stacking: each run goes to run_alone, errors per run."""
    from lab.grids.batches import run_batch

    runs = [GridRun(f"det-{seed}", RunSpec(data="toy1d", hidden=[8], stochastic="none", seed=seed, epochs=3), {})
            for seed in (0, 1)]
    alone = []

    def run_alone(run):
        alone.append(run.key)
        if run.key == "det-1":
            raise RuntimeError("boom")

    assert run_batch(RunBatch(runs), tmp_path, run_alone) == {"det-0": None, "det-1": "RuntimeError: boom"}
    assert alone == ["det-0", "det-1"]
