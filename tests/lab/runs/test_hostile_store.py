"""Hostile inputs to the lab/ side (issue 24): one table-driven test per class.

Classes: a tampered or planted run folder (it is not trusted), HTML injection through a run
folder, planted links at lock, report and output paths, a symlinked ``--out``, disk-full and I/O
errors while writing, Ctrl-C at any moment, absurd CLI sizes and misleading messages, hostile
data files.  Every case must end in a clean one-line error (or a correct result) within seconds:
no traceback, no hang, nothing half-written, the earlier run intact.
"""
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lab.runs.execution
import lab.runs.store
from lab.cli import main
from lab.runs.isolated import write_in_child
from lab.report import render_section, write_report
from lab.report.html import join, link, note, table
from lab.report.rundata import open_run
from lab.runs.spec import RunSpec
from lab.runs.execution import RUN_FILES, execute, write_run
from lab.runs.store import (COMPLETE, RunLock, StoreError, WriteError, check_folder, note_interrupt,
                       seal, staged_directory, verify_run, write_text_file)
from zoo.data import DataError, load_dataset

ROOT = Path(__file__).resolve().parents[3]
SPEC = RunSpec(data="toy1d", hidden=[4], epochs=3, num_samples=10)
FAST = 10.0  # seconds any refusal may take (a hash of /dev/zero would never end)


@pytest.fixture(scope="module")
def result():
    return execute(SPEC, progress=False)


@pytest.fixture(scope="module")
def written(result, tmp_path_factory):
    """A run folder written once; each test works on its own copy."""
    return write_run(result, tmp_path_factory.mktemp("runs") / "run")


@pytest.fixture
def run(written, tmp_path):
    return Path(shutil.copytree(written, tmp_path / "run"))


def _snapshot(directory: Path) -> dict:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _relist(run: Path, change) -> None:
    """Edit the manifest: ``change(files)`` mutates its ``files`` dict."""
    manifest = json.loads((run / COMPLETE).read_text())
    change(manifest["files"])
    (run / COMPLETE).write_text(json.dumps(manifest))


def _record(size: int = 0) -> dict:
    return {"size": size, "sha256": "0" * 64}


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)


