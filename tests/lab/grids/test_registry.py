"""The "new grid" recipe of docs/architecture.md, followed step by step on a toy grid, and the registry's rules."""
import pandas as pd
import pytest

from lab.grids.experiment import (DATASETS, EXTRAS, DatasetBuilder, Experiment, ExtraMetric, GridRun, register_dataset,
                                  register_extra, run_key)
from lab.grids.registry import EXPERIMENTS, get_experiment, register_experiment
from lab.grids.runner import run_experiment
from lab.runs.spec import RunSpec, validate_spec


# step 1: the builder, build(fast, data_root) -> [GridRun]: one GridRun per cell, a unique key, the labels that
# identify its configuration in the tables (the seeds are averaged over)
def toy_grid(fast: bool, data_root) -> list:
    seeds = (0, 1) if fast else (0, 1, 2)
    return [GridRun(run_key(stochastic, seed),
                    RunSpec(data="toy1d", model="mlp", hidden=[4], stochastic=stochastic, backend="svi", seed=seed,
                            epochs=3, num_samples=10),
                    {"stochastic": stochastic, "seed": seed})
            for stochastic in ("all", "last") for seed in seeds]


@pytest.fixture
def toy_experiment():
    # step 2: register it (built-in grids: one register_experiment call in lab/grids/registry.py)
    entry = register_experiment(Experiment("toy-recipe", "the recipe's toy grid: SVI on toy1d, all vs last layer",
                                           toy_grid, group=("stochastic",), metrics=("rmse", "test_ll"), hidden=True))
    yield entry
    del EXPERIMENTS[entry.name]


def test_a_grid_built_by_the_recipe_runs_and_writes_its_tables(toy_experiment, tmp_path):
    assert get_experiment("toy-recipe") is toy_experiment
    runs = toy_experiment.build(True, None)
    assert len({r.key for r in runs}) == len(runs) == 4
    for run in runs:  # step 3: every spec passes the run layer's checks
        validate_spec(run.spec)
    # step 4: run it (python -m zoo experiment toy-recipe --fast), in this process
    report = run_experiment("toy-recipe", tmp_path / "out", fast=True, workers=0, progress=False, batch_fits=1)
    assert not report["failures"] and report["skipped"] == 0
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert list(summary["stochastic"]) == ["all", "last"] and list(summary["n"]) == [2, 2]
    assert "| stochastic | n | rmse | test_ll |" in (tmp_path / "out" / "summary.md").read_text()
    for run in runs:
        assert (tmp_path / "out" / "runs" / run.key / "COMPLETE").is_file()
    again = run_experiment("toy-recipe", tmp_path / "out", fast=True, workers=0, progress=False)
    assert again["skipped"] == 4  # finished runs are found, not fitted again


def test_registering_a_taken_name_is_refused_unless_replaced(toy_experiment):
    with pytest.raises(ValueError, match="experiment 'toy-recipe' is already registered"):
        register_experiment(Experiment("toy-recipe", "again", toy_grid, ("stochastic",), ("rmse",)))
    other = Experiment("toy-recipe", "replaced", toy_grid, ("stochastic",), ("rmse",), hidden=True)
    assert register_experiment(other, replace=True) is other and EXPERIMENTS["toy-recipe"] is other


def test_unknown_experiment_lists_the_visible_ones(toy_experiment):
    with pytest.raises(ValueError, match="unknown experiment 'nope'; valid experiments: euler-stochasticity") as err:
        get_experiment("nope")
    assert "uci-benchmark" in str(err.value) and "toy-recipe" not in str(err.value) and "smoke" not in str(err.value)


def test_dataset_builders_and_extra_metrics_register_as_grids_do():
    """DATASETS and EXTRAS are filled by one register_* call per entry, each entry carrying its own name; a taken
    name is refused unless replaced."""
    assert set(DATASETS) == {"euler-increments", "reference", "frozen-features", "frozen-states", "uci-random"}
    assert set(EXTRAS) == {"euler", "confidence", "rmse_std"}
    assert all(name == entry.name for registry in (DATASETS, EXTRAS) for name, entry in registry.items())
    with pytest.raises(ValueError, match="dataset builder 'reference' is already registered"):
        register_dataset(DatasetBuilder("reference", lambda run, root, prerequisite: None))
    with pytest.raises(ValueError, match="extra metric 'euler' is already registered"):
        register_extra(ExtraMetric("euler", lambda prediction, data: {}))
    built_in = EXTRAS["euler"]
    toy = register_extra(ExtraMetric("euler", lambda prediction, data: {"toy": 1.0}), replace=True)
    try:
        assert EXTRAS["euler"] is toy and toy.compute(None, None) == {"toy": 1.0}
    finally:
        register_extra(built_in, replace=True)


def test_the_seed_002_grid_runs_graves_with_the_seeds_weight_draws():
    """Graves' backend defaults to local reparameterisation; the sparse-vd-lenet grid reproduces seed 002, whose
    Graves layers draw one set of weights per step, so it asks for ``estimator="weights"`` by name."""
    runs = get_experiment("sparse-vd-lenet").build(True, None)
    options = {run.spec.backend: run.spec.backend_options for run in runs}
    assert options["graves"] == {"estimator": "weights"}
    assert all(opts == {} for backend, opts in options.items() if backend != "graves")
