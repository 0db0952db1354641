"""The documentation site builds with warnings as errors (README's command) and holds the API
reference and every tutorial notebook with its figures."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e .[docs])")
pytest.importorskip("myst_nb", reason="the docs extra is not installed (pip install -e .[docs])")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: notebooks committed with the outputs of a full run (tests/project/test_notebooks.py checks them)
from tests.project.test_notebooks import COMMITTED_EXECUTED  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                             str(ROOT / "docs"), str(out), "-d", str(out / ".doctrees")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"the docs build failed or warned:\n{result.stderr[-4000:]}"
    return out


def test_api_reference_documents_the_public_surface(site):
    api = (site / "api.html").read_text()
    for name in ("inference.fit", "zoo.BayesianNetwork", "inference.Posterior", "lab.report.write_report"):
        assert f'id="{name}"' in api, f"{name} is missing from the API reference"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_is_a_page_with_its_figures(site, notebook):
    page = site / "tutorials" / f"{notebook.stem}.html"
    assert page.is_file(), f"{notebook.name} has no page"
    html = page.read_text()
    if notebook.stem in COMMITTED_EXECUTED:  # a figure as a file, or inside a rendered report section
        assert re.search(r"<img[^>]+src=\"([^\"]+\.png|data:image/png;base64,)", html), \
            f"{notebook.name}'s page shows no figure"
