"""The defaults matrix: every backend with its defaults on the networks people try first (issues 23, 38).

Each cell is one backend × selector × problem shape (``benchmarks/defaults_shapes.py``: a noisy sine
with a 1-32-32-1 tanh MLP, two moons with a 2-32-32-2 classifier, UCI energy with the README's MLP,
a small CNN on digits and a GRU regressor, the last two on their last layer), fitted in a fresh
process exactly as a new user at a notebook does::

    bnn = BayesianNetwork(net, stochastic=SEL, likelihood=..., example_input=x[:2])
    posterior = fit(bnn, x, y, backend=B, seed=0, progress=False)          # nothing else

then predicted at the held-out points (seed 0).  Per cell: the process's wall seconds (imports,
start-up and compilation included, as a user waits for them) and CPU seconds (user + system, all
threads: what the cell costs whatever else runs on the machine), the fit's own ``fit_seconds``,
coverage_90 / test LL / RMSE (regression; ``mean_error``: RMSE of the predictive mean against the
noise-free sine) or accuracy / NLL (classification), and ``rhat_max`` over the predictive
quantities where there are several chains.  A fit that raises is recorded with its message (a
sampler that stops early with its time projection says so there).

The verdict of issue 38's done-when: a cell **passes** when the process finishes within 120 s with
coverage_90 in [0.80, 0.97] (regression) or accuracy at most 3 points below the ``map`` cell of
the same shape and selector (classification), or when it stops early, naming its projection, in
under 60 s.

    python benchmarks/defaults.py                                   # every cell (hours on 2 cores)
    python benchmarks/defaults.py --backends sparse-vd kingma-vd --shapes sine moons
    python benchmarks/defaults.py --cell sine svi last              # one fit here, one JSON line
    python benchmarks/defaults.py --cell energy svi all --split 1   # energy's UCI split 1 (the matrix: split 0)

Results are appended to ``--csv`` (default ``benchmarks/results/defaults_matrix.csv``) as each
cell finishes; a rerun skips the cells already there (``--rerun`` fits them again and replaces
their rows), so an interrupted matrix resumes and the lead can fill it in backend by backend.  The
table (and ``--markdown FILE``, the RESULTS table) covers the selected cells; the last line is
``defaults_matrix_pass P of N``.

On a machine shared with other jobs, run it with ``OMP_WAIT_POLICY=PASSIVE``: torch's OpenMP threads
otherwise spin while they wait for one another, and with more runnable threads than cores a fit's
steps grow 20–100× slower (measured here: the Adam step of a 1000-parameter model 87 ms instead of 0.1 ms at a
load of 10 on 2 cores); the ``omp_wait_policy`` and ``load`` columns record the conditions.

``--cli`` keeps issue 23's check through the command line on energy (and ``--digits``: LeNet-300-100
on digits), beside the tuned grids' test LL (RESULTS section 7): ``python benchmarks/defaults.py
--cli --selectors last all``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference.backends import BACKENDS  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from defaults_shapes import SELECTORS, SHAPES  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "results" / "defaults_matrix.csv"
#: issue 38's done-when
WALL_LIMIT_S, STOP_LIMIT_S, COVERAGE_RANGE, ACCURACY_SLACK = 120.0, 60.0, (0.80, 0.97), 0.03
COLUMNS = ["shape", "backend", "stochastic", "status", "wall_s", "cpu_s", "fit_s", "coverage_90", "test_ll", "rmse",
           "mean_error", "accuracy", "nll", "rhat_max", "num_random", "message", "threads", "omp_wait_policy", "load"]

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


# ---------------------------------------------------------------------- one cell, in this process
def run_cell(shape: str, backend: str, selector: str, threads: int = 0, split: int = 0) -> dict:
    """Fit one cell with the backend's defaults and evaluate it on the held-out points (``threads``:
    torch's intra-op threads, 0 for torch's default; ``split``: energy's UCI split, 0 in the matrix)."""
    import torch

    if threads:
        torch.set_num_threads(threads)

    from defaults_shapes import build_problem
    from inference import evaluate, fit
    from inference.evaluation.diagnostics import convergence_metrics

    problem = build_problem(shape, selector, split)
    row = {"threads": torch.get_num_threads(), **({"split": split} if split else {})}
    try:
        posterior = fit(problem.bnn, problem.x_train, problem.y_train, backend=backend, seed=0, progress=False)
    except Exception as err:  # the cell's outcome: a refusal, an early stop with its projection, a failure
        message = (str(err).strip().splitlines() or [""])[0]
        return {**row, "status": f"error: {type(err).__name__}", "message": message[:400],
                "num_random": getattr(problem.bnn, "num_random", None)}
    row["num_random"] = problem.bnn.num_random  # (known once fitted: the sine's model is built by its fit)
    prediction = posterior.predict(problem.x_test, y=problem.y_test, seed=0)
    metrics = evaluate(prediction, problem.y_test)
    row.update(status="ok", fit_s=posterior.info.get("fit_seconds"), **{
        k: metrics.get(k) for k in ("coverage_90", "test_ll", "rmse", "accuracy", "nll")})
    if problem.f_test is not None:
        row["mean_error"] = float((prediction.mean - problem.f_test).pow(2).mean().sqrt())
    rhat = posterior.info.get("rhat_max")
    if rhat is None and posterior.num_chains > 1:
        with torch.no_grad():
            idata = posterior.to_arviz(problem.x_test[:200], problem.y_test[:200], include_weights=False)
        rhat = convergence_metrics(idata)["rhat_max"]
    row["rhat_max"] = rhat
    return row


