"""Resources (issue 41): memory estimates of fits and predictions, refused before any allocation.

The estimate's parts are checked against their closed forms (counts × element size), every oversize
request of the issue — a huge hidden size, too many MC samples, too many chains, too many members, a
dense Laplace GGN of a wide network — is refused before the backend runs (the backend is replaced by
one that fails the test if called) with the estimate and what to lower, and ``ZOO_MEMORY_LIMIT``
overrides the memory available.
"""
import math

import pytest
import torch

import lab.runs.execution
from inference import fit
from inference.backends import BACKENDS
from inference.backends.base import parse_config
from inference.memory import activation_width, fit_memory, prediction_memory, run_prediction_memory
from lab.cli import main
from zoo import BayesianNetwork
from zoo.architectures import MLP
from zoo.resources import available_memory, memory_limit

X = torch.linspace(-2, 2, 20).unsqueeze(1)
Y = 2 * X


def _bnn(hidden=(5,), stochastic="all"):
    torch.manual_seed(0)
    return BayesianNetwork(MLP(1, 1, hidden=hidden), stochastic, example_input=X[:2])


def _parts(bnn, backend, rows=None, **options) -> dict:
    return {p.what.split(" (")[0]: p.size for p in fit_memory(bnn, parse_config(BACKENDS[backend], options), rows)}


def test_the_estimate_is_counts_times_the_element_size():
    bnn = _bnn(hidden=(5,))  # P = (1 + 1) * 5 + (5 + 1) * 1 = 16 parameters, all random; widths 5 + 1
    assert sum(p.numel() for p in bnn.net.parameters()) == bnn.num_random == 16 and activation_width(bnn.net) == 6
    nuts = _parts(bnn, "nuts", rows=20, num_chains=3, num_samples=7, dense_mass=True)
    assert nuts["storing num_chains x num_samples = 21 draws of 16 random values"] == 21 * 16 * 4
    assert nuts["3 sampler chains' states"] == 3 * 16 * 4 * 4
    assert nuts["a dense 16x16 mass matrix per chain"] == 3 * 16**2 * 4 * 2
    assert nuts["activations of 20 rows x 3 chains"] == 3 * 20 * 6 * 4 * 3
    ensemble = _parts(bnn, "ensemble", num_members=9)
    assert ensemble["9 ensemble members of 16 parameters"] == 9 * 16 * 4 * 4
    swag = _parts(bnn, "multiswag", num_members=2, max_rank=10)
    assert swag["SWAG moments"] == 2 * 12 * 16 * 4
    laplace = _parts(bnn, "laplace", hessian="full")
    assert laplace["a dense 16x16 Laplace GGN"] == 16**2 * 4 * 2
    assert "a dense 16x16 Laplace GGN" not in _parts(bnn, "laplace", hessian="kfac")
    assert prediction_memory(bnn, 100, 30).size == 5 * 100 * 30 * 1 * 4
    part = prediction_memory(bnn, 800, 30, {"num_samples": 200, "num_chains": 4, "num_members": 1})
    assert part.what.startswith("predict 800 draws (num_samples=200 x num_chains=4) at 30 points")
    assert part.lower.startswith("num_samples or num_chains")
    run = run_prediction_memory(bnn, 800, 30, 10, {"num_samples": 200, "num_chains": 4})
    assert run.size == 800 * 40 * 24 * 4 and run.lower == "num_samples or num_chains"  # measured: ~100 B/draw/point
    assert _parts(bnn.double(), "map", rows=20)["activations of 20 rows"] == 20 * 6 * 8 * 3  # float64: 8 bytes


def _no_fit(*args, **kwargs):
    pytest.fail("the backend ran: the request was not refused before allocating")


OVERSIZE = {  # fit(...) options on a small network -> (message fragments)
    "too many chains": (dict(backend="nuts", num_chains=10**8, num_samples=10), ["100,000,000 chains", "num_chains"]),
    "too many draws": (dict(backend="sgld", num_chains=4, num_samples=10**9), ["draws", "lower num_samples"]),
    "too many members": (dict(backend="ensemble", num_members=10**9), ["ensemble members", "num_members"]),
    "a dense mass matrix per chain": (dict(backend="nuts", num_chains=10**4, dense_mass=True),
                                      ["dense", "dense_mass"]),
}


