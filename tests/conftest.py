"""Global fixtures: seeding, a clean Pyro state, slow-test marking and an empty reference-posterior folder.

The tests mirror the package: ``tests/zoo/``, ``tests/inference/<family>/``, ``tests/lab/<room>/`` and
``tests/project/`` (project-wide checks: docs, import layers, notebooks, paper protocols, fuzzing).  ``tests`` is a
package, so test modules and helpers import each other by their full name (``tests.inference.conftest``,
``tests.zoo.data.data_asserts``, ``tests.project.fuzzing``).  Fixtures used by one folder live in that folder's
conftest (the known posteriors of ``tests/inference/conftest.py``).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pyro
import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
# runs are scored against any reference posterior built in $BNN_ZOO_REFERENCES (lab.references.fidelity): tests see an empty one
os.environ["BNN_ZOO_REFERENCES"] = tempfile.mkdtemp(prefix="bnn-zoo-references-")
atexit.register(shutil.rmtree, os.environ["BNN_ZOO_REFERENCES"], ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("ZOO_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or ZOO_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_and_clean_pyro():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.set_num_threads(1)  # small models are overhead-bound; threads only add contention
    yield
    pyro.clear_param_store()
