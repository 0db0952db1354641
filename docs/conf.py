"""Sphinx configuration of the documentation site: ``python -m sphinx -W -b html docs docs/_build/html``.

Pages are MyST Markdown; the tutorials are the committed notebooks (``docs/tutorials`` links to
``../notebooks``), rendered with their stored outputs (never executed at build time); the API
reference is generated from the docstrings (Google style, read by napoleon).
"""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))
import zoo  # noqa: E402  (the one version)

project = "bnn-zoo"
author = "the bnn-zoo developers"
release = version = zoo.__version__
copyright = "2026, the bnn-zoo developers"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
root_doc = "index"
exclude_patterns = ["_build", "figures/*.py", "toy1d_variational.py", "tutorials/.ipynb_checkpoints"]
nb_execution_mode = "off"  # the notebooks carry the outputs of a full run (tests/project/test_notebooks.py)
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["ray"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "furo"
html_title = f"bnn-zoo {release}"
# Links from the Markdown pages to files of the repository (source modules, benchmark scripts)
# are not pages of this site: they stay plain links to the repository's files.
suppress_warnings = ["myst.xref_missing"]
