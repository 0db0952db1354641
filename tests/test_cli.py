"""The ``python -m zoo fit`` contract."""
import json
import subprocess
import sys

import pytest

from inference import load_netcdf, load_posterior
from lab.cli import main

REQUIRED_KEYS = {"rmse", "test_ll", "coverage_90", "fit_seconds", "n_train", "n_test", "backend", "stochastic",
                 "data", "split", "seed"}


@pytest.mark.parametrize("stochastic", ["all", "last", "none"])
def test_fit_writes_metrics_and_posterior(tmp_path, stochastic, capsys):
    out = tmp_path / stochastic
    code = main(["fit", "--data", "toy1d", "--model", "mlp", "--stochastic", stochastic, "--backend", "svi",
                 "--epochs", "30", "--hidden", "16", "16", "--num-samples", "40", "--quiet", "--out", str(out)])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert REQUIRED_KEYS <= set(metrics)
    assert metrics["stochastic"] == stochastic and metrics["n_train"] == 40
    idata = load_netcdf(out / "posterior.nc")
    assert "log_likelihood" in idata.groups()
    assert load_posterior(out / "posterior").bnn.output_dim == 1
    assert "rmse" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data", "uci:nowhere"], "UCI dataset"),
        (["--data", "toy1d", "--backend", "magic"], "valid backends"),
        (["--data", "toy1d", "--stochastic", "fc9"], "valid module names"),
        (["--data", "toy1d", "--model", "resnet"], "mlp"),
        (["--data", "toy1d", "--noise", "loud"], "--noise"),
        (["--data", "toy1d", "--prior", "cauchy"], "valid priors"),
        (["--data", "toy1d", "--option", "max_depth=3"], "valid options"),
        (["--data", "toy1d", "--option", "max_depth"], "KEY=VALUE"),
        (["--data", "toy1d", "--backend", "sgld", "--chains", "2", "--option", "num_chains=3"], "repeats"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, argv, message, capsys):
    code = main(["fit", *argv, "--quiet", "--epochs", "1", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error:") and "\n" not in err and message in err


def test_option_passes_any_backend_option(tmp_path, capsys):
    out = tmp_path / "hmc"
    code = main(["fit", "--data", "toy1d", "--hidden", "4", "--backend", "hmc", "--chains", "2", "--warmup", "10",
                 "--samples", "10", "--option", "num_steps=3", "--option", "compile=false", "--option", "init=current",
                 "--quiet", "--out", str(out)])  # fmt: skip
    assert code == 0
    options = json.loads((out / "config.json").read_text())["backend_options"]
    assert options["num_steps"] == 3 and options["compile"] is False and options["init"] == "current"
    assert load_posterior(out / "posterior").info["config"]["num_steps"] == 3


def test_help_documents_commands():
    result = subprocess.run([sys.executable, "-m", "zoo", "fit", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for flag in ("--data", "--model", "--stochastic", "--backend", "--split", "--seed", "--epochs", "--num-samples",
                 "--hidden", "--out"):
        assert flag in result.stdout
    assert subprocess.run([sys.executable, "-m", "zoo", "fit"], capture_output=True).returncode == 2
