"""The fidelity experiment (lab.grids.fidelity) on a tiny reference: its runs, their data, their scores, the figure."""
from __future__ import annotations

import dataclasses

import matplotlib
import pandas as pd
import pytest

from inference.backends import BACKENDS
from lab.grids.fidelity import figure, fidelity_grid, tuned_options
from lab.grids.worker import run_one
from lab.references.build import build_reference


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("references")
    build_reference("toy1d", path / "toy1d", tiny=True, progress=False)
    return path


def test_grid_covers_every_backend_on_the_built_references(root, monkeypatch, capsys):
    monkeypatch.setenv("BNN_ZOO_REFERENCES", str(root))
    runs = fidelity_grid(False, None)
    assert "references not built, left out of the grid: moons" in capsys.readouterr().out
    assert len({r.key for r in runs}) == len(runs)
    assert {r.spec.backend for r in runs} == set(BACKENDS)
    assert {r.labels["problem"] for r in runs} == {"toy1d"} and {r.dataset for r in runs} == {"reference"}
    tuned = {r.spec.backend for r in runs if r.labels["setting"] == "tuned"}
    assert {"nuts", "sgld", "svi", "laplace", "ensemble"} <= tuned and "hmc" not in tuned
    assert all(r.spec.likelihood == "gaussian" for r in runs)  # deep-ensemble too: the reference's likelihood
    assert {r.labels["seed"] for r in runs} == {0, 1, 2}
    assert len(fidelity_grid(True, None)) == len(BACKENDS)  # --fast: seed 0, defaults
    assert tuned_options("hmc", 40) is None
    # the defaults are the backend's own, without a sampler's wall-clock guard (load, not the algorithm)
    defaults = {r.spec.backend: r.spec.backend_options for r in runs if r.labels["setting"] == "defaults"}
    assert defaults["nuts"] == {"time_budget": None} and defaults["sgld"] == {"time_budget": None}
    assert defaults["svi"] == {} and defaults["map"] == {}


def test_a_grid_run_fits_the_reference_data_and_is_scored(root, monkeypatch, tmp_path):
    monkeypatch.setenv("BNN_ZOO_REFERENCES", str(root))
    run = next(r for r in fidelity_grid(True, None) if r.spec.backend == "map")
    run = dataclasses.replace(run, spec=dataclasses.replace(run.spec, seed=2, epochs=5),
                              labels={**run.labels, "seed": 2})
    metrics = run_one(run, tmp_path)
    assert metrics["fidelity_reference"] == "toy1d" and metrics["fidelity_w2"] > 0
    assert metrics["n_train"] == 40  # the reference's data (seed 0), whatever the run's seed


def test_figure_draws_distance_against_cost():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = pd.DataFrame({"problem": ["toy1d"] * 2 + ["moons"] * 2, "stochastic": ["all"] * 4,
                            "backend": ["map", "nuts"] * 2, "setting": ["defaults"] * 4,
                            "fidelity_w2_mean": [0.3, 0.02, None, None], "fidelity_w2_se": [0.01, None, None, None],
                            "fidelity_w2_noise_floor_mean": [0.01] * 2 + [None] * 2,
                            "fidelity_total_variation_mean": [None, None, 0.1, 0.01],
                            "fidelity_total_variation_se": [0.0] * 4,
                            "fidelity_total_variation_noise_floor_mean": [None, None, 0.005, 0.005],
                            "run_cpu_seconds_mean": [1.0, 60.0, 2.0, 90.0]})
    fig = figure(summary, plt)
    assert len(fig.axes) == 2 and fig.axes[0].get_yscale() == "log"
    plt.close(fig)
