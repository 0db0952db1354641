"""Execute teaching notebooks in full mode and store their outputs in place (maintainers' tool).

    .venv/bin/python notebooks/execute_all.py [--cell-timeout SECONDS] [01 02 ...]

Each notebook runs top to bottom in this folder with this interpreter's ``python3`` kernel (the
one ``.ci/install`` registers), its ``FAST`` switch as committed (False); outputs, figures included,
are written back into the ``.ipynb``, which the docs site renders and ``tests/project/test_notebooks.py``
checks (run once in order, no error, a figure).  Prints each notebook's wall time.  A cell may run
``--cell-timeout`` seconds (default 3600; 03's four Euler fits on all pixels take longer on 2 cores).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def main(prefixes: list[str], cell_timeout: float = 3600) -> None:
    paths = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    for path in (p for p in paths if not prefixes or p.name[:2] in prefixes):
        nb = nbformat.read(path, as_version=4)
        started = time.perf_counter()
        NotebookClient(nb, kernel_name="python3", timeout=cell_timeout, resources={"metadata": {"path": str(HERE)}}).execute()
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="notebook numbers (default: all)")
    parser.add_argument("--cell-timeout", type=float, default=3600, help="seconds a cell may run (default 3600)")
    args = parser.parse_args()
    main(args.prefixes, args.cell_timeout)