def _die_with_parent() -> None:
    """A cell's process asks Linux for SIGKILL when the matrix that started it dies (no orphaned fits)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import ctypes.util
        import signal

        ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def fresh_process(shape: str, backend: str, selector: str, timeout: float, threads: int = 0) -> dict:
    """One cell in a fresh Python process (``--cell``): its row, with the process's wall seconds."""
    command = [sys.executable, str(Path(__file__).resolve()), "--cell", shape, backend, selector,
               "--threads", str(threads)]
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths).rstrip(os.pathsep)}
    started, cpu_started = time.perf_counter(), _children_cpu_seconds()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:  # (run() killed and reaped the process: its CPU time is counted)
        return {"status": "timeout", "wall_s": timeout, "cpu_s": _children_cpu_seconds() - cpu_started,
                "message": f"killed after {timeout:.0f} s"}
    wall, cpu = time.perf_counter() - started, _children_cpu_seconds() - cpu_started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or ["?"])[-1][:400]
        return {"status": f"crash (exit {done.returncode})", "wall_s": wall, "cpu_s": cpu, "message": reason}
    return {**json.loads(lines[-1]), "wall_s": wall, "cpu_s": cpu}


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children (a cell's cost, whatever the machine's load)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------- the matrix
def verdict(row, map_accuracy) -> str:
    """``pass`` / ``FAIL: why`` of issue 38's done-when for one row (``map_accuracy``: the reference, or None)."""
    wall = row["wall_s"]
    if str(row["status"]).startswith("error"):
        stopped = "TimeBudgetExceeded" in str(row["status"]) or "stopped early" in str(row.get("message", ""))
        early = wall < STOP_LIMIT_S and stopped  # the sampler's time budget: its projection and advice
        return "pass (stopped early)" if early else "FAIL: error"
    if row["status"] != "ok":
        return f"FAIL: {row['status']}"
    if wall > WALL_LIMIT_S:
        return f"FAIL: {wall:.0f} s > {WALL_LIMIT_S:.0f} s"
    if pd.notna(row.get("coverage_90")):
        low, high = COVERAGE_RANGE
        return "pass" if low <= row["coverage_90"] <= high else f"FAIL: coverage {row['coverage_90']:.3f}"
    if map_accuracy is None:
        return "? (no map cell)"
    gap = map_accuracy - row["accuracy"]
    return "pass" if gap <= ACCURACY_SLACK else f"FAIL: accuracy {gap * 100:.1f} points below map"


