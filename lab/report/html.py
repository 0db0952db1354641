"""Self-contained HTML: escaped text, tables, base64 PNG images, one page template.

Everything a report page needs is inline (CSS and images as ``data:image/png;base64,``
URIs), so a report is a single file that can be mailed or attached to a notebook.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["Section", "escape", "fmt", "table", "frame_table", "image", "note", "paragraph", "page"]

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


@dataclass
class Section:
    """One titled block of a report; ``body`` is trusted HTML built with this module."""

    title: str
    body: str

    def render(self) -> str:
        return f'<section id="{_anchor(self.title)}"><h2>{escape(self.title)}</h2>\n{self.body}\n</section>'


def _anchor(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def escape(text) -> str:
    return html.escape(str(text), quote=True)


def fmt(value, digits: int = 4) -> str:
    """Numbers with ``digits`` significant digits; ``None`` → '—'; everything else as text."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) or hasattr(value, "dtype"):
        value = float(value)
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


def table(rows: Iterable[Sequence], header: Sequence[str] | None = None) -> str:
    """An HTML table of already-formatted or raw cells (raw cells go through :func:`fmt`)."""
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{escape(fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def frame_table(frame, index_name: str = "") -> str:
    """A pandas DataFrame as a table (index first)."""
    rows = [[index, *values] for index, values in zip(frame.index, frame.itertuples(index=False))]
    return table(rows, [index_name, *map(str, frame.columns)])


def image(png_base64: str, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{png_base64}">'


def note(text: str, kind: str = "na") -> str:
    """A one-line remark: ``na`` (does not apply), ``warn`` or ``error``."""
    return f'<p class="{kind}">{escape(text)}</p>'


def paragraph(text: str) -> str:
    return f"<p>{escape(text)}</p>"


def page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole HTML document with a table of contents."""
    nav = "".join(f'<a href="#{_anchor(s.title)}">{escape(s.title)}</a>' for s in sections)
    body = "\n".join(s.render() for s in sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{escape(title)}</h1><p class=\"meta\">{escape(subtitle)}</p><nav>{nav}</nav>\n{body}\n</body></html>\n"
    )
