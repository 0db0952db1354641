"""Fuzzing what is read back and shown (issue 41): saved posteriors and every string the HTML reports render.

* Save files: a real save (``posterior/`` of a run: ``posterior.json``, ``posterior.pt``, ``info.json``) with
  random byte flips, truncations, insertions and JSON mutations (an entry replaced, deleted or added anywhere
  in the tree).  :func:`inference.load_posterior` either loads a posterior that then predicts, or raises
  :class:`inference.storage.save_files.SaveFileError` (its documented type, a ``ValueError``) naming the file.
* Reports: hostile strings (markup, attribute breakers, template syntax, control characters) as data set
  names, column names, option names and values, spec fields, metrics and folder names.  Every page and
  builder must show them as text: the parsed page has no tag or attribute the same page with harmless
  strings lacks, no ``on…`` attribute and no script; a string given to a builder comes back as its text.
"""
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.project.fuzzing import PAYLOADS, count, fuzz_settings, hostile_text, json_values, mutate_bytes, mutate_json, safe_name
from inference import load_posterior
from inference.storage.save_files import SaveFileError
from lab.report import render_run, render_section
from lab.report.html import Section, escape, frame_table, heading, join, link, note, page, paragraph, table
from lab.runs.spec import RunSpec
from lab.runs.execution import execute
from lab.runs.store import seal

SAVE_FILES = ("posterior.json", "posterior.pt", "info.json")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A real run folder (SVI on toy1d, seconds)."""
    folder = tmp_path_factory.mktemp("fuzz-run") / "run"
    execute(RunSpec(data="toy1d", hidden=[4], epochs=3, num_samples=10), folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-scratch")


# ------------------------------------------------------------------ save files
@fuzz_settings(300)
@given(st.data())
def test_a_damaged_save_loads_and_predicts_or_raises_save_file_error(run_folder, scratch, data):
    save = scratch / "save"
    if save.exists():
        shutil.rmtree(save)
    shutil.copytree(run_folder / "posterior", save)
    name = data.draw(st.sampled_from(SAVE_FILES), label="file")
    path = save / name
    if name.endswith(".json") and data.draw(st.booleans(), label="as JSON"):
        path.write_text(json.dumps(mutate_json(json.loads(path.read_text()), data.draw), allow_nan=True))
    else:
        path.write_bytes(mutate_bytes(path.read_bytes(), data.draw))
    with mock.patch.dict("os.environ", {"ZOO_MEMORY_LIMIT": "1G"}):  # whatever a size field says: no huge allocation
        try:
            posterior = load_posterior(save)
        except SaveFileError as err:
            message = str(err)
            assert "\n" not in message.strip() and str(save) in message, message
            count("save", {"refused": 1})
            return
        prediction = posterior.predict(torch.zeros(3, 1), num_samples=2, seed=0)
    assert prediction.f.shape[-2] == 3
    count("save", {"loaded": 1})


# ------------------------------------------------------------------ the HTML builders
class _Page(HTMLParser):
    """Tags, attributes and text of a page."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.attributes, self.text = set(), [], []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attributes += attrs

    def handle_data(self, data):
        self.text.append(data)


def assert_inert(html: str, baseline: str) -> _Page:
    """``html`` has no tag that ``baseline`` (the same page with harmless strings) lacks, no event-handler
    attribute and no script or ``javascript:`` address."""
    parsed, expected = _Page(html), _Page(baseline)
    assert parsed.tags <= expected.tags | {"tr", "td", "th"}, parsed.tags - expected.tags
    assert not [a for a, _ in parsed.attributes if a.lower().startswith("on")]
    assert not [v for _, v in parsed.attributes if v and v.strip().lower().startswith(("javascript:", "data:text"))]
    assert "script" not in parsed.tags
    return parsed


