"""Grid throughput: a fixed slice of the UCI grid run one at a time and as stacked batches (issue 26).

The slice: ``--datasets`` (energy, yacht) × ``--splits`` standard splits (20) × ``--backends`` (svi as in
``uci-benchmark``; map and ensemble, 5 members, as in ``bdl-baselines``), Gaussian likelihood, every weight
random — the very specs of :mod:`lab.grids.uci`.  One at a time, an ensemble run stacks its own members (the
backend's default); batched, the members of all its splits' runs form one program.  Per (dataset, backend)
the runs are done both ways, interleaved (the order alternates between groups):

* one at a time: :func:`lab.runs.execution.execute` per run (fit, predict, metrics, ArviZ exports);
* batched: :func:`inference.fit_many` over the group's splits, then
  :func:`lab.runs.execution.execute` with ``fitted=`` per run (the same evaluation).

Run folders are not written (the writing is the same for both).  Times are CPU seconds of this
process (``time.process_time``: user + system of every thread), not wall time, because the machine is
shared; torch runs one thread, as a grid worker does.  Printed per group: CPU seconds per run each
way and the agreement, mean |Δ test LL| over the runs in units of the between-split standard error
of the one-at-a-time test LLs.  The last two lines are ``grid_cpu_seconds_per_run <batched>`` and
``grid_speedup <one-at-a-time ÷ batched>``.

    python benchmarks/grid_throughput.py                 # 20 splits (minutes)
    python benchmarks/grid_throughput.py --splits 5      # a quicker slice
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings

import torch

from inference.fitting import fit_many
from lab.runs.model import build_model
from lab.runs.spec import RunSpec, resolve_backend_options
from lab.runs.execution import execute
from lab.grids.uci import UCI_BACKENDS, bdl_options, uci_cells, uci_run
from zoo.data import load_dataset


def _specs(dataset: str, backend: str, splits: int, stochastic: str = "all") -> list:
    cells = [c for c in uci_cells(False, None) if c[2] == dataset and c[0] < splits]
    if not cells:
        raise ValueError(f"--datasets: no bundled UCI data set {dataset!r}")
    if backend in UCI_BACKENDS:
        return [uci_run(*cell, backend, stochastic, UCI_BACKENDS[backend][0]).spec for cell in cells]
    return [RunSpec(data=data, model="mlp", hidden=[50], stochastic=stochastic, backend=backend, split=split,
                    **bdl_options(backend, epochs)) for split, data, _, epochs in cells]


def one_at_a_time(specs, datas) -> tuple[float, list]:
    started = time.process_time()
    lls = [execute(spec, progress=False, data=data).metrics["test_ll"] for spec, data in zip(specs, datas)]
    return time.process_time() - started, lls


def batched(specs, datas) -> tuple[float, list]:
    started = time.process_time()
    options = resolve_backend_options(specs[0], datas[0])
    bnns = [build_model(spec, data) for spec, data in zip(specs, datas)]
    fits = fit_many(bnns, [d.x_train for d in datas], [d.y_train for d in datas], backend=specs[0].backend,
                    seeds=[spec.seed for spec in specs], **options)
    lls = [execute(spec, progress=False, data=data, fitted=fitted).metrics["test_ll"]
           for spec, data, fitted in zip(specs, datas, fits)]
    return time.process_time() - started, lls


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["energy", "yacht"])
    parser.add_argument("--backends", nargs="+", default=["svi", "radial", "map", "ensemble"],
                        choices=["svi", "radial", "map", "ensemble", "sgld"])
    parser.add_argument("--splits", type=int, default=20, help="standard splits per data set (default 20)")
    parser.add_argument("--stochastic", choices=["all", "last"], default="all",
                        help="random weights (last: svi and radial stack each run's trained body too)")
    args = parser.parse_args(argv)
    if not 2 <= args.splits <= 20:
        raise SystemExit("--splits must be between 2 and 20 (the standard error needs two splits)")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"UCI slice: {args.datasets} x {args.splits} splits x {args.backends}, Gaussian, stochastic={args.stochastic}; "
          f"CPU seconds (process_time), 1 torch thread, shared machine")
    totals = {"single": 0.0, "batched": 0.0}
    count = 0
    groups = [(d, b) for d in args.datasets for b in args.backends]
    for index, (dataset, backend) in enumerate(groups):
        specs = _specs(dataset, backend, args.splits, args.stochastic)
        datas = [load_dataset(s.data, split=s.split, seed=s.seed) for s in specs]
        order = (one_at_a_time, batched) if index % 2 == 0 else (batched, one_at_a_time)
        timings = {fn.__name__: fn(specs, datas) for fn in order}
        (single_cpu, single_ll), (batch_cpu, batch_ll) = timings["one_at_a_time"], timings["batched"]
        se = statistics.stdev(single_ll) / math.sqrt(len(single_ll))
        delta = statistics.fmean(abs(a - b) for a, b in zip(single_ll, batch_ll))
        n = len(specs)
        print(f"{dataset:>8} {backend:>4} ({n} runs): one at a time {single_cpu / n:6.2f} CPU-s/run, batched "
              f"{batch_cpu / n:6.2f} CPU-s/run ({single_cpu / batch_cpu:4.1f}x); "
              f"test LL {statistics.fmean(single_ll):.3f} "
              f"vs {statistics.fmean(batch_ll):.3f}, mean |delta| {delta:.2e} = {delta / se:.3f} SE (SE {se:.3f})")
        totals["single"] += single_cpu
        totals["batched"] += batch_cpu
        count += n
    print(f"grid_cpu_seconds_per_run_one_at_a_time {totals['single'] / count:.3f}")
    print(f"grid_cpu_seconds_per_run {totals['batched'] / count:.3f}")
    print(f"grid_speedup {totals['single'] / totals['batched']:.2f}")


if __name__ == "__main__":
    main()