# ------------------------------------------------------------------ 1. the run folder is not trusted
TAMPERED = {
    "lists ../../dev/zero": (lambda r: _relist(r, lambda f: f.update({"../../dev/zero": {"size": 1 << 40,
                                                                                         "sha256": "0" * 64}})),
                             "outside the run folder"),
    "lists an absolute path": (lambda r: _relist(r, lambda f: f.update({"/etc/passwd": _record()})),
                               "outside the run folder"),
    "lists posterior/../../x": (lambda r: _relist(r, lambda f: f.update({"posterior/../../x": _record()})),
                                "outside the run folder"),
    "lists a name with a NUL": (lambda r: _relist(r, lambda f: f.update({"a\x00b": _record()})),
                                "not a file name inside"),
    "lists a backslash path": (lambda r: _relist(r, lambda f: f.update({"..\\..\\x": _record()})),
                               "not a file name inside"),
    "a listed file is a link to /dev/zero": (
        lambda r: ((r / "train.nc").unlink(), (r / "train.nc").symlink_to("/dev/zero")), "symbolic link"),
    "posterior/ is a link to a folder outside": (
        lambda r: (shutil.move(r / "posterior", r.parent / "elsewhere"), (r / "posterior").symlink_to(r.parent / "elsewhere")),
        "symbolic link"),
    "COMPLETE is a link": (
        lambda r: (shutil.move(r / COMPLETE, r.parent / "manifest"), (r / COMPLETE).symlink_to(r.parent / "manifest")),
        "symbolic link"),
    "a listed file is a FIFO": (lambda r: _fifo(r / "metrics.json"), "regular file"),
    "an unlisted file in posterior/": (lambda r: (r / "posterior" / "extra.pt").write_bytes(b"x"), "not listed"),
    "a 1 TiB sparse file in place of a listed one": (lambda r: _sparse(r / "posterior.nc", 1 << 40), "bytes"),
    "a 1 TiB sparse COMPLETE": (lambda r: _sparse(r / COMPLETE, 1 << 40), "more than any run writes"),
    "COMPLETE is a JSON list": (lambda r: (r / COMPLETE).write_text("[1, 2]"), "unreadable"),
    "COMPLETE nested 100000 deep": (lambda r: (r / COMPLETE).write_text("[" * 100000 + "]" * 100000), "unreadable"),
    "a record without a digest": (lambda r: _relist(r, lambda f: f["metrics.json"].pop("sha256")), "unreadable"),
    "a record with a string size": (lambda r: _relist(r, lambda f: f["metrics.json"].update(size="7")), "unreadable"),
    "files is a list": (lambda r: (r / COMPLETE).write_text('{"files": ["metrics.json"]}'), "unreadable"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_run_folder_is_refused_in_one_line_and_fast(run, case):
    tamper, message = TAMPERED[case]
    tamper(run)
    started = time.perf_counter()
    for read in (lambda: verify_run(run, RUN_FILES), lambda: open_run(run)):
        with pytest.raises(StoreError, match=message) as caught:
            read()
        assert "\n" not in str(caught.value)
    assert time.perf_counter() - started < FAST


def test_resealed_json_that_is_not_an_object_is_refused_by_the_report(run):
    (run / "metrics.json").write_text("[1, 2, 3]")
    seal(run)  # a consistent manifest: only the content is hostile
    with pytest.raises(StoreError, match="not an object"):
        open_run(run)


# ------------------------------------------------------------------ 2. nothing from a run folder runs as script
PAYLOAD = '<script>alert(1)</script><img src=x onerror="alert(2)">'


def _inject(run: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    config["prune"] = {"mode": PAYLOAD, "num_pruned": PAYLOAD, "layers": {PAYLOAD: 0.5}, "sizes": {PAYLOAD: 3}}
    config["spec"]["data"] = PAYLOAD
    config["data"] = {PAYLOAD: PAYLOAD}
    (run / "config.json").write_text(json.dumps(config))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics.update(data=PAYLOAD, model=PAYLOAD, backend=PAYLOAD, rmse=PAYLOAD)
    (run / "metrics.json").write_text(json.dumps(metrics))
    seal(run)


def _assert_inert(html: str) -> None:
    assert "<script" not in html and "onerror=" not in html.replace("onerror=&#34;", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_values_from_a_run_folder_are_escaped_in_every_section(run, tmp_path):
    named = run.parent / f"{PAYLOAD.replace('/', '_')}"
    run.rename(named)
    _inject(named)
    html = write_report(named, tmp_path / "report.html").read_text()
    _assert_inert(html)
    assert "Content-Security-Policy" in html  # and no script would run even if one got through
    for tag in ("h3", "table", "p", "section"):  # every builder returns markup: none is shown as text
        assert f"&lt;{tag}" not in html
    layers = render_section(named, "Variational layers")  # the issue's <h3>Pruned: {mode}</h3>
    assert "&lt;script&gt;" in layers and "<script" not in layers


ESCAPING = {
    "a plain string in a section body": (lambda: join(["<b>x</b>"]), "&lt;b&gt;x&lt;/b&gt;"),
    "a table cell": (lambda: table([["<i>"]], ["<th>"]), "&lt;i&gt;"),
    "a note": (lambda: note("<script>"), "&lt;script&gt;"),
    "a link's text and address": (lambda: link("a\"onclick=\"x.html", "<u>"), "&lt;u&gt;"),
}


@pytest.mark.parametrize("case", list(ESCAPING))
def test_html_helpers_escape_by_construction(case):
    make, expected = ESCAPING[case]
    html = str(make())
    assert expected in html and "<script" not in html and "<b>x" not in html and '"onclick' not in html


@pytest.mark.parametrize("href", ["javascript:alert(1)", "JavaScript:alert(1)", "data:text/html,<script>"])
def test_links_to_script_schemes_are_refused(href):
    with pytest.raises(ValueError, match="refusing to link"):
        link(href, "run")


# ------------------------------------------------------------------ 3. planted links at lock, report and output files
def test_a_link_planted_at_the_lock_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".lock").symlink_to(victim)
    with pytest.raises(StoreError, match="symbolic link"):
        with RunLock(tmp_path / "out"):
            pass
    assert victim.read_text() == "precious"


def test_a_fifo_planted_at_the_lock_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / ".lock")
    started = time.perf_counter()
    with pytest.raises(StoreError, match="not a regular file"):
        with RunLock(tmp_path):
            pass
    assert time.perf_counter() - started < FAST


@pytest.mark.parametrize("plant", ["link to a file", "dangling link"])
def test_write_text_file_replaces_a_planted_link_and_never_writes_through(tmp_path, plant):
    victim = tmp_path / "victim.txt"
    if plant == "link to a file":
        victim.write_text("precious")
    (tmp_path / "report.html").symlink_to(victim)
    write_text_file(tmp_path / "report.html", "<p>new</p>")
    assert not (tmp_path / "report.html").is_symlink() and (tmp_path / "report.html").read_text() == "<p>new</p>"
    assert (victim.read_text() == "precious") if plant == "link to a file" else not victim.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"report.html", *(["victim.txt"] if victim.exists()
                                                                                   else [])})


