"""The blocks a ``weightgraft paper`` report is made of (headings, paragraphs, tables, charts) and
their two renderings, ``paper.md`` and ``paper.html``: the report's sections build blocks, and only
this module knows how a block reads on either page, so the two pages always say the same."""

from __future__ import annotations

import base64
import dataclasses
import html
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Union

from weightgraft.report.html import CSS, html_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclasses.dataclass(frozen=True)
class Table:
    """A table of text cells, one tuple per row, as wide as ``header``."""

    header: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class Image:
    """A chart written as ``name`` (PNG) beside ``paper.html`` and embedded in it."""

    name: str
    caption: str
    digest: str
    draw: Callable[[], Figure] = dataclasses.field(compare=False, repr=False)


Block = Union[tuple[str, str], Table, Image]  # ("h1" | "h2" | "h3" | "p", text), a table or a chart


def _md_cell(text: str) -> str:
    """A cell's text kept on one row of a markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


HEADINGS = {"h1": "# ", "h2": "## ", "h3": "### ", "p": ""}


def to_markdown(blocks: Sequence[Block]) -> str:
    """``paper.md``: each chart as a link to its PNG, a table's ``|`` escaped in its cells."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Table):
            out.append("| " + " | ".join(b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.caption}]({b.name})", ""]
        else:
            kind, text = b
            out += [HEADINGS[kind] + text, ""]
    return "\n".join(out)


def _code(escaped: str) -> str:
    """Markdown's `code` spans and ``[text](relative link)`` of a paragraph as ``<code>`` and ``<a>``
    in the page (a linked report is a file beside the page, as in ``paper.md``)."""
    linked = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', escaped)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", linked)


def _img(folder: Path, image: Image) -> str:
    data = base64.b64encode((folder / image.name).read_bytes()).decode("ascii")
    caption = html.escape(image.caption)
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{caption}">'
            f"<figcaption>{caption} ({html.escape(image.name)})</figcaption></figure>")


def to_html(blocks: Sequence[Block], folder: Path) -> str:
    """The page, each chart embedded from its PNG in ``folder``."""
    body: list[str] = []
    title = ""
    for b in blocks:
        if isinstance(b, Table):
            body.append(html_table(b.header, b.rows))
        elif isinstance(b, Image):
            body.append(_img(folder, b))
        else:
            kind, text = b
            title = title or text
            body.append(f"<{kind}>{_code(html.escape(text))}</{kind}>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
