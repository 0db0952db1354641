"""The ``python -m zoo fit`` contract."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lab.runs.execution
from inference import fit, load_netcdf, load_posterior
from lab.cli import main
from lab.runs.model import build_model
from lab.runs.spec import RunSpec
from lab.runs.execution import RUN_FILES
from lab.runs.store import verify_run
from zoo.data import load_dataset

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--data", "toy1d", "--hidden", "4", "--epochs", "3", "--num-samples", "10", "--quiet"]

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
        (["--data", "toy1d", "--option", "num_particles=2.7"],
         "option 'num_particles' of backend 'svi' must be an integer, got 2.7 (float)"),
        (["--data", "toy1d", "--option", "kl_warmup_epochs=abc"],
         "option 'kl_warmup_epochs' of backend 'svi' must be an integer, got 'abc'"),
        (["--data", "toy1d", "--option", "epochs=abc"], "option 'epochs' is given twice"),
        (["--data", "toy1d", "--option", "pretrain_lr=fast"], "must be a number or null"),
        (["--data", "toy1d", "--noise", "-0.1"], "--noise must be 'learned' or a positive number"),
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


def _files(directory: Path) -> dict:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_existing_run_is_refused_before_any_work_and_replaced_whole_with_overwrite(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(["fit", *TINY, "--report", "--out", str(out)]) == 0
    assert (out / "report.html").is_file()
    before = _files(out)

    def no_work(*args, **kwargs):
        raise AssertionError("data loaded although the output path is invalid")

    monkeypatch.setattr(lab.runs.execution, "load_dataset", no_work)
    capsys.readouterr()
    assert main(["fit", *TINY, "--seed", "1", "--out", str(out)]) == 2
    assert "already holds a run; pass --overwrite" in capsys.readouterr().err
    assert _files(out) == before  # byte-identical
    monkeypatch.undo()
    assert main(["fit", *TINY, "--seed", "1", "--overwrite", "--out", str(out)]) == 0
    verify_run(out, RUN_FILES)
    assert json.loads((out / "metrics.json").read_text())["seed"] == 1
    assert not (out / "report.html").exists()  # the old run's report went with it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_output_path_that_is_a_file_exits_2(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["fit", *TINY, "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_failed_run_exits_1_with_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--data", "toy1d", "--hidden", "4", "--backend", "hmc", "--chains", "1", "--warmup", "0",
                 "--samples", "5", "--step-size", "50", "--option", "adapt_step_size=false", "--option",
                 "init=current", "--option", "num_steps=2", "--option", "compile=false", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and err.startswith("error: hmc: every one of the 5 post-warm-up transitions diverged")
    assert not list(tmp_path.iterdir())


def test_ctrl_c_prints_one_line_exits_130_and_leaves_no_run(tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        command = ["fit", "--data", "toy1d", "--hidden", "4", "--epochs", "100000", "--pretrain-epochs", "0",
                   "--out", str(out)]
        process = subprocess.Popen([sys.executable, "-m", "zoo", *command], cwd=ROOT, stderr=stderr,
                                   stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while "svi (" not in log.read_text() and time.monotonic() < deadline:  # fitting has started
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
    last = log.read_text().replace("\r", "\n").strip().splitlines()[-1]
    assert last == "interrupted (Ctrl-C)" and "Traceback" not in log.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr.txt"]


def test_bool_option_given_a_word_exits_2_before_fitting(tmp_path, capsys):
    argv = ["fit", "--data", "toy1d", "--backend", "nuts", "--option", "dense_mass=maybe", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: option 'dense_mass' of backend 'nuts' must be true or false or 'auto', got 'maybe' (str)")
    assert not list(tmp_path.iterdir())


def test_option_types_are_checked_by_the_python_fit_api_too():
    spec = RunSpec(data="toy1d", hidden=[4])
    data = load_dataset("toy1d")
    bnn = build_model(spec, data)
    with pytest.raises(ValueError, match="option 'num_particles' of backend 'svi' must be an integer, got 2.7"):
        fit(bnn, data.x_train, data.y_train, num_particles=2.7)
    with pytest.raises(ValueError, match="option 'adapt_mass' of backend 'nuts' must be true or false or 'auto', got 1"):
        fit(bnn, data.x_train, data.y_train, backend="nuts", adapt_mass=1)
    posterior = fit(bnn, data.x_train, data.y_train, epochs=2e0, num_samples=3, progress=False)  # 2.0 is 2
    assert posterior.info["config"]["epochs"] == 2 and isinstance(posterior.info["config"]["epochs"], int)
    assert torch.isfinite(posterior.predict(data.x_test).mean).all()


def test_a_laplace_run_takes_the_map_runs_budget_so_its_mean_is_that_runs_map():
    """In a run, Laplace's default MAP (``map_steps=None``: "the map backend's budget") gets the steps the run
    layer gives a ``map`` run on the same data (its default epochs of minibatches of 64), not the API's 200
    epochs: the digits Laplace-vs-MAP rows then compare a Laplace with the very MAP it is built on."""
    from lab.runs.spec import default_epochs, map_backend_steps, resolve_backend_options

    data = load_dataset("digits")
    n = data.n_train
    steps = map_backend_steps(n)
    map_epochs = resolve_backend_options(RunSpec(data="digits", backend="map"), data)["epochs"]
    assert map_epochs == default_epochs(n, 64) and steps == map_epochs * -(-n // 64)
    assert resolve_backend_options(RunSpec(data="digits", backend="laplace"), data)["map_steps"] == steps
    given = RunSpec(data="digits", backend="laplace", backend_options={"map_steps": 10})
    assert resolve_backend_options(given, data)["map_steps"] == 10  # an explicit budget is kept
    assert "map_steps" not in resolve_backend_options(RunSpec(data="digits", backend="nuts"), data)  # its own 2000