@pytest.mark.parametrize("case", list(OVERSIZE))
def test_an_oversize_fit_is_refused_before_the_backend_runs(monkeypatch, case):
    options, fragments = OVERSIZE[case]
    bnn = _bnn(hidden=(200,))
    monkeypatch.setattr(type(BACKENDS[options["backend"]]), "run", _no_fit)
    with pytest.raises(ValueError, match="needs about .* of memory; this machine has .* available") as caught:
        fit(bnn, X, Y, progress=False, **options)
    assert all(f in str(caught.value) for f in fragments), str(caught.value)
    assert "ZOO_MEMORY_LIMIT" in str(caught.value) and "\n" not in str(caught.value)


def test_a_dense_laplace_of_a_wide_network_is_refused_before_the_backend_runs(monkeypatch):
    monkeypatch.setenv("ZOO_MEMORY_LIMIT", "512M")  # a 3000-wide layer's GGN: 9,001² x 4 bytes x 2 = 618 MiB
    monkeypatch.setattr(type(BACKENDS["laplace"]), "run", _no_fit)
    with pytest.raises(ValueError, match=r"dense 9,001x9,001 Laplace GGN.*hessian='kfac'"):
        fit(_bnn(hidden=(3000,)), X, Y, backend="laplace", hessian="full", max_full_dim=10**6, progress=False)


CLI_OVERSIZE = {  # zoo fit arguments -> message fragment; refused with status 2 before the fit
    "a huge hidden size": (["--hidden", "200000", "200000"], "use narrower or fewer hidden layers"),
    "too many MC samples": (["--num-samples", "100000000"], "predict 100,000,000 draws (num_samples=100,000,000) and "
                                                             "export at 500 + 40 points"),
    "too many chains": (["--backend", "nuts", "--chains", "100000000", "--num-samples", "10"],
                        "(num_samples=10 x num_chains=100,000,000)"),
    "too many members": (["--backend", "ensemble", "--option", "num_members=1000000000"], "1,000,000,000"),
}


@pytest.mark.parametrize("case", list(CLI_OVERSIZE))
def test_the_cli_refuses_an_oversize_run_before_fitting(tmp_path, monkeypatch, capsys, case):
    arguments, fragment = CLI_OVERSIZE[case]
    monkeypatch.setattr(lab.runs.execution, "fit", _no_fit)
    code = main(["fit", "--data", "toy1d", "--quiet", "--out", str(tmp_path / "run"), *arguments])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and "needs about" in err and "\n" not in err, err
    assert not (tmp_path / "run").exists()


def test_memory_limit_overrides_the_memory_available(monkeypatch):
    monkeypatch.delenv("ZOO_MEMORY_LIMIT", raising=False)
    assert memory_limit() is None
    for text, size in (("512M", 512 * 2**20), ("2GiB", 2 * 2**30), ("1e9", 1e9), ("64 G", 64 * 2**30)):
        monkeypatch.setenv("ZOO_MEMORY_LIMIT", text)
        assert memory_limit() == size and available_memory() == int(size)
    monkeypatch.setenv("ZOO_MEMORY_LIMIT", "off")
    assert memory_limit() == math.inf and available_memory() is None
    fit(_bnn(), X, Y, backend="sgld", num_chains=1, num_samples=2, warmup_steps=1, map_steps=1, progress=False)
    monkeypatch.setenv("ZOO_MEMORY_LIMIT", "1M")  # the same small fit, refused under a 1 MiB limit
    with pytest.raises(ValueError, match=r"available \(\$ZOO_MEMORY_LIMIT\)"):
        fit(_bnn(), X, Y, backend="sgld", num_chains=1000, num_samples=100, progress=False)
    monkeypatch.setenv("ZOO_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="ZOO_MEMORY_LIMIT='lots' is not a size"):
        memory_limit()


def test_running_out_of_memory_anyway_is_one_line_with_status_1(tmp_path, monkeypatch, capsys):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 60800000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(lab.runs.execution, "fit", out_of_memory)
    code = main(["fit", "--data", "toy1d", "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: out of memory") and "\n" not in err and "lower" in err, err
    assert not (tmp_path / "run").exists()
