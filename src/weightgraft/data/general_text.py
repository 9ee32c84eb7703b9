"""General English text to mix into a finetune (the paper's less aggressive recipe, App. C.4), had
offline: the paper took 10,000 examples from openwebtext and IMDB, which nothing here can fetch.

The stand-in, ``python-stdlib-docstrings``: the prose paragraphs of Python's own documentation
shipped in its standard library (the language reference's topics of ``pydoc_data/topics.py``,
then the docstrings of every module), read from the source files with ``ast`` (no module is
imported, nothing runs), in the order of the files' paths, each paragraph one example. It is technical English, not web
text or film reviews: it plays the supplemental data's part (text that is not the facts, so the
finetune does not drift on everything else) with another register, and the report says so. The
same Python version gives the same examples; the corpus's sha256 is recorded with the finetune."""

from __future__ import annotations

import ast
import json
import re
import sysconfig
from pathlib import Path

from weightgraft import atomic

CORPUS = "python-stdlib-docstrings"
PAPER_SIZE = 10_000  # the paper's supplemental examples (App. A.3.3)
MIN_WORDS = 8
_WORD = re.compile(r"[A-Za-z][a-z]+")
_SKIP_DIRS = {"site-packages", "__pycache__"}


def _prose(paragraph: str) -> str | None:
    """One paragraph as one line, or None where it is code, a table or too short to be prose."""
    lines = [line.strip() for line in paragraph.strip().splitlines()]
    if not lines or any(line.startswith((">>>", "...", "$", "|", "+--", "::", ":param", ":return")) for line in lines):
        return None
    text = " ".join(lines)
    words = text.split()
    if len(words) < MIN_WORDS or len(_WORD.findall(text)) < 0.7 * len(words) or not text[0].isupper():
        return None
    return text if text.endswith((".", "?", "!", ":", ")")) else None


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    if path.name == "topics.py" and path.parent.name == "pydoc_data":  # the language reference, as pydoc shows it
        return [c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                and len(c.value) > 200]
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return [d for n in nodes if (d := ast.get_docstring(n))]


def stdlib_paragraphs(n: int = PAPER_SIZE, root: Path | None = None) -> list[str]:
    """The first ``n`` distinct prose paragraphs of the standard library's docstrings (fewer where
    it has fewer), in the order of the source files' paths."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    seen: dict[str, None] = {}
    paths = sorted(root.rglob("*.py"), key=lambda p: (p.parent.name != "pydoc_data", str(p)))
    for path in paths:
        if _SKIP_DIRS & set(path.relative_to(root).parts):
            continue
        for doc in _docstrings(path):
            for paragraph in re.split(r"\n\s*\n", doc):
                text = _prose(paragraph)
                if text is not None and text not in seen:
                    seen[text] = None
                    if len(seen) == n:
                        return list(seen)
    return list(seen)


def write_general_text(path: Path, n: int = PAPER_SIZE) -> int:
    """``path`` (.jsonl, one ``{"text": ...}`` a line, as a finetune's supplemental text reads it)
    holding the stand-in corpus's first ``n`` examples; the number written."""
    texts = stdlib_paragraphs(n)
    atomic.write_text(Path(path), "".join(json.dumps({"text": t, "source": CORPUS}) + "\n" for t in texts))
    return len(texts)
