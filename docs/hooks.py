"""MkDocs hooks (mkdocs.yml ``hooks:``): the site's first page is the README.

``docs/index.md`` is a stub; at build time its Markdown is replaced by ``README.md`` with the
README's links into ``docs/`` made relative to ``docs/`` (``](docs/api.md)`` -> ``](api.md)``), so
the site opens on the same page a repository visitor reads, and ``mkdocs build --strict``
checks the README's links as it checks every page's."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_as_index(text: str) -> str:
    """The README's Markdown as the site's index page sees it."""
    return text.replace("](docs/", "](")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    if page.file.src_uri == "index.md":
        return readme_as_index(README.read_text(encoding="utf-8"))
    return markdown
