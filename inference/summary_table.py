"""Short summaries for notebooks: the ``__repr__`` (text) and ``_repr_html_`` (HTML table) of
:class:`~inference.posterior.Posterior` and :class:`~inference.prediction.Prediction`."""
from __future__ import annotations

import html

__all__ = ["text_table", "html_table", "fmt"]


def fmt(value) -> str:
    """A number with 4 significant digits (integers as they are), anything else as ``str``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def text_table(title: str, rows: list[tuple[str, str]]) -> str:
    """``title`` and one ``label  value`` line per row."""
    width = max((len(label) for label, _ in rows), default=0)
    return "\n".join([title] + [f"  {label.ljust(width)}  {value}" for label, value in rows])


def html_table(title: str, rows: list[tuple[str, str]]) -> str:
    """A two-column HTML table (label, value) with ``title`` as its caption; text escaped."""
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(label)}</th>"
        f"<td style='text-align:left'>{html.escape(value)}</td></tr>"
        for label, value in rows
    )
    return f"<table><caption style='text-align:left;font-weight:bold'>{html.escape(title)}</caption>{body}</table>"
