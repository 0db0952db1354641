"""Progress that suits notebooks (issue 38 item 7): a notebook executed headless keeps each bar as its
final text — no widget view, no widget state, nothing frozen at 0 % — and every bar labels what it
shows (a MAP start its log joint, not an ELBO and a KL weight)."""
from __future__ import annotations

import json
import re
import sys

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from zoo import BayesianNetwork, GaussianLikelihood
from zoo.architectures import MLP
from zoo.progress import NotebookBar, in_notebook_kernel, tqdm

from inference import fit

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _problem():
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 30).unsqueeze(1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(30, 1)
    bnn = BayesianNetwork(MLP(1, 1, hidden=(8,)), "last", likelihood=GaussianLikelihood(learn_noise=True),
                          example_input=x[:2])
    return bnn, x, y


def test_outside_a_kernel_a_bar_is_tqdm_text():
    assert not in_notebook_kernel()
    bar = tqdm(range(3), disable=True)
    assert not isinstance(bar, NotebookBar) and list(bar) == [0, 1, 2]


def test_each_bar_labels_what_it_shows(capsys):
    bnn, x, y = _problem()
    fit(bnn, x, y, backend="map", epochs=5)
    shown = capsys.readouterr().err
    assert "log_joint=" in shown and "elbo" not in shown and "kl_w" not in shown  # a point estimate's objective
    fit(bnn, x, y, backend="svi", epochs=5, kl_anneal_epochs=4)
    shown = capsys.readouterr().err
    assert "elbo=" in shown and "kl_weight=0.75" in shown
    fit(bnn, x, y, backend="svi", epochs=5)
    shown = capsys.readouterr().err
    assert "elbo=" in shown and "kl_weight" not in shown  # no schedule: nothing to show
    fit(bnn, x, y, backend="sgld", num_samples=4, warmup_steps=2, num_chains=1, map_steps=8)
    shown = capsys.readouterr().err
    assert "MAP start" in shown and "log_joint=" in shown and "elbo" not in shown


def test_the_bar_shows_the_elbo_not_the_loss(capsys):
    """The ELBO, E log p(y|w) − KL, is at most the expected log-likelihood; the loss is its negative."""
    bnn, x, y = _problem()
    posterior = fit(bnn, x, y, backend="svi", epochs=3)
    history = posterior.info["history"]
    elbo = history["expected_log_likelihood"][-1] - history["kl"][-1]
    assert f"elbo={elbo:.4g}" in capsys.readouterr().err


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernelspec running this interpreter, found first via JUPYTER_PATH (as tests/project/test_notebooks.py)."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "bnn-zoo-progress"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "progress", "language": "python"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(root))
        patch.setenv("PYTHONWARNINGS", "ignore::DeprecationWarning")
        yield "bnn-zoo-progress"


def test_a_notebook_executed_headless_keeps_its_bars_as_final_text(kernel, tmp_path):
    source = """
import torch
from zoo import BayesianNetwork, GaussianLikelihood
from zoo.architectures import MLP
from inference import fit
torch.manual_seed(0)
x = torch.linspace(-2, 2, 30).unsqueeze(1)
y = torch.sin(2 * x) + 0.1 * torch.randn(30, 1)
bnn = BayesianNetwork(MLP(1, 1, hidden=(8,)), "last", likelihood=GaussianLikelihood(learn_noise=True),
                      example_input=x[:2])
fit(bnn, x, y, backend="map", epochs=40)
fit(bnn, x, y, backend="svi", epochs=40, pretrain_epochs=5)
"""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    NotebookClient(nb, kernel_name=kernel, timeout=300, resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.validate(nb)
    saved = nbformat.writes(nb)
    assert "widgets" not in nb.metadata and WIDGET_VIEW not in saved  # no widget view, no widget state
    outputs = nb.cells[0].outputs
    assert not any(o.output_type == "error" for o in outputs), outputs
    bars = ["".join(o.data.get("text/plain", "")) for o in outputs if o.output_type == "display_data"]
    shown = [bar for bar in bars if bar]  # pretraining's bar (leave=False) emptied itself on closing
    assert len(shown) == 2, bars
    # map: the epochs chosen on held-out rows (a learned noise on a trained body), that trial's bar cleared itself
    assert shown[0].startswith("map (") and re.search(r" (\d+)/\1 ", shown[0]) and "100%" in shown[0] \
        and "log_joint=" in shown[0]
    assert shown[1].startswith("svi") and "40/40" in shown[1] and "elbo=" in shown[1]
    assert not any(" 0%|" in bar for bar in bars)  # nothing frozen at its start
