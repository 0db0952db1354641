"""The fuzz campaign (issue 41): the suite's Hypothesis fuzz tests with every test's examples scaled up.

Runs ``tests/project/test_fuzz_inputs.py`` and ``tests/project/test_fuzz_saves_reports.py`` under pytest with
``ZOO_FUZZ_SCALE=k`` (examples per test × k; the suite runs k = 1) and collects each example's outcome
(``ZOO_FUZZ_COUNTS``): per test, inputs accepted and inputs refused with their documented error; a
traceback of any other type or an unescaped string fails the test and the campaign.  Examples are
derandomised: the same command gives the same examples.

    nice -n 10 python benchmarks/fuzz_campaign.py --scale 20

The last line is ``examples <n> failures <failed tests>`` (-1: pytest itself failed).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("tests/project/test_fuzz_inputs.py", "tests/project/test_fuzz_saves_reports.py")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=20.0, help="examples per test x this (default 20)")
    parser.add_argument("-k", dest="select", help="pytest -k expression (default: every fuzz test)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fuzz-") as scratch:
        counts = Path(scratch) / "counts.jsonl"
        environment = {**os.environ, "ZOO_FUZZ_SCALE": str(args.scale), "ZOO_FUZZ_COUNTS": str(counts),
                       "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES,
                   *(["-k", args.select] if args.select else [])]
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        totals = collections.Counter()
        if counts.exists():
            for line in counts.read_text().splitlines():
                record = json.loads(line)
                test = record.pop("test")
                for outcome, n in record.items():
                    totals[(test, outcome)] += n
    print(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-2000:])
    if result.returncode:
        print(result.stdout[-6000:])
    width = max((len(f"{t} {o}") for t, o in totals), default=10)
    for (test, outcome), n in sorted(totals.items()):
        print(f"  {f'{test} {outcome}':<{width}}  {n:7d}")
    examples = sum(totals.values())
    print(f"scale {args.scale:g}: {examples} examples in {seconds:.0f} s")
    failed = re.search(r"(\d+) failed", result.stdout)
    failures = int(failed.group(1)) if failed else (0 if result.returncode == 0 else -1)
    print(f"examples {examples} failures {failures}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