def test_experiment_tables_replace_links_planted_at_their_names(tmp_path):
    from lab.grids.registry import get_experiment
    from lab.grids.tables import write_tables

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("failures.txt", "results.csv", "summary.md"):
        (out / name).symlink_to(victim)
    write_tables(get_experiment("smoke"), [], tmp_path / "runs", out, {"det-0": "ValueError: x"})
    assert victim.read_text() == "precious"
    assert (out / "failures.txt").read_text() == "det-0\tValueError: x\n" and not (out / "failures.txt").is_symlink()
    assert not (out / "results.csv").exists() and not (out / "summary.md").exists()


# ------------------------------------------------------------------ 4. a symlinked --out
def _target(tmp_path: Path, kind: str, written: Path) -> Path:
    target = tmp_path / "target"
    if kind == "to a file":
        target.write_text("x")
    elif kind == "to an empty folder":
        target.mkdir()
    elif kind == "to a run":
        shutil.copytree(written, target)
    return target


SYMLINKED_OUT = {"dangling": "which does not exist", "to a file": "a file", "to an empty folder": "an empty folder",
                 "to a run": "a run"}


@pytest.mark.parametrize("kind", list(SYMLINKED_OUT))
def test_a_symlinked_out_is_refused_before_any_work(tmp_path, written, monkeypatch, capsys, kind):
    target = _target(tmp_path, kind, written)
    out = tmp_path / "out"
    out.symlink_to(target)
    before = _snapshot(target) if target.is_dir() else None
    monkeypatch.setattr(lab.runs.execution, "fit", lambda *a, **k: pytest.fail("fitted before refusing --out"))
    for overwrite in ([], ["--overwrite"]):
        code = main(["fit", "--data", "toy1d", "--hidden", "4", "--epochs", "3", "--quiet", "--out", str(out), *overwrite])
        err = capsys.readouterr().err.strip()
        assert code == 2 and "symbolic link" in err and SYMLINKED_OUT[kind] in err and "\n" not in err
    assert out.is_symlink() and (before is None or _snapshot(target) == before)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", *(["target"] if kind != "dangling" else [])])


@pytest.mark.parametrize("kind, outcome", [("to an empty folder", "followed"), ("dangling", "does not exist"),
                                           ("to a file", "is a file")])
def test_an_experiment_folder_link_is_followed_to_a_folder_and_refused_otherwise(tmp_path, written, kind, outcome):
    target = _target(tmp_path, kind, written)
    (tmp_path / "out").symlink_to(target)
    if outcome == "followed":
        assert check_folder(tmp_path / "out") == target.resolve()
    else:
        with pytest.raises(StoreError, match=outcome):
            check_folder(tmp_path / "out")


# ------------------------------------------------------------------ 5. disk full and I/O errors while writing
def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "x")


WRITE_FAULTS = {  # (object, attribute) that fails with ENOSPC while a run replaces the old one
    "writing posterior.nc": (lab.runs.execution, "save_netcdf"),
    "writing metrics.json": (lab.runs.execution, "_write_json"),
    "sealing": (lab.runs.store, "seal"),
    "the swap": (lab.runs.store, "_exchange"),
}


@pytest.mark.parametrize("step", list(WRITE_FAULTS))
def test_an_io_error_at_any_step_is_one_line_and_leaves_the_old_run(run, result, monkeypatch, step):
    owner, name = WRITE_FAULTS[step]
    before = _snapshot(run)
    monkeypatch.setattr(owner, name, _enospc)
    with pytest.raises(WriteError, match="No space left on device.*the run already there is unchanged") as caught:
        write_run(result, run, overwrite=True)
    assert "\n" not in str(caught.value)
    assert _snapshot(run) == before and sorted(p.name for p in run.parent.iterdir()) == ["run"]


