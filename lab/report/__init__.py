"""Self-contained HTML posterior-diagnostics reports for runs.

A report reads what a run stored — its folder, or the in-memory
:class:`~lab.runs.execution.RunResult` of :func:`lab.runs.execution.execute` — and never predicts again.
``python -m zoo report RUN_DIR [RUN_DIR ...] [--out FILE]`` (or ``fit --report``) writes
``RUN_DIR/report.html`` per run — configuration and timings, R-hat / ESS / MCSE with
trace and rank plots, HMC/NUTS energy and divergences, the ELBO and KL-annealing curves,
PSIS-LOO and WAIC with Pareto-k̂ warnings, calibration (coverage-vs-nominal and PIT, or
reliability and ECE), 1-D predictive bands, the likelihood (its options, the posterior of its
noise sd / degrees of freedom, a PIT QQ plot and tail check of the residuals), per-member
metrics, per-layer log α / sparsity, the distance to a reference posterior (:mod:`lab.report.fidelity`) and, for
runs on shifted data, the metrics against the rotation angle and the out-of-distribution AUROCs — and, for several
runs, a comparison page with ``az.compare``.  Images are embedded as base64 PNG.
A section that does not apply to a run says so in one line.  A run folder is not trusted: it is
verified before it is read (:func:`lab.runs.store.verify_run`), every value from it is escaped
(:mod:`lab.report.html`: Jinja2 autoescaping) and pages are written atomically
(:func:`lab.runs.store.write_text_file`).

In Python: :func:`write_report`, :func:`write_comparison`, :func:`render_run`, and
:func:`render_section` for one section (e.g. inline in a notebook); each takes a run folder,
a :class:`ReportRun` or a ``RunResult``, and :func:`write_report` / :func:`render_run` /
:func:`render_section` also a fitted posterior with its data, straight from a notebook
(``write_report(posterior, "report.html", data=dataset)``; no CLI run directory needed).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable, Sequence


from . import compare, fidelity, layers, likelihood, members, predictive, sections, shift
from .html import Section, note, page
from .rundata import NotApplicable, ReportRun, as_run, open_run
from lab.runs.store import write_text_file

__all__ = ["RUN_SECTIONS", "render_run", "render_section", "write_report", "write_comparison", "NotApplicable",
           "ReportRun", "open_run", "as_run"]

#: (title, builder) of every per-run section, in page order
RUN_SECTIONS: list[tuple[str, Callable[[ReportRun], str]]] = [
    ("Run, configuration and timings", sections.overview),
    ("Convergence: R-hat, ESS and MCSE", sections.convergence),
    ("Sampler diagnostics: energy, divergences, step size, tree depth", sections.sampler),
    ("Variational objective: ELBO and KL annealing", sections.optimisation),
    ("LOO and WAIC", predictive.loo_waic),
    ("Calibration: coverage and PIT / reliability and ECE", predictive.calibration),
    ("Predictive bands (1-D inputs)", predictive.bands),
    ("Likelihood: observation model, its latents and residual check", likelihood.observation_model),
    ("Members: per-member and mixture metrics, disagreement", members.members),
    ("Variational layers: log α and sparsity", layers.variational_layers),
    ("Shift: rotated inputs and out-of-distribution detection", shift.shift),
    ("Fidelity to a reference posterior", fidelity.fidelity),
]

REPORT_NAME = "report.html"


def _section(title: str, builder: Callable, *args) -> Section:
    """Build one section; 'does not apply' and unexpected failures become one-line notes."""
    try:
        return Section(title, builder(*args))
    except NotApplicable as reason:
        return Section(title, note(f"Not applicable: {reason}"))
    except Exception as err:  # a broken section must not cost the rest of the report
        warnings.warn(f"report section {title!r} failed: {type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)
        return Section(title, note(f"This section failed: {type(err).__name__}: {err}", "error"))


def render_run(run, data=None, seed: int = 0) -> str:
    """The HTML page of one run: a run folder, a :class:`ReportRun`, a ``RunResult``, or a fitted
    ``Posterior`` with its ``data`` (a :class:`~zoo.data.Dataset`; test set predicted with ``seed``)."""
    run = as_run(run, data, seed)
    built = [_section(title, builder, run) for title, builder in RUN_SECTIONS]
    if run.metrics.get("failed_fit"):  # the red line at the top: this run is worse than the trivial predictor
        reason = run.metrics.get("failed_fit_reason")
        built.insert(0, Section("Failed fit", note(f"Failed fit: {reason}", "error failed-fit")))
    return page(f"Posterior diagnostics: {run.name}", f"{run.title()} — {run.directory or 'in memory'}", built)


def render_section(run, title: str, data=None, seed: int = 0) -> str:
    """One section of a run's report as HTML, e.g. for ``IPython.display.HTML`` in a notebook.

    Args:
        run: a run folder, a :class:`ReportRun`, a ``RunResult``, or a fitted ``Posterior`` (with ``data``).
        title: the section's title or its start, case-insensitive (``"sampler"``, ``"LOO"``).
        data, seed: for a ``Posterior``: its :class:`~zoo.data.Dataset` and the prediction seed.
    """
    matches = [(t, b) for t, b in RUN_SECTIONS if t.lower().startswith(title.lower())]
    if not matches:
        raise ValueError(f"no report section starts with {title!r}; sections: {', '.join(t for t, _ in RUN_SECTIONS)}")
    return _section(*matches[0], as_run(run, data, seed)).render()


def write_report(run, out=None, *, data=None, seed: int = 0) -> Path:
    """Write ``out`` (default ``RUN_DIR/report.html``) for one run; returns its path.

    ``run`` is a run folder, a :class:`ReportRun`, a ``RunResult``, or a fitted ``Posterior`` with
    ``data=`` its :class:`~zoo.data.Dataset` (the test set is predicted once with ``seed``, as a
    run does: ``write_report(posterior, "report.html", data=dataset)``) or the tensors given to
    ``fit``, ``(x, y)`` or ``(x_train, y_train, x_test, y_test)`` (:func:`tensors_as_dataset`); one that was never
    written to a folder needs ``out``.
    """
    run = as_run(run, data, seed)
    if out is None:
        if run.directory is None:
            raise ValueError(f"run {run.name!r} is in memory only; pass out=... to say where its report goes")
        out = run.directory / REPORT_NAME
    return write_text_file(out, render_run(run))  # atomic; a link planted at ``out`` is replaced, not followed


def write_comparison(runs: Sequence, out=None, reports: dict | None = None) -> Path:
    """Write a comparison page over several runs (folders, :class:`ReportRun` s or ``RunResult`` s).

    ``out`` defaults to ``comparison.html`` in the run folders' common folder; ``reports`` maps
    run names to their per-run report paths, linked from the runs table.
    """
    if len(runs) < 2:
        raise ValueError(f"a comparison needs at least 2 runs, got {len(runs)}")
    runs = [as_run(r) for r in runs]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"runs must have distinct names to be compared, got {names}")
    if out is None:
        if any(r.directory is None for r in runs):
            raise ValueError("some runs are in memory only; pass out=... to say where the comparison goes")
        out = Path(os.path.commonpath([str(r.directory.resolve()) for r in runs])) / "comparison.html"
    out = Path(out)
    links = {name: os.path.relpath(path, out.parent) for name, path in (reports or {}).items()}
    built = [
        _section("Runs", compare.runs_table, runs, links),
        _section("LOO comparison (az.compare)", compare.loo_compare, runs),
        _section("Calibration across runs", compare.calibration_overlay, runs),
    ]
    return write_text_file(out, page("Run comparison", f"{len(runs)} runs: " + ", ".join(names), built))


# ---------------------------------------------------------------------- command line
def add_report_arguments(parser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by 'fit --out'")
    parser.add_argument("--out", help="output file: the report (one run) or the comparison page (several runs; "
                                      "default comparison.html in the runs' common folder)")


def run_report_command(args) -> int:
    runs = [open_run(d) for d in args.run_dirs]  # fail early, with a clear message, before any work
    if len(runs) == 1:
        print(f"wrote {write_report(runs[0], args.out)}")
        return 0
    reports = {}
    for run in runs:
        reports[run.name] = write_report(run)
        print(f"wrote {reports[run.name]}")
    print(f"wrote {write_comparison(runs, args.out, reports)}")
    return 0
