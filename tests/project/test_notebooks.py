"""Every teaching notebook executes top to bottom in fast mode (nbclient). The notebooks in
``COMMITTED_EXECUTED`` are committed with the outputs of a full run (``notebooks/execute_all.py``;
the documentation site renders them), which must hold no error and a figure; the others clean.

Fast mode is switched on papermill-style: a cell ``FAST = True`` is inserted right after the
cell tagged ``parameters``.  The kernel is this interpreter (``sys.executable``) through a
kernelspec written to a temporary ``JUPYTER_PATH`` entry, so a stale user-level ``python3``
kernelspec pointing at another environment cannot be picked up.  Each notebook runs in a
temporary working directory; run times are printed (``-s``), not asserted.  The fast-mode runs
execute two notebooks at a time (one kernel per core, each with one torch thread), the suite's
share of the 2-core budget.
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
KERNEL = "bnn-zoo-tests"
COMMITTED_EXECUTED = {p.stem for p in NOTEBOOKS}
CELL_TIMEOUT = 600  # seconds; a safety net against hangs, not a speed check


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernelspec named ``KERNEL`` that runs this interpreter, found first via JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(root))
        patch.setenv("MPLBACKEND", "Agg")
        patch.setenv("PYTHONWARNINGS", "ignore::DeprecationWarning")
        patch.setenv("OMP_NUM_THREADS", "1")  # two kernels at a time, one core each
        yield KERNEL


def execute(path: Path, workdir: Path, kernel_name: str, **parameters):
    """Run the notebook with ``parameters`` injected after its ``parameters`` cell; returns (notebook, seconds)."""
    nb = nbformat.read(path, as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters'"
    source = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    injected = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(tagged[0] + 1, injected)
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=CELL_TIMEOUT,
                            resources={"metadata": {"path": str(workdir)}})
    started = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - started


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_all_nine_notebooks_exist():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_clean(path):
    """Outputs are stripped (or, for ``COMMITTED_EXECUTED``, those of one full run in order, with no
    error and an embedded figure); it opens with an explanation and has a FAST switch in its
    parameter cell."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown" and "$" in nb.cells[0].source  # the idea and its equation
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    if path.stem in COMMITTED_EXECUTED:
        counts = [cell.execution_count for cell in code]
        assert counts == list(range(1, len(code) + 1)), f"{path.name}: run top to bottom once"
        outputs = [o for cell in code for o in cell.outputs]
        assert not any(o.output_type == "error" for o in outputs) and "Traceback" not in _text(nb)
        assert any("image/png" in o.get("data", {}) or "data:image/png" in "".join(o.get("data", {}).get("text/html", ""))
                   for o in outputs), f"{path.name}: the figure is missing"
        assert "FAST = True" not in _text(nb)
        assert "widgets" not in nb.metadata and "widget-view" not in json.dumps(outputs)  # issue 38: text bars
        assert " 0%|" not in _text(nb), f"{path.name}: a progress bar frozen at its start"
    else:
        for cell in code:
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs"
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "FAST = " in params[0].source


@pytest.fixture(scope="module")
def fast_runs(kernel, tmp_path_factory):
    """``{stem: (notebook, seconds) or the exception}`` of every notebook run in fast mode, two at a time."""
    def run(path):
        try:
            return execute(path, tmp_path_factory.mktemp(path.stem), kernel, FAST=True)
        except Exception as error:  # reported by that notebook's test
            return error

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip((p.stem for p in NOTEBOOKS), pool.map(run, NOTEBOOKS)))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_fast_mode(path, fast_runs):
    result = fast_runs[path.stem]
    if isinstance(result, Exception):
        raise result
    nb, seconds = result
    print(f"{path.name}: {seconds:.1f} s in fast mode")
    assert "Traceback" not in _text(nb)


def test_euler_notebook_stops_cleanly_without_data(kernel, tmp_path):
    path = NOTEBOOK_DIR / "03_bayesian_lstm_euler.ipynb"
    nb, _ = execute(path, tmp_path, kernel, FAST=True, EULER_DIR=str(tmp_path / "no-such-folder"))
    text = _text(nb)
    assert "How to get the Euler-angle data" in text and "ZOO_EULER_DIR" in text
