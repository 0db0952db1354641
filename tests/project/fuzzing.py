"""Shared set-up of the fuzz tests (Hypothesis): bounded, reproducible, scalable campaigns.

Every fuzz test uses :func:`fuzz_settings`: a fixed number of examples, no deadline (the machine is
shared), ``derandomize=True`` (the examples are a function of the test's name: CI sees the same ones
every time) and no example database on disk.  ``ZOO_FUZZ_SCALE=k`` multiplies every test's examples
by ``k`` (the campaign of ``benchmarks/fuzz_campaign.py``).  Each test records how many examples it
ran (:func:`count`) in ``$ZOO_FUZZ_COUNTS`` when that names a file, so the campaign can publish totals.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SCALE = float(os.environ.get("ZOO_FUZZ_SCALE", "1"))

#: what hostile text looks like: markup, attribute breakers, template syntax, control and odd characters
PAYLOADS = ['<script>alert(1)</script>', '"><img src=x onerror=alert(1)>', "'><svg onload=alert(1)>",
            "</textarea><b>", "{{ 7*7 }}", "{% raw %}", "javascript:alert(1)", "]]>", "<!--", "&amp;", "\x00",
            "\u202e", "\ud7ff", "../../etc/passwd", "\n", "\r", ",", '"', ":", "=", "%s", "{0}", "NaN", "1e400"]

hostile_text = st.one_of(st.text(max_size=40), st.sampled_from(PAYLOADS),
                         st.lists(st.one_of(st.text(max_size=8), st.sampled_from(PAYLOADS)), max_size=4).map("".join))


def fuzz_settings(examples: int, **kwargs):
    """Hypothesis settings of a fuzz test: ``examples`` × ``ZOO_FUZZ_SCALE`` examples, reproducible."""
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much, HealthCheck.data_too_large],
                    print_blob=True, **kwargs)


def count(name: str, outcomes: dict) -> None:
    """Add one example's ``outcomes`` (e.g. ``{"accepted": 1}``) to the counts file of the campaign."""
    path = os.environ.get("ZOO_FUZZ_COUNTS")
    if not path:
        return
    record = json.dumps({"test": name, **outcomes})
    with open(path, "a") as fh:
        fh.write(record + "\n")


def one_line_naming(message: str, *names) -> bool:
    """Whether an error message is one line that names one of ``names`` (a file, row, column or option)."""
    return "\n" not in message.strip() and any(str(n) in message for n in names if str(n))


def mutate_bytes(data: bytes, draw) -> bytes:
    """``data`` with random byte flips, a truncation, an insertion or a deletion (drawn by ``draw``)."""
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "zero"]))
    if not data:
        return draw(st.binary(max_size=64))
    position = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        flips = draw(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)), min_size=1, max_size=8))
        out = bytearray(data)
        for at, mask in flips:
            out[at] ^= mask
        return bytes(out)
    if kind == "truncate":
        return data[:position]
    if kind == "insert":
        return data[:position] + draw(st.binary(min_size=1, max_size=32)) + data[position:]
    if kind == "delete":
        return data[:position] + data[position + draw(st.integers(1, 64)):]
    return data[:position] + b"\x00" * draw(st.integers(1, 64)) + data[position + 64:]


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), hostile_text),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(hostile_text, children, max_size=4)),
    max_leaves=12)


def mutate_json(obj, draw):
    """``obj`` (parsed JSON) with one random entry replaced, deleted or added, anywhere in its tree."""
    paths = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))
        elif isinstance(node, list):
            for k, value in enumerate(node):
                walk(value, (*path, k))

    walk(obj, ())
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if not path:
        return draw(json_values) if action == "replace" else obj
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "replace":
        parent[last] = draw(json_values)
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[draw(hostile_text)] = draw(json_values)
    else:
        parent.insert(last, draw(json_values))
    return obj


def safe_name(text: str) -> str:
    """``text`` usable as one file name component."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:40] or "x"


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