BUILDERS = {  # name -> (builder of one string, the string's text as it must come back)
    "escape": lambda s: escape(s),
    "heading": lambda s: heading(s),
    "note": lambda s: note(s),
    "paragraph": lambda s: paragraph(s),
    "join": lambda s: join([s, heading(s)]),
    "table cell": lambda s: table([[s, 1.5]], ["name", "value"]),
    "table header": lambda s: table([[1, 2]], [s, s + "2"]),
    "frame column and index": lambda s: frame_table(pd.DataFrame({s: [1.0], "v": [s]}, index=[s]), index_name=s),
    "link text": lambda s: link("run/report.html", s),
    "page title": lambda s: page(s, s, [Section(s, s)]),
}


@fuzz_settings(150)
@given(st.sampled_from(sorted(BUILDERS)), hostile_text)
def test_every_html_builder_shows_any_string_as_text(builder, text):
    html = str(BUILDERS[builder](text))
    parsed = assert_inert(html, str(BUILDERS[builder]("x")))
    shown = "".join(parsed.text)  # (the parser has turned character references back into text)
    visible = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    assert all(part in shown.replace("\r", "\n") for part in visible.split() if part), (text, html)
    count("html", {"builder": 1})


@fuzz_settings(60)
@given(hostile_text)
def test_link_addresses_are_relative_or_http_or_refused(href):
    try:
        html = str(link(href, "run"))
    except ValueError as err:
        assert "refusing to link" in str(err)
        count("html", {"refused_link": 1})
        return
    assert_inert(html, str(link("a.html", "run")))
    count("html", {"link": 1})


# ------------------------------------------------------------------ strings in a run folder, rendered
def _inject(run: Path, strings: dict) -> None:
    config = json.loads((run / "config.json").read_text())
    config["spec"].update(data=strings["data set"], stochastic=strings["spec"], prior=strings["spec"])
    config["data"].update(name=strings["data set"], columns=[strings["column"], "y"], **{strings["column"]: 1})
    config["backend_options"] = {strings["option"]: strings["value"], "guide": strings["value"],
                                 "epochs": strings["nested"]}
    config["prune"] = {"mode": strings["value"], "layers": {strings["column"]: 0.5}}
    (run / "config.json").write_text(json.dumps(config, allow_nan=True))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics.update(data=strings["data set"], backend=strings["spec"], model=strings["spec"],
                   failed_fit_reason=strings["value"], rmse=strings["value"])
    (run / "metrics.json").write_text(json.dumps(metrics, allow_nan=True))
    seal(run)


run_strings = st.fixed_dictionaries({"data set": hostile_text, "column": hostile_text, "option": hostile_text,
                                     "value": hostile_text, "spec": hostile_text, "nested": json_values})


def _copy(run_folder: Path, scratch: Path, name: str) -> Path:
    target = scratch / name
    if target.exists():
        shutil.rmtree(target)
    return Path(shutil.copytree(run_folder, target))


@fuzz_settings(150)
@given(run_strings)
def test_strings_of_a_run_folder_are_escaped_in_the_overview(run_folder, scratch, strings):
    baseline = render_section(run_folder, "Run, configuration and timings")
    run = _copy(run_folder, scratch, "hostile")
    _inject(run, strings)
    html = render_section(run, "Run, configuration and timings")
    parsed = assert_inert(html, baseline)
    shown = "".join(parsed.text)  # (the parser has turned character references back into text)
    for key in ("data set", "option"):
        assert strings[key].strip() == "" or strings[key].split()[0] in shown, (key, strings[key])
    count("html", {"overview": 1})


@fuzz_settings(1)
@given(run_strings, hostile_text)
def test_every_section_of_a_whole_report_escapes_a_hostile_run(run_folder, scratch, strings, folder_name):
    baseline = render_run(run_folder)
    run = _copy(run_folder, scratch, f"run-{safe_name(folder_name)}")
    _inject(run, {**strings, "data set": strings["data set"] + PAYLOADS[0]})
    html = render_run(run)
    assert_inert(html, baseline)
    assert "&lt;script&gt;" in html
    count("html", {"report": 1})
