"""``python -m zoo reference list`` and ``python -m zoo reference build NAME [--out DIR]`` (:mod:`lab.references.build`)."""
from __future__ import annotations

import json

import torch

from .problems import PROBLEMS, get_problem
from .build import build_reference, list_references, load_reference, references_root
from lab.runs.store import check_destination

__all__ = ["add_reference_arguments", "run_reference_command"]


def add_reference_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="reference_command", required=True)
    sub.add_parser("list", help="the reference problems and whether each is built (in $BNN_ZOO_REFERENCES or "
                                "~/.cache/bnn-zoo/references)")
    build = sub.add_parser("build", help="build one reference posterior (long multi-chain NUTS or tempered SMC; minutes to tens of "
                                         "minutes on 2 cores)")
    build.add_argument("name", metavar="NAME", help=f"the problem: {', '.join(PROBLEMS)}")
    build.add_argument("--out", help="reference folder to write (default: $BNN_ZOO_REFERENCES/NAME or "
                                     "~/.cache/bnn-zoo/references/NAME)")
    build.add_argument("--overwrite", action="store_true", help="replace the reference at --out (whole)")
    build.add_argument("--tiny", action="store_true",
                       help="seconds-long sampler settings (for tests): marked tiny, never meets the targets")
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")


def _list() -> int:
    print(f"references in {references_root()}:")
    for row in list_references():
        if row["built"]:
            state = (f"built{' (tiny)' if row['tiny'] else ''}: rhat_max {row['rhat_max']:.4f}, ess_bulk_min "
                     f"{row['ess_bulk_min']:.0f}, {'meets' if row['meets_targets'] else 'misses'} the targets, "
                     f"{row['build_seconds']:.0f} s")
        else:
            state = f"not built (python -m zoo reference build {row['name']})"
        print(f"  {row['name']:<13} {state}\n  {'':<13} {row['description']}")
    return 0


def _build(args) -> int:
    problem = get_problem(args.name)  # unknown name: exit 2 before any work
    if args.threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {args.threads}")
    out = args.out if args.out is not None else references_root() / problem.name
    check_destination(out, args.overwrite)  # an existing reference without --overwrite: exit 2 before any work
    torch.set_num_threads(args.threads)
    path = build_reference(problem, out, overwrite=args.overwrite, progress=not args.quiet, tiny=args.tiny)
    manifest = load_reference(path).manifest
    summary = {k: manifest[k] for k in ("name", "rhat_max", "ess_bulk_min", "meets_targets", "noise_floor",
                                        "build_seconds", "build_cpu_seconds")}
    print(json.dumps({**summary, "path": str(path)}))
    return 0


def run_reference_command(args) -> int:
    return _list() if args.reference_command == "list" else _build(args)
