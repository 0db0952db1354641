"""Fuzzing the inputs a user types or hands over (issue 41): CSV files, UCI-layout folders and the command
line's option strings.

The property: a loader or the command line either accepts the input (a finite data set; a fit that
reaches the backend) or refuses it with its documented error type — :class:`zoo.data.DataError` for data
files, exit status 2 with one ``error:`` line for the command line — whose message is one line naming
the file, a line, a column or the option.  Any other exception is a bug (Hypothesis prints the input).
Campaign: ``benchmarks/fuzz_campaign.py``; examples per test scale with ``ZOO_FUZZ_SCALE``.
"""
import csv
import io
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.project.fuzzing import PAYLOADS, count, fuzz_settings, hostile_text, mutate_bytes, one_line_naming, write
from lab.cli import main
from zoo.data import DataError, load_dataset

pytest.importorskip("hypothesis")

# ------------------------------------------------------------------ CSV files
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-10**30, 10**30).map(str),
                    st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "1e400", "1e-400", "0x10", "1,5", "١٢",
                                     "3.4e38", "3.5e38", "TRUE", "null", "NA", "-"]))
cells = st.one_of(numbers, numbers, numbers, hostile_text)


@st.composite
def csv_files(draw) -> tuple:
    """(file bytes, target spec): a numeric table (often accepted), a hostile one, a mangled one, or bytes."""
    width = draw(st.integers(2, 5))
    if draw(st.booleans()):  # numeric, distinct names: the accepting paths, with odd numbers now and then
        names = [f"x{k}" for k in range(width - 1)] + ["y"]
        value = st.one_of(st.floats(-1e6, 1e6).map(repr), st.integers(-10**6, 10**6).map(str), numbers) \
            if draw(st.integers(0, 3)) == 0 else st.floats(-1e6, 1e6).map(repr)
        rows = draw(st.lists(st.lists(value, min_size=width, max_size=width), min_size=2, max_size=30))
        target = "y"
    else:
        names = draw(st.lists(st.one_of(st.sampled_from(["x", "y", "a", "b", "x.1", ""]), hostile_text),
                              min_size=width, max_size=width))
        rows = draw(st.lists(st.lists(cells, min_size=width - 1, max_size=width + 1), max_size=12))
        target = draw(st.one_of(st.sampled_from(names), st.sampled_from(names).map(lambda n: f"{n},{names[0]}"),
                                hostile_text.filter(lambda t: t.strip() and ":" not in t)))
    text = io.StringIO()
    csv.writer(text, quoting=draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]))
               ).writerows([names, *rows])
    encoding = draw(st.sampled_from(["utf-8"] * 8 + ["utf-8-sig", "utf-16", "latin-1"]))
    data = text.getvalue().encode(encoding, errors="replace")
    form = draw(st.sampled_from(["table"] * 4 + ["mutated", "bytes"]))
    if form == "mutated":
        data = mutate_bytes(data, draw)
    elif form == "bytes":
        data = draw(st.binary(max_size=300))
    return data, target


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@fuzz_settings(300)
@given(csv_files())
def test_csv_loader_accepts_or_raises_data_error_naming_the_file(scratch, case):
    data, target = case
    path = write(scratch / "table.csv", data)
    try:
        dataset = load_dataset(f"csv:{path}:{target}", seed=0)
    except DataError as err:
        assert one_line_naming(str(err), path, "line ", "column", "row", "target"), str(err)
        count("csv", {"refused": 1})
        return
    assert torch.isfinite(dataset.x_train).all() and torch.isfinite(dataset.y_train).all()
    assert dataset.n_train >= 1 and dataset.n_test >= 1
    count("csv", {"accepted": 1})


# ------------------------------------------------------------------ UCI-layout folders
def _indices(draw, n: int) -> str:
    values = draw(st.lists(st.one_of(st.integers(-2, n + 2), st.integers(0, max(n - 1, 0))), max_size=10))
    text = "\n".join(str(v) for v in values)
    if draw(st.integers(0, 5)) == 0:
        text = draw(st.sampled_from(["1.5", "x", "", " \n", "1e3", "0 1", "nan"] + PAYLOADS))
    return text


@st.composite
def uci_folders(draw) -> dict:
    """The five files of a UCI-layout folder (split 0): consistent and often accepted, or broken somewhere."""
    rows, columns = draw(st.integers(0, 12)), draw(st.integers(2, 4))
    matrix = draw(st.lists(st.lists(st.floats(-1e3, 1e3), min_size=columns, max_size=columns), min_size=rows,
                           max_size=rows))
    order = draw(st.permutations(range(rows)))
    cut = draw(st.integers(min(rows, 1), max(rows - 1, min(rows, 1))))
    files = {"data.txt": "\n".join(" ".join(repr(v) for v in row) for row in matrix),
             "index_features.txt": "\n".join(map(str, range(columns - 1))), "index_target.txt": str(columns - 1),
             "index_train_0.txt": "\n".join(map(str, order[:cut])), "index_test_0.txt": "\n".join(map(str, order[cut:]))}
    for name in draw(st.lists(st.sampled_from(sorted(files)), max_size=2, unique=True)):  # break some files
        how = draw(st.sampled_from(["indices", "bytes", "text", "delete"]))
        if how == "indices" and name != "data.txt":
            files[name] = _indices(draw, rows)
        elif how == "bytes":
            files[name] = mutate_bytes(files[name].encode(), draw).decode("utf-8", errors="replace")
        elif how == "text":
            files[name] = draw(hostile_text)
        else:
            del files[name]
    return files