def test_a_crashing_writer_cannot_take_the_process_down(tmp_path):
    def crash(path):
        Path(path).write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGSEGV)

    with pytest.raises(OSError, match="crashed"):
        write_in_child(crash, tmp_path / "posterior.nc")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="RLIMIT_FSIZE fault injection in a forked child")
def test_a_real_file_size_limit_while_writing_posterior_nc_is_one_line_and_keeps_the_earlier_run(run, result):
    before = _snapshot(run)
    limit = (run / "posterior.nc").stat().st_size // 2  # the JSON files and posterior/ fit, posterior.nc does not
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child writes under the limit (libhdf5 really fails; nothing is monkeypatched)
        outcome = "no error"
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            write_run(result, run, overwrite=True)
        except WriteError as err:
            outcome = str(err)
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            outcome = f"{type(err).__name__}: {err}"
        finally:
            os.write(write_end, outcome.encode()[:4000])
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    outcome = os.read(read_end, 4096).decode()
    os.close(read_end)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert outcome.startswith("could not write the run") and "File too large (posterior.nc)" in outcome, outcome
    assert "\n" not in outcome and outcome.endswith("the run already there is unchanged")
    assert _snapshot(run) == before and sorted(p.name for p in run.parent.iterdir()) == ["run"]
    verify_run(run, RUN_FILES)


