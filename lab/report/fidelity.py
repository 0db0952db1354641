"""The report's fidelity section: the run's distance to a reference posterior (:mod:`lab.references.fidelity`).

It shows what the run stored in ``metrics.json`` under ``fidelity`` — written when a reference built for the
run's data and network existed as it ran (:func:`lab.runs.execution.execute`), or by ``python -m zoo fidelity``.
"""
from __future__ import annotations

from .html import join, note, paragraph, table
from .rundata import NotApplicable, ReportRun

__all__ = ["fidelity"]

_LABELS = {"agreement": "agreement (top class as the reference's; 1 is perfect)",
           "total_variation": "total variation (½ L1 to the reference's class probabilities; 0 is perfect)",
           "w2": "W2 to the reference predictive (targets' units; 0 is perfect)",
           "reference_coverage_90": "reference coverage of the 90 % intervals (0.9 is perfect)"}


def fidelity(run: ReportRun) -> str:
    """One table per reference the run was scored against: each metric, its noise floor and their ratio."""
    records = run.metrics.get("fidelity")
    if not isinstance(records, dict) or not records:
        raise NotApplicable("the run was not scored against a reference posterior (none was built for its data and "
                            "network when it ran: python -m zoo reference list; python -m zoo fidelity RUN_DIR "
                            "--reference NAME adds the scores)")
    parts = [paragraph("Distance of the run's posterior predictive at the reference's test points to a long "
                       "multi-chain NUTS reference on the same model and data. The noise floor is the same metric "
                       "between two independent references: a method at its floor is as close as a second exact "
                       "run would be.")]
    for name, record in sorted(records.items()):
        if not isinstance(record, dict):
            continue
        floors = record.get("noise_floor") if isinstance(record.get("noise_floor"), dict) else {}
        ratios = record.get("ratio_to_noise_floor") if isinstance(record.get("ratio_to_noise_floor"), dict) else {}
        rows = [(_LABELS[key], record[key], floors.get(key), ratios.get(key, "")) for key in _LABELS if key in record]
        parts.append(paragraph(f"Reference {name}: {record.get('reference_draws', '?')} draws, R-hat max "
                               f"{record.get('reference_rhat_max', '?')}, bulk ESS min "
                               f"{record.get('reference_ess_bulk_min', '?')}; the run's {record.get('num_draws', '?')} "
                               f"draws."))
        if record.get("reference_meets_targets") is not True:
            parts.append(note("this reference misses its convergence targets (R-hat ≤ 1.01, bulk ESS ≥ 1000 on every "
                              "stored predictive quantity): read the distances with care", "warn"))
        parts.append(table(rows, ["metric", "value", "noise floor", "ratio to the floor"]))
    return join(parts)
