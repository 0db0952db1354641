"""The chain backends' defaults on the networks a new user tries first (issue 38 items 2 and 3).

Each fit is ``fit(bnn, x, y, backend=B)`` with nothing else, in a fresh process (start-up, compilation and
imports count as a user waits for them), one torch thread, on five problem shapes × {last, all}:

* ``sine`` — a 1-32-32-1 tanh MLP (``nn.Sequential``), 200 points of sin(x) + 0.1 ε, x ~ U(−3, 3), learned
  noise; coverage of the central 90 % predictive interval on 500 fresh points;
* ``moons`` — a 2-32-32-2 tanh classifier on 200 two-moons points (noise 0.1), accuracy on 500 more;
* ``energy`` — the zoo's 8-50-1 ReLU MLP on UCI energy split 0, learned noise;
* ``cnn`` — the zoo's SmallCNN on sklearn's 8×8 digits (1 347 training rows), ``last`` = its ``out`` layer;
* ``gru`` — a GRU(1→32) regressor with a linear read-out on 200 noisy sine sequences of 20 steps,
  ``last`` = ``out``;

plus ``bn`` (a Linear-BatchNorm-ReLU-Dropout-Linear net on the sine, ``last`` = ``fc2``) with ``--bn``.
Per fit: the process's wall and CPU seconds (CPU: what it costs on an idle machine, one thread), the fit's
``fit_seconds``, coverage_90 (regression) or accuracy (classification; the ``map`` backend's beside it),
the fit's own ``rhat_max`` / ``ess_bulk_min`` (:mod:`inference.mcmc.convergence`), divergences and leapfrog
steps per iteration (NUTS), or the first line of the :class:`~inference.TimeBudgetExceeded` that stopped it.

    python benchmarks/sampler_shapes.py                                  # every chain backend, every shape
    python benchmarks/sampler_shapes.py --backends nuts hmc --shapes sine cnn --selectors last
    python benchmarks/sampler_shapes.py --time-budget none               # what each costs (CPU s) on a busy machine
    python benchmarks/sampler_shapes.py --worker sine all nuts default   # one fit, a JSON line (what the table runs)

The last line: ``sampler_shapes_within_bounds K of N`` — fits that finished within 120 s (fit_seconds) with
coverage in [0.80, 0.97] or accuracy within 3 points of MAP's, or stopped early (TimeBudgetExceeded) within 60 s.
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHAIN_BACKENDS = ("nuts", "hmc", "sgld", "psgld", "sghmc", "csgmcmc")
SHAPES = ("sine", "moons", "energy", "cnn", "gru")


def _problem(shape: str, selector: str):
    """``(bnn, x, y, x_test, y_test)``; regression targets of the test set in original units."""
    import torch
    from torch import nn
    from sklearn.datasets import make_moons

    from zoo import BayesianNetwork, CategoricalLikelihood, GaussianLikelihood
    from zoo.architectures import MLP, SmallCNN
    from zoo.data import load_dataset

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if shape in ("sine", "bn"):
        x, xt = torch.rand(200, 1, generator=g) * 6 - 3, torch.rand(500, 1, generator=g) * 6 - 3
        y, yt = torch.sin(x) + 0.1 * torch.randn(200, 1, generator=g), torch.sin(xt) + 0.1 * torch.randn(500, 1, generator=g)
        if shape == "sine":
            net, chosen = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)), selector
        else:
            net = nn.Sequential()
            net.add_module("fc1", nn.Linear(1, 64))
            net.add_module("bn", nn.BatchNorm1d(64))
            net.add_module("act", nn.ReLU())
            net.add_module("drop", nn.Dropout(0.1))
            net.add_module("fc2", nn.Linear(64, 1))
            chosen = "fc2" if selector == "last" else selector
        bnn = BayesianNetwork(net, chosen, likelihood=GaussianLikelihood(learn_noise=True), example_input=x[:2])
        return bnn, x, y, xt, yt
    if shape == "moons":
        points, labels = make_moons(700, noise=0.1, random_state=0)
        x, y = torch.tensor(points, dtype=torch.float32), torch.tensor(labels)
        net = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2))
        bnn = BayesianNetwork(net, selector, likelihood=CategoricalLikelihood(), example_input=x[:2])
        return bnn, x[:200], y[:200], x[200:], y[200:]
    if shape == "energy":
        data = load_dataset("uci:energy", split=0)
        bnn = BayesianNetwork(MLP(data.input_dim, 1, hidden=(50,)), selector, likelihood=GaussianLikelihood(learn_noise=True),
                              example_input=data.x_train[:2], target_loc=data.y_loc, target_scale=data.y_scale)
        return bnn, data.x_train, data.y_train, data.x_test, data.y_test_original()
    if shape == "cnn":
        data = load_dataset("digits")
        bnn = BayesianNetwork(SmallCNN(1, 8, 10), selector, likelihood=CategoricalLikelihood(),
                              example_input=data.x_train[:2])
        return bnn, data.x_train, data.y_train, data.x_test, data.y_test
    if shape == "gru":
        class GRURegressor(nn.Module):
            def __init__(self):
                super().__init__()
                self.gru, self.out = nn.GRU(1, 32, batch_first=True), nn.Linear(32, 1)

            def forward(self, x):
                h, _ = self.gru(x.unsqueeze(-1))
                return self.out(h[:, -1])

        phase = torch.rand(500, 1, generator=g) * 2 * math.pi
        series = torch.sin(phase + 0.3 * torch.arange(21)) + 0.1 * torch.randn(500, 21, generator=g)
        x, y = series[:, :20], series[:, 20:]
        bnn = BayesianNetwork(GRURegressor(), "out" if selector == "last" else selector,
                              likelihood=GaussianLikelihood(learn_noise=True), example_input=x[:2])
        return bnn, x[:200], y[:200], x[200:], y[200:]
    raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(SHAPES)}, bn")


def worker(shape: str, selector: str, backend: str, budget: str = "default") -> dict:
    """One default fit in this process (``budget``: ``"default"``, ``"none"`` or seconds): its record."""
    import torch

    from inference import TimeBudgetExceeded, evaluate, fit

    torch.set_num_threads(1)
    bnn, x, y, xt, yt = _problem(shape, selector)
    out = {"shape": shape, "selector": selector, "backend": backend, "num_random": bnn.num_random}
    started, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            options = {} if budget == "default" or backend == "map" else \
                {"time_budget": None if budget == "none" else float(budget)}
            post = fit(bnn, x, y, backend=backend, seed=0, progress=False, **options)
        except TimeBudgetExceeded as stop:
            return {**out, "status": "stopped", "seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu,
                    "projected": stop.projection.projected, "message": str(stop).splitlines()[0]}
    out.update(status="ok", seconds=time.perf_counter() - started, cpu=time.process_time() - cpu)
    info = post.info
    out.update({k: info.get(k) for k in ("fit_seconds", "rhat_max", "ess_bulk_min", "divergences", "tree_depth_saturated",
                                         "output_head", "metric")})
    if "n_steps" in post.sample_stats:
        out["leapfrog"] = float(post.sample_stats["n_steps"].float().mean())
    metrics = evaluate(post.predict(xt, y=yt, seed=0), yt)
    out.update({k: float(metrics[k]) for k in ("coverage_90", "rmse", "accuracy", "nll") if k in metrics})
    out["warnings"] = sorted({str(w.message).split(":")[1][:60] for w in caught if issubclass(w.category, RuntimeWarning)
                              and ":" in str(w.message)})
    return out


def run_fresh(shape: str, selector: str, backend: str, timeout: float, budget: str = "default") -> dict:
    command = [sys.executable, __file__, "--worker", shape, selector, backend, budget]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"shape": shape, "selector": selector, "backend": backend, "status": f"timeout > {timeout:.0f} s"}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        reason = (done.stderr.strip().splitlines() or ["?"])[-1][:160]
        return {"shape": shape, "selector": selector, "backend": backend, "status": f"exit {done.returncode}: {reason}"}
    record = json.loads(lines[-1])
    record["process_wall"] = time.perf_counter() - started
    record["process_cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return record


def within_bounds(row: dict, map_accuracy: dict, seconds: str = "fit_seconds") -> bool:
    """Done-when of issue 38: stopped early within 60 s, or finished within 120 ``seconds`` (``"cpu"``: the fit's
    CPU seconds, what it takes alone on the machine) with coverage in [0.80, 0.97] / accuracy within 3 points
    of MAP's."""
    if row.get("status") == "stopped":
        return row["seconds"] <= 60
    if row.get("status") != "ok" or row.get(seconds, math.inf) > 120:
        return False
    if "coverage_90" in row:
        return 0.80 <= row["coverage_90"] <= 0.97
    reference = map_accuracy.get((row["shape"], row["selector"]))
    return reference is not None and row["accuracy"] >= reference - 0.03


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(CHAIN_BACKENDS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--selectors", nargs="+", default=["last", "all"], choices=["last", "all"])
    parser.add_argument("--bn", action="store_true", help="also the BatchNorm+Dropout net (last = fc2)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--time-budget", default="default",
                        help="'default' (the backends' own, 120 s), 'none', or seconds: on a machine shared with other "
                             "jobs, 'none' measures what each fit costs (its CPU seconds ≈ its wall time alone)")
    parser.add_argument("--worker", nargs=4, metavar=("SHAPE", "SELECTOR", "BACKEND", "BUDGET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker), default=str))
        return
    import pandas as pd

    shapes = args.shapes + (["bn"] if args.bn else [])
    map_accuracy, rows = {}, []
    for shape in shapes:
        for selector in args.selectors:
            if shape in ("moons", "cnn"):
                reference = run_fresh(shape, selector, "map", args.timeout)
                map_accuracy[(shape, selector)] = reference.get("accuracy")
            for backend in args.backends:
                row = run_fresh(shape, selector, backend, args.timeout, args.time_budget)
                row["within"] = within_bounds(row, map_accuracy, "cpu" if args.time_budget == "none" else "fit_seconds")
                rows.append(row)
                print(json.dumps(row, default=str), flush=True)
    columns = ["shape", "selector", "backend", "status", "num_random", "process_wall", "process_cpu", "fit_seconds", "cpu",
               "coverage_90", "accuracy", "rhat_max", "ess_bulk_min", "divergences", "leapfrog", "within"]
    table = pd.DataFrame(rows)
    print(table[[c for c in columns if c in table]].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"map accuracy: {map_accuracy}")
    print(f"sampler_shapes_within_bounds {int(table['within'].sum())} of {len(table)}")


if __name__ == "__main__":
    main()