def with_verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``verdict`` column (a classification cell against the ``map`` cell of its shape and selector)."""
    table = table.copy()
    maps = {(r.shape, r.stochastic): r.accuracy for r in table.itertuples() if r.backend == "map" and r.status == "ok"}
    table["verdict"] = [verdict(r._asdict(), maps.get((r.shape, r.stochastic))) for r in table.itertuples(index=False)]
    return table


def read_csv(path: Path) -> pd.DataFrame:
    if path.exists():
        return pd.read_csv(path)
    return pd.DataFrame(columns=COLUMNS)


def write_csv(table: pd.DataFrame, path: Path) -> None:
    """Write aside, then rename into place: the file is complete or as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
        table.to_csv(handle, index=False)
    os.replace(handle.name, path)


def markdown(table: pd.DataFrame) -> str:
    shown = ["shape", "backend", "stochastic", "wall_s", "cpu_s", "fit_s", "coverage_90", "mean_error", "accuracy",
             "nll", "rhat_max", "verdict"]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for row in table[shown].itertuples(index=False):
        cells = ["—" if pd.isna(v) else f"{v:.3g}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_matrix(args) -> None:
    path = Path(args.csv)
    table = read_csv(path)
    cells = [(shape, backend, selector) for shape in args.shapes for selector in args.selectors
             if selector in SELECTORS[shape] for backend in args.backends]
    done = {(r.shape, r.backend, r.stochastic) for r in table.itertuples()}
    for shape, backend, selector in cells:
        if (shape, backend, selector) in done and not args.rerun:
            continue
        row = {"shape": shape, "backend": backend, "stochastic": selector,
               **fresh_process(shape, backend, selector, args.timeout, args.threads),
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "load": round(os.getloadavg()[0], 1)}
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        table = table[~((table["shape"] == shape) & (table.backend == backend) & (table.stochastic == selector))]
        table = pd.concat([table, pd.DataFrame([row]).reindex(columns=COLUMNS)], ignore_index=True)
        write_csv(table, path)
    selected = table[table["shape"].isin(args.shapes) & table.backend.isin(args.backends)
                     & table.stochastic.isin(args.selectors)]
    selected = with_verdicts(selected.sort_values(["shape", "stochastic", "backend"]))
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
        print(selected.drop(columns=["message"]).to_string(index=False))
    if args.markdown:
        Path(args.markdown).write_text(markdown(selected) + "\n")
    passed = int(selected.verdict.str.startswith("pass").sum())
    print(f"defaults_matrix_pass {passed} of {len(selected)}")


# ---------------------------------------------------------------------- issue 23's check through the CLI
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


def run_cli(args) -> None:
    """Every selected backend through ``python -m zoo fit`` on energy (and digits), beside the tuned grids."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=sorted(BACKENDS), choices=sorted(BACKENDS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--selectors", nargs="+", default=["last", "all"], choices=["last", "all"])
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="the matrix's rows, appended as cells finish")
    parser.add_argument("--rerun", action="store_true", help="fit cells already in --csv again (replacing their rows)")
    parser.add_argument("--markdown", help="also write the selected rows as a Markdown table to this file")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a cell's process is killed")
    parser.add_argument("--cell", nargs=3, metavar=("SHAPE", "BACKEND", "SELECTOR"),
                        help="fit one cell in this process and print its row as JSON")
    parser.add_argument("--split", type=int, default=0,
                        help="with --cell energy ...: the UCI split (the matrix uses split 0)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads in each cell (default 0: torch's own choice, as a user gets)")
    parser.add_argument("--cli", action="store_true", help="issue 23's check: the CLI on energy (RESULTS section 7)")
    parser.add_argument("--digits", action="store_true", help="with --cli: also digits, LeNet-300-100, last layer")
    args = parser.parse_args()
    if args.cell:
        _die_with_parent()
        print(json.dumps(run_cell(*args.cell, threads=args.threads, split=args.split), default=float), flush=True)
    elif args.cli:
        if args.timeout == 300.0:
            args.timeout = 900.0
        run_cli(args)
    else:
        run_matrix(args)


if __name__ == "__main__":
    main()
