"""Self-contained HTML, escaped by construction: Jinja2 templates with autoescaping.

Every piece of a report page is made here by a Jinja2 template whose environment escapes every
value it inserts (``autoescape=True``), and every helper returns :class:`markupsafe.Markup`, the
one type that is inserted as HTML.  Anything else — a ``str`` from a run folder, a metric, an
exception's text — is escaped wherever it goes: into a template, into :func:`join`, or as a
:class:`Section`'s body.  A section builder therefore never writes markup itself: it returns
:func:`join` of helpers (:func:`heading`, :func:`paragraph`, :func:`table`, ...), and a plain
string it returns shows as text, never as markup.  (A run folder may come from someone else:
no value read from it can open a tag, e.g. ``<script>``, in the reader's browser.)

Everything a report page needs is inline (CSS and images as ``data:image/png;base64,``
URIs), so a report is a single file that can be mailed or attached to a notebook.
"""
from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import jinja2
from markupsafe import Markup, escape as _escape

__all__ = ["Section", "Markup", "escape", "fmt", "join", "heading", "table", "frame_table", "image", "link", "note",
           "paragraph", "page"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.25em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}
h3{font-size:1.05em;margin-bottom:.3em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em} th,td{border:1px solid #ddd;padding:.25em .55em;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
.na{color:#666;font-style:italic} .warn{color:#a15c00} .error{color:#b00020}
img{max-width:100%;display:block;margin:.5em 0} .meta{color:#555;font-size:.9em}
nav a{margin-right:.8em;font-size:.9em}
"""

_TEMPLATES = {
    "page": (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        'style-src \'unsafe-inline\'">'
        "<title>{{ title }}</title><style>{{ css }}</style></head><body>\n"
        '<h1>{{ title }}</h1><p class="meta">{{ subtitle }}</p>'
        '<nav>{% for s in sections %}<a href="#{{ s.anchor }}">{{ s.title }}</a>{% endfor %}</nav>\n'
        "{% for s in sections %}{{ s.render() }}\n{% endfor %}</body></html>\n"
    ),
    "section": '<section id="{{ anchor }}"><h2>{{ title }}</h2>\n{{ body }}\n</section>',
    "heading": "<h3>{{ text }}</h3>",
    "paragraph": "<p>{{ text }}</p>",
    "note": '<p class="{{ kind }}">{{ text }}</p>',
    "link": '<a href="{{ href }}">{{ text }}</a>',
    "image": '<img alt="{{ alt }}" src="data:image/png;base64,{{ data }}">',
    "table": (
        "<table>{% if header %}<tr>{% for h in header %}<th>{{ h }}</th>{% endfor %}</tr>{% endif %}"
        "{% for row in rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</table>"
    ),
}
_ENV = jinja2.Environment(loader=jinja2.DictLoader(_TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined)
_NOTE_KINDS = ("na", "warn", "error")
_CLASSES = re.compile(r"[a-z][a-z0-9-]*( [a-z][a-z0-9-]*)*")


def _render(name: str, **values) -> Markup:
    return Markup(_ENV.get_template(name).render(**values))


@dataclass
class Section:
    """One titled block of a report; ``body`` is :class:`Markup` from this module (any other text is escaped)."""

    title: str
    body: str

    @property
    def anchor(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in str(self.title).lower()).strip("-")

    def render(self) -> Markup:
        return _render("section", anchor=self.anchor, title=self.title, body=self.body)


def escape(text) -> Markup:
    """``text`` as HTML-escaped :class:`Markup` (``Markup`` itself is kept as it is)."""
    return _escape(text if isinstance(text, Markup) else str(text))


def fmt(value, digits: int = 4) -> str:
    """Numbers with ``digits`` significant digits; ``None`` → '—'; everything else as text."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) or hasattr(value, "dtype"):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return str(value)
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


def join(parts: Iterable) -> Markup:
    """Parts of a section body, one per line: :class:`Markup` as it is, anything else escaped."""
    return Markup("\n").join(part for part in parts if part is not None)


def heading(text) -> Markup:
    """A sub-heading (``<h3>``) inside a section."""
    return _render("heading", text=text)


def table(rows: Iterable[Sequence], header: Sequence[str] | None = None) -> Markup:
    """An HTML table of cells (:class:`Markup` cells as they are, e.g. :func:`link`; others through :func:`fmt`)."""
    cells = [[c if isinstance(c, Markup) else fmt(c) for c in row] for row in rows]
    return _render("table", rows=cells, header=list(header or []))


def frame_table(frame, index_name: str = "") -> Markup:
    """A pandas DataFrame as a table (index first)."""
    rows = [[index, *values] for index, values in zip(frame.index, frame.itertuples(index=False))]
    return table(rows, [index_name, *map(str, frame.columns)])


def image(png_base64: str, alt: str) -> Markup:
    """An inline PNG; ``png_base64`` must be base64 text (checked, so it cannot carry markup)."""
    try:
        base64.b64decode(png_base64, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise ValueError("image() takes a base64-encoded PNG") from None
    return _render("image", alt=alt, data=png_base64)


def link(href: str, text) -> Markup:
    """A link to a relative path or http(s) address (any other scheme, e.g. ``javascript:``, is refused)."""
    scheme = str(href).split(":", 1)[0].lower() if ":" in str(href).split("/", 1)[0] else ""
    if scheme not in ("", "http", "https"):
        raise ValueError(f"refusing to link to {href!r}: only relative paths and http(s) addresses")
    return _render("link", href=href, text=text)


def note(text: str, kind: str = "na") -> Markup:
    """A one-line remark: ``kind`` is ``na`` (does not apply), ``warn`` or ``error``, optionally followed by
    more CSS class names (``"error failed-fit"``)."""
    if kind.split()[:1] not in ([k] for k in _NOTE_KINDS) or not _CLASSES.fullmatch(kind):
        raise ValueError(f"note kind must start with one of {_NOTE_KINDS} (then CSS class names), got {kind!r}")
    return _render("note", kind=kind, text=text)


def paragraph(text: str) -> Markup:
    return _render("paragraph", text=text)


def page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole HTML document with a table of contents (its Content-Security-Policy allows no script)."""
    return str(_render("page", title=title, subtitle=subtitle, sections=list(sections), css=Markup(_CSS)))
