"""Small helpers that turn numbers into HTML fragments for the lab report.

Every section module returns a :class:`Section`: its numbers (for ``numbers.json``) and its HTML body.
The helpers here escape every piece of text they are given, so a word or a file name can never break
the page.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Section:
    """One numbered section of the report.

    Attributes:
        key: its anchor in the page and its top-level key in ``numbers.json``.
        title: the heading.
        numbers: JSON-ready figures the section shows.
        body: HTML of the section's content (without the heading).
        highlights: (label, value) pairs printed on the terminal at the end of a run.
    """

    key: str
    title: str
    numbers: dict[str, Any]
    body: str
    highlights: list[tuple[str, str]] = field(default_factory=list)


def esc(text: object) -> str:
    """``text`` as HTML-escaped text."""
    return html.escape(str(text), quote=True)


def para(*sentences: str) -> str:
    """A paragraph from already-escaped (or trusted) HTML pieces."""
    return "<p>" + " ".join(sentences) + "</p>\n"


def heading(text: str) -> str:
    """A sub-heading inside a section."""
    return f"<h3>{esc(text)}</h3>\n"


def fmt(value: float, digits: int = 4) -> str:
    """A number rounded for display; negative zero shown as 0."""
    rounded = round(float(value), digits)
    return f"{rounded + 0.0:.{digits}f}"


def matrix(values: Any, digits: int = 4, *, row_labels: Sequence[str] | None = None,
           col_labels: Sequence[str] | None = None, caption: str = "", css: str = "matrix") -> str:
    """A 2-D array as an HTML table of rounded numbers (integers printed as integers).

    Args:
        values: anything ``np.asarray`` turns into shape (rows, cols).
        digits: decimals shown for floats.
        row_labels, col_labels: optional header labels.
        caption: optional caption above the table.
    """
    arr = np.asarray(values)
    if arr.ndim == 1:
        arr = arr[None, :]
    integer = np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool
    out = [f'<table class="{esc(css)}">']
    if caption:
        out.append(f"<caption>{esc(caption)}</caption>")
    if col_labels is not None:
        corner = "<th></th>" if row_labels is not None else ""
        out.append("<tr>" + corner + "".join(f"<th>{esc(c)}</th>" for c in col_labels) + "</tr>")
    for i, row in enumerate(arr):
        cells = "".join(f"<td>{int(v) if integer else fmt(v, digits)}</td>" for v in row)
        label = f"<th>{esc(row_labels[i])}</th>" if row_labels is not None else ""
        out.append(f"<tr>{label}{cells}</tr>")
    out.append("</table>\n")
    return "".join(out)


def table(header: Sequence[str], rows: Iterable[Sequence[object]], css: str = "facts") -> str:
    """A plain table of text cells (each cell escaped)."""
    out = [f'<table class="{esc(css)}"><tr>' + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    out.append("</table>\n")
    return "".join(out)


def code(text: str) -> str:
    """Preformatted text (already computed output, shown as the terminal would)."""
    return f"<pre>{esc(text)}</pre>\n"


def figure(png_base64: str, alt: str, caption: str) -> str:
    """An inline PNG figure with alt text and a caption."""
    return (
        f'<figure><img src="data:image/png;base64,{png_base64}" alt="{esc(alt)}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>\n"
    )


def check(ok: bool, text: str) -> str:
    """A one-line pass/fail statement with a coloured mark."""
    mark, css = ("&#10003;", "ok") if ok else ("&#10007;", "bad")
    return f'<p class="check {css}"><span class="mark">{mark}</span> {esc(text)}</p>\n'


def checks_in(body: str) -> list[tuple[bool, str]]:
    """The :func:`check` statements of a section's html, in order: (whether it holds, its text)."""
    found = re.findall(r'<p class="check (ok|bad)"><span class="mark">[^<]*</span> (.*?)</p>', body)
    return [(css == "ok", html.unescape(text)) for css, text in found]