@fuzz_settings(300)
@given(uci_folders())
def test_uci_loader_accepts_or_raises_data_error_naming_the_file(scratch, files):
    folder = scratch / "uci"
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for name, text in files.items():
        (folder / name).write_text(text)
    try:
        dataset = load_dataset(f"uci:{folder}", split=0)
    except DataError as err:
        assert one_line_naming(str(err), folder, "line ", "column", "row"), str(err)
        count("uci", {"refused": 1})
        return
    assert torch.isfinite(dataset.x_train).all() and torch.isfinite(dataset.y_train).all()
    count("uci", {"accepted": 1})


# ------------------------------------------------------------------ command-line option strings
class Accepted(BaseException):
    """Raised where the backend would start fitting: every check before it passed."""


@contextmanager
def _stop_at_the_fit():
    def refuse_to_fit(bnn):
        raise Accepted

    with mock.patch("inference.fitting.preserved_session", refuse_to_fit):
        yield


OPTION_NAMES = ["epochs", "lr", "num_samples", "num_chains", "batch_size", "num_particles", "step_size",
                "guide", "guide_options", "init", "hessian", "max_rank", "num_members", "dropout", "thin",
                "warmup_steps", "max_tree_depth", "prior_precision", "kl_anneal_epochs", "clip_norm", "optimizer"]
option_values = st.one_of(st.integers(-10**12, 10**12).map(str), st.floats().map(repr), hostile_text,
                          st.sampled_from(["true", "false", "null", "[]", "{}", '"x"', "[1, 2]", '{"a": 1}', "1e400",
                                           "NaN", "-Infinity", "1e9", "0", "-1", "0.5", "1e-300", "full", "kfac"]))
FLAGS = {"--epochs": 4, "--lr": 0.01, "--num-samples": 5, "--batch-size": 8, "--hidden": 4, "--seed": 0,
         "--split": 0, "--chains": 2, "--warmup": 2, "--thin": 1, "--step-size": 0.1, "--prior-scale": 1.0,
         "--noise": 0.1, "--mc-kl-samples": 2, "--pretrain-epochs": 1}
TEXT_FLAGS = {"--stochastic": ["all", "last", "none", "fc*", "mean-head"], "--prior": ["normal", "laplace", "fan-in"],
              "--activation": ["relu", "tanh"], "--model": ["mlp", "cnn"], "--likelihood": ["gaussian", "studentt"],
              "--backend": ["map", "svi", "nuts", "sgld", "laplace", "ensemble", "swag", "mc-dropout", "radial"]}


@st.composite
def command_lines(draw) -> list:
    arguments = ["--backend", draw(st.sampled_from(TEXT_FLAGS["--backend"]))]
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.one_of(st.sampled_from(OPTION_NAMES), hostile_text))
        separator = draw(st.sampled_from(["=", "=", "=", ":", "", "=="]))
        arguments += ["--option", f"{key}{separator}{draw(option_values)}"]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4, unique=True)):
        arguments += [flag, draw(st.one_of(st.just(str(FLAGS[flag])), option_values))]
    for flag in draw(st.lists(st.sampled_from(sorted(TEXT_FLAGS)), max_size=2, unique=True)):
        arguments += [flag, draw(st.one_of(st.sampled_from(TEXT_FLAGS[flag]), hostile_text))]
    if draw(st.integers(0, 6)) == 0:
        arguments += ["--dof", draw(option_values)]
    return arguments


@fuzz_settings(250)
@given(command_lines())
def test_cli_options_are_accepted_or_refused_with_status_2_naming_the_option(scratch, arguments):
    out = scratch / "cli-run"
    err, printed = io.StringIO(), io.StringIO()
    command = ["fit", "--data", "toy1d", "--quiet", "--hidden", "4", "--out", str(out), *arguments]
    code = None
    with _stop_at_the_fit(), redirect_stderr(err), redirect_stdout(printed), mock.patch.dict(
            "os.environ", {"ZOO_MEMORY_LIMIT": "2G"}):  # an accepted size never allocates more than this
        try:
            code = main(command)
        except Accepted:
            count("cli", {"accepted": 1})
            return
        except SystemExit as exit_:  # argparse: usage and one error line, status 2
            code = exit_.code
    message = err.getvalue().strip()
    assert code == 2, (code, message)
    assert "Traceback" not in message and message.splitlines()[-1].startswith(("error:", "python -m zoo fit: error:"))
    named = [a.lstrip("-") for a in arguments if a.startswith("--")]  # the flags, the --option keys, long values
    named += [a.split("=")[0].split(":")[0].strip() for a in arguments if not a.startswith("--")]
    named += [a for a in arguments if len(a) >= 4]
    assert one_line_naming(message.splitlines()[-1], *[n for n in named if len(n) >= 2]), message
    assert not out.exists()
    count("cli", {"refused": 1})


def test_the_fuzz_harness_sees_both_outcomes(scratch):
    """The properties above can fail: a good command reaches the fit, a bad one is refused."""
    with _stop_at_the_fit(), pytest.raises(Accepted):
        main(["fit", "--data", "toy1d", "--quiet", "--out", str(scratch / "ok"), "--backend", "map"])
    with redirect_stderr(io.StringIO()) as err:
        assert main(["fit", "--data", "toy1d", "--quiet", "--out", str(scratch / "no"), "--option", "lr=-1"]) == 2
    assert "lr" in err.getvalue()
