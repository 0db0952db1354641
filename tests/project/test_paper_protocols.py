"""The ``paper-protocols`` grid: each method under its own paper's protocol, beside the published numbers."""
from __future__ import annotations

from lab.grids.registry import EXPERIMENTS
from lab.runs.spec import validate_spec
from lab.grids.uci import PAPER_PUBLISHED
from zoo.data import load_uci


def test_the_grid_runs_each_paper_protocol():
    experiment = EXPERIMENTS["paper-protocols"]
    runs = experiment.build(True, None)
    uci = [r for r in runs if r.labels["dataset"] != "digits"]
    assert {r.labels["method"] for r in uci} == {"deep ensembles", "mc-dropout (gal2016)"}
    assert len(uci) == 5 * 3 * 2 and len({r.key for r in runs}) == len(runs)
    for run in runs:
        validate_spec(run.spec)
    yacht = {r.labels["method"]: r.spec for r in uci if r.labels["dataset"] == "yacht" and r.labels["split"] == 0}
    ensemble, dropout = yacht["deep ensembles"], yacht["mc-dropout (gal2016)"]
    assert ensemble.backend == "deep-ensemble" and ensemble.likelihood == "heteroscedastic"
    assert ensemble.epochs is None and ensemble.backend_options == {"protocol": "lakshminarayanan2017"}  # by name
    info = load_uci("yacht").info
    assert dropout.backend_options == {"protocol": "gal2016", "dropout_grid": info["dropout_rates"],
                                       "tau_grid": info["tau_values"]}
    assert dropout.num_samples == 10000 and dropout.hidden == [50]
    digits = {r.labels["method"] for r in runs if r.labels["dataset"] == "digits"}
    assert {"map", "deep ensembles", "mc-dropout (gal2016)"} <= digits


def test_published_columns_and_the_verdict():
    published = EXPERIMENTS["paper-protocols"].published
    assert set(PAPER_PUBLISHED["deep ensembles"]) == set(PAPER_PUBLISHED["mc-dropout (gal2016)"])
    row = {"method": "mc-dropout (gal2016)", "dataset": "yacht"}
    assert published({**row, "test_ll_mean": -1.60})["reproduces (LL ≥ published − ±)"] == "yes"  # within ±
    assert published({**row, "test_ll_mean": -1.20})["reproduces (LL ≥ published − ±)"] == "yes"  # better
    cells = published({**row, "test_ll_mean": -1.77})
    assert cells["reproduces (LL ≥ published − ±)"] == "no (-0.10 below)"
    assert cells["published LL"] == "-1.55 ± 0.12" and cells["published RMSE"] == "1.11 ± 0.38"
    assert set(published({"method": "map", "dataset": "digits"}).values()) == {"–"}


def test_heteroscedastic_defaults_grid_fits_each_backend_with_nothing_but_the_likelihood():
    experiment = EXPERIMENTS["heteroscedastic-defaults"]
    runs = experiment.build(True, None)
    assert len(runs) == 5 * 3 * 3 and len({r.key for r in runs}) == len(runs)
    assert {r.labels["method"] for r in runs} == {"ensemble", "map", "deep-ensemble"}
    for run in runs:
        validate_spec(run.spec)
        assert run.spec.likelihood == "heteroscedastic" and run.spec.backend_options == {} and run.spec.epochs is None
    verdict = experiment.published({"method": "map", "dataset": "bostonHousing", "test_ll_mean": -2.70})
    assert verdict["published LL"] == "-2.41 ± 0.25" and verdict["reproduces (LL ≥ published − ±)"] == "no (-0.04 below)"


def test_summaries_mark_a_coverage_outside_the_band():
    import pandas as pd

    from lab.grids.tables import COVERAGE_90_BAND, coverage_note, summary_markdown

    assert COVERAGE_90_BAND == (0.85, 0.95)
    assert (coverage_note(0.97), coverage_note(0.80), coverage_note(0.90), coverage_note(float("nan"))) == (
        " (wide)", " (narrow)", "", "")
    summary = pd.DataFrame([{"dataset": "yacht", "method": m, "n": 3, "failed_fit": 0, "rmse_mean": 1.0, "rmse_se": 0.1,
                             "test_ll_mean": -1.0, "test_ll_se": 0.1, "coverage_90_mean": c, "coverage_90_se": 0.01}
                            for m, c in (("a", 0.99), ("b", 0.9))])
    table = summary_markdown(EXPERIMENTS["heteroscedastic-defaults"], summary, {})
    assert "0.99 ± 0.01 (wide)" in table and "| 0.9 ± 0.01 |" in table and "marked (wide) or (narrow)" in table
