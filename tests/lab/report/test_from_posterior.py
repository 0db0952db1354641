"""A report from memory (``ReportRun.from_posterior``, ``write_report(posterior, path, data=...)``) shows what the
run's own report shows."""
from __future__ import annotations

import html

from lab.report import RUN_SECTIONS, ReportRun, render_section, write_report
from lab.runs.spec import RunSpec
from lab.runs.execution import execute


def test_report_from_a_posterior_and_its_data_matches_the_run(tmp_path):
    spec = RunSpec(data="toy1d", hidden=[8], stochastic="last", epochs=30, num_samples=40)
    result = execute(spec, None, progress=False)
    run = ReportRun.from_posterior(result.posterior, result.data, seed=spec.seed, name="same")
    assert run.metrics["model"] == "mlp" and run.metrics["rmse"] == result.metrics["rmse"]
    for title in ("Calibration", "LOO"):
        assert render_section(run, title) == render_section(ReportRun.from_result(result, name="same"), title), title
    page = write_report(result.posterior, tmp_path / "r.html", data=result.data).read_text()
    assert page.count("<section") == len(RUN_SECTIONS) and "in memory" in page and "toy1d-mlp-svi-seed0" in html.unescape(page)


def test_multiswag_report_reads_its_chains_as_members():
    """The convergence section shows no R-hat between MultiSWAG's members, and says why."""
    spec = RunSpec(data="toy1d", hidden=[8], stochastic="last", backend="multiswag", epochs=20, num_samples=8,
                   backend_options={"num_members": 2})
    result = execute(spec, None, progress=False)
    run = ReportRun.from_result(result, name="members")
    section = html.unescape(render_section(run, "Convergence"))
    assert "members of a mixture" in section and "r_hat" not in section
    assert result.metrics["chains_are_members"] and result.metrics["rhat_max"] is None
