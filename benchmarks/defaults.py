"""Every backend with its defaults, as a new user meets it (issue 23).

Each fit is the command line with nothing beyond data, model, selector, split and seed, in a fresh
process (so start-up, compilation and imports are counted as a user waits for them):

    python -m zoo fit --data uci:energy --model mlp --stochastic {last,all} --backend B --split 0 --seed 0
    python -m zoo fit --data digits --model lenet300100 --stochastic last --backend B --seed 0   (--digits)

and prints, per fit, the wall seconds of the whole process and the run's own ``fit_seconds``, test
LL, coverage_90 (accuracy / NLL for digits) and R-hat where it applies, beside the tuned grid's
number for the same backend and selector (RESULTS.md: section 3 for svi / radial / sgld, section 6
for the standard posteriors, the 3-split table of section 3 for NUTS; 20-split means on energy with
the Gaussian likelihood — one split here, so a gap within the between-split spread, ~0.1 nats, is
noise).  A refused combination (exit 2) is listed with its one-line reason.

    python benchmarks/defaults.py                      # every backend, energy, last and all
    python benchmarks/defaults.py --backends nuts svi --selectors last --digits

The last lines, over the energy fits that finished: ``defaults_max_fit_seconds S`` (the largest
``fit_seconds``), ``defaults_coverage_range LO HI`` (of coverage_90) and ``defaults_worst_ll_gap G``
(the largest shortfall, in nats, of a default fit's test LL below the grid's for the same backend
and selector; 0 where none falls short).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference.backends import BACKENDS  # noqa: E402

#: the tuned grids' test LL on energy (Gaussian likelihood, 20-split means unless noted): RESULTS.md
GRID_TEST_LL = {
    ("svi", "all"): -0.85, ("svi", "last"): -0.65,  # section 3, the full grid on the final code
    ("radial", "all"): -0.79, ("radial", "last"): -0.65,
    ("sgld", "all"): -0.78, ("sgld", "last"): -0.81,
    ("nuts", "last"): -0.88,  # 3 splits (section 3, the earlier table)
    ("map", "all"): -0.69, ("ensemble", "all"): -1.28, ("mc-dropout", "all"): -2.01,
    ("swag", "all"): -1.22, ("multiswag", "all"): -1.26,
    ("laplace", "last"): -0.60, ("laplace", "all"): -0.68,
}


def run_default(data: list[str], backend: str, selector: str, timeout: float) -> dict:
    """One default CLI fit in a fresh process: its metrics, wall seconds, or why it did not finish."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "run"
        command = [sys.executable, "-m", "zoo", "fit", *data, "--stochastic", selector, "--backend", backend,
                   "--seed", "0", "--quiet", "--out", str(out)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"status": f"timeout > {timeout:.0f} s", "wall_s": timeout}
        wall = time.perf_counter() - started
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["?"])[-1][:120]
            return {"status": f"exit {done.returncode}: {reason}", "wall_s": wall}
        metrics = json.loads((out / "metrics.json").read_text())
        return {"status": "failed_fit" if metrics.get("failed_fit") else "ok", "wall_s": wall, **metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=sorted(BACKENDS), choices=sorted(BACKENDS))
    parser.add_argument("--selectors", nargs="+", default=["last", "all"], choices=["last", "all"])
    parser.add_argument("--digits", action="store_true", help="also digits, LeNet-300-100, last layer")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a fit counts as not finished")
    args = parser.parse_args()

    cases = [("energy", ["--data", "uci:energy", "--model", "mlp", "--split", "0"], b, s)
             for b in args.backends for s in args.selectors]
    if args.digits:
        cases += [("digits", ["--data", "digits", "--model", "lenet300100"], b, "last") for b in args.backends]
    rows = []
    for dataset, data, backend, selector in cases:
        result = run_default(data, backend, selector, args.timeout)
        row = {"data": dataset, "backend": backend, "stochastic": selector, "status": result["status"],
               "wall_s": round(result["wall_s"], 1), "fit_s": result.get("fit_seconds")}
        if dataset == "energy":
            row.update(test_ll=result.get("test_ll"), coverage_90=result.get("coverage_90"),
                       grid_test_ll=GRID_TEST_LL.get((backend, selector)))
        else:
            row.update(accuracy=result.get("accuracy"), nll=result.get("nll"))
        row["rhat_max"] = result.get("rhat_max")
        rows.append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)

    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))
    energy = table[(table.data == "energy") & table.status.isin(["ok", "failed_fit"])]
    if energy.empty:
        print("no energy fit finished")
        return
    gaps = (energy.grid_test_ll - energy.test_ll).dropna()
    print(f"defaults_max_fit_seconds {energy.fit_s.max():.1f}")
    print(f"defaults_coverage_range {energy.coverage_90.min():.3f} {energy.coverage_90.max():.3f}")
    print(f"defaults_worst_ll_gap {max(0.0, gaps.max() if len(gaps) else 0.0):.3f}")


if __name__ == "__main__":
    main()