def test_the_cli_reports_a_write_error_in_one_line_with_status_1(tmp_path, result, monkeypatch, capsys):
    monkeypatch.setattr("lab.cli.execute", lambda spec, out, **kw: write_run(result, out))
    monkeypatch.setattr(lab.runs.execution, "_write_json", _enospc)
    code = main(["fit", "--data", "toy1d", "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: could not write the run") and "No space left" in err
    assert "\n" not in err and not list(tmp_path.iterdir())


# ------------------------------------------------------------------ 6. Ctrl-C at any moment
def test_a_swallowed_ctrl_c_still_stops_the_write(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with staged_directory(tmp_path / "run") as staging:
            (staging / "metrics.json").write_text("{}")
            note_interrupt()  # the handler ran, but the KeyboardInterrupt was lost (e.g. inside a finaliser)
    lab.runs.store.interrupted(clear=True)
    assert not list(tmp_path.iterdir())


def test_a_swallowed_ctrl_c_never_exits_0(tmp_path, result, monkeypatch, capsys):
    def swallowed(spec, out, **kwargs):  # the interrupt lands and is lost during the fit; the run is then written
        note_interrupt()
        return write_run(result, out)

    monkeypatch.setattr("lab.cli.execute", swallowed)
    code = main(["fit", "--data", "toy1d", "--quiet", "--out", str(tmp_path / "run")])
    assert code == 130 and capsys.readouterr().err.strip() == "interrupted (Ctrl-C)"
    assert not (tmp_path / "run").exists()


def _interrupt_after(command: list, delay: float, tmp_path: Path):
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    time.sleep(delay)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal does: the whole process group, workers included
    _, err = process.communicate(timeout=120)
    return process.returncode, err


CTRL_C = {  # (command, seconds before Ctrl-C)
    "while importing torch, pyro and arviz": (["fit", "--data", "toy1d"], 1.0),
    "experiment worker start-up": (["experiment", "smoke", "--workers", "2", "--quiet"], None),
}


@pytest.mark.parametrize("case", list(CTRL_C))
def test_ctrl_c_exits_130_with_one_line_and_no_traceback(tmp_path, case):
    arguments, delay = CTRL_C[case]
    out = tmp_path / "out"
    command = [sys.executable, "-m", "zoo", *arguments, "--out", str(out)]
    if delay is None:  # just after the workers are spawned: when the experiment's folder appears
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        deadline = time.monotonic() + 120
        while not (out / ".lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=120)
        code = process.returncode
    else:
        code, err = _interrupt_after(command, delay, tmp_path)
    assert code == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C)" and "Traceback" not in err
    assert not (out / "runs").exists() or not [p for p in (out / "runs").iterdir() if not (p / COMPLETE).exists()]


# ------------------------------------------------------------------ 7. absurd sizes and misleading CLI messages
CLI = {  # arguments -> (exit status, text of the one-line error)
    "--prune with a backend that cannot prune": (["--prune", "principled", "--backend", "svi"], "variational-family"),
    "--prune with no random weights": (["--prune", "random", "--backend", "graves", "--stochastic", "none"],
                                       "variational-family"),
    "--epochs 1e30": (["--epochs", "1e30"], "counts above"),
    "--epochs 1e3x": (["--epochs", "1e3x"], "must be a whole number"),
    "--batch-size 0": (["--batch-size", "0"], "positive integer"),
}


@pytest.mark.parametrize("case", list(CLI))
def test_bad_cli_values_are_refused_before_any_work(tmp_path, monkeypatch, capsys, case):
    arguments, message = CLI[case]
    monkeypatch.setattr(lab.runs.execution, "fit", lambda *a, **k: pytest.fail("fitted before refusing"))
    try:
        code = main(["fit", "--data", "toy1d", "--quiet", "--out", str(tmp_path / "run"), *arguments])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ 8. hostile data files
def _write(name: str, content: bytes):
    def make(tmp_path: Path) -> Path:
        path = tmp_path / name
        path.write_bytes(content)
        return path
    return make


DATA_FILES = {
    "random bytes as a CSV": (_write("g.csv", bytes(range(256)) * 16), "csv:{}:b", "not a text CSV file"),
    "control bytes, no NUL": (_write("c.csv", bytes(range(1, 9)) + b"abc"), "csv:{}:b", "not a text CSV file"),
    "Latin-1 text": (_write("l.csv", "a,b\n1,caf\xe9\n".encode("latin-1") + b"2,3\n" * 10), "csv:{}:b", "not UTF-8"),
    "a 2-million-digit field": (_write("d.csv", b"a,b\n" + b"1" * 2_000_000 + b",2\n3,4\n"), "csv:{}:b",
                                "(2000000 characters)"),
    "a 2-million-character field": (_write("t.csv", b"a,b\n" + b"x" * 2_000_000 + b",2\n3,4\n"), "csv:{}:b",
                                    "(2000000 characters)"),
    "a file as the Euler folder": (_write("euler.csv", b"x"), "euler:{}", "is a file, not a folder"),
}


@pytest.mark.parametrize("case", list(DATA_FILES))
def test_hostile_data_files_are_refused_in_one_line(tmp_path, case):
    make, spec, message = DATA_FILES[case]
    path = make(tmp_path)
    started = time.perf_counter()
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        load_dataset(spec.format(path))
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 600
    assert time.perf_counter() - started < FAST


@pytest.mark.parametrize("ending", ["raises KeyboardInterrupt", "killed by SIGINT"])
def test_ctrl_c_in_the_netcdf_writer_is_raised_as_ctrl_c(tmp_path, ending):
    def interrupted(path):
        if ending == "raises KeyboardInterrupt":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGINT)  # SIG_DFL in the writer: it dies by the signal, as from a terminal
        time.sleep(5)

    with pytest.raises(KeyboardInterrupt):
        write_in_child(interrupted, tmp_path / "posterior.nc")


@pytest.mark.parametrize("backend", ["svi", "map"])
def test_an_absurd_learning_rate_is_a_failed_fit_not_a_bad_input(tmp_path, capsys, backend):
    code = main(["fit", "--data", "toy1d", "--hidden", "4", "--epochs", "20", "--lr", "1e30", "--backend", backend,
                 "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err and ("the fit diverged" in err or "non-finite" in err), err
    assert "Expected parameter" not in err and not (tmp_path / "run").exists()


def test_workers_are_spawned_with_ctrl_c_blocked():
    """multiprocessing's resource tracker unblocks SIGINT after spawning itself (CPython 3.11): ctrl_c_held
    starts it first, so the pool's workers inherit the block and a Ctrl-C while they import is the parent's."""
    from inference.workers import ctrl_c_held, worker_pool

    with ctrl_c_held():
        pool = worker_pool(1)
        future = pool.submit(_blocked_signals)
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    try:
        assert signal.SIGINT in future.result(timeout=120), "the worker was spawned with Ctrl-C deliverable"
    finally:
        pool.shutdown()


def _blocked_signals() -> set:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, set()))
