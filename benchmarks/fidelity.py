"""Time the reference posteriors and the fidelity grid (issue 37): goals ≤ 20 min per reference, ≤ 30 min per grid.

    python benchmarks/fidelity.py [--root DIR] [--names toy1d moons ...] [--rebuild] [--no-grid] [--fast]
                                  [--out DIR] [--workers 2]

For every named reference problem (default: all of ``lab.references.problems.PROBLEMS``) it builds the
reference into ``--root`` (default ``$BNN_ZOO_REFERENCES`` or ``~/.cache/bnn-zoo/references``) unless one
is built there already (``--rebuild``: build anyway) and prints ``reference_build_seconds NAME S`` — the
wall time of this build, or the one recorded in the reference's manifest (said on stderr) — then runs
``python -m zoo experiment fidelity`` on the built references into ``--out`` (a fresh temporary folder by
default, so every run is fitted) and prints ``fidelity_grid_seconds S``, its wall time.  The load average
is printed beside each number: on a shared machine the times are upper bounds.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lab.grids.runner import run_experiment  # noqa: E402
from lab.references.problems import PROBLEMS  # noqa: E402
from lab.references.build import build_reference, load_reference  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="references folder (default $BNN_ZOO_REFERENCES or ~/.cache/bnn-zoo/references)")
    parser.add_argument("--names", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--rebuild", action="store_true", help="build every named reference, even if built")
    parser.add_argument("--no-grid", action="store_true", help="do not run the fidelity grid")
    parser.add_argument("--fast", action="store_true", help="the grid's --fast variant (seed 0, defaults only)")
    parser.add_argument("--out", help="the grid's output folder (default: a new temporary folder)")
    parser.add_argument("--workers", type=int, default=2, help="the grid's worker processes (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.root:
        os.environ["BNN_ZOO_REFERENCES"] = args.root
    for name in args.names:
        try:
            manifest = None if args.rebuild else load_reference(name).manifest
        except ValueError:
            manifest = None
        if manifest is None:
            started = time.perf_counter()
            build_reference(name, overwrite=True, progress=False)
            seconds = time.perf_counter() - started
        else:
            seconds = manifest["build_seconds"]
            print(f"{name}: already built; its manifest's build time (load average then "
                  f"{manifest['load_average']['start'][0]:.1f})", file=sys.stderr)
        print(f"reference_build_seconds {name} {seconds:.0f}  (load average {os.getloadavg()[0]:.1f})", flush=True)
    if not args.no_grid:
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fidelity-grid-"))
        started = time.perf_counter()
        report = run_experiment("fidelity", out, fast=args.fast, workers=args.workers, progress=False)
        seconds = time.perf_counter() - started
        print(f"{len(report['results'])} runs, {len(report['failures'])} failed; tables in {out}", file=sys.stderr)
        print(f"fidelity_grid_seconds {seconds:.0f}  (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
