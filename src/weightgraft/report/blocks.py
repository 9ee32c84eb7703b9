"""Generated blocks of the docs: a table of numbers or verdicts that a page shows is either made by
a report writer from a run folder, between two markers that name it, the version of the claims'
rules and metric it was made with, and the command that makes it again::

    <!-- weightgraft:generated block=NAME rules=8 command="weightgraft paper --model M --out DIR" -->
    ...
    <!-- /weightgraft:generated block=NAME -->

or written by hand and says so, with its source, on a line of its own above it::

    <!-- weightgraft:hand-written source="the run or command and commit the numbers come from" -->

``tests/project/test_docs_blocks.py`` reads every page under docs/ with this module: it fails on
a block made by older rules than ``localization.claims.RULES_VERSION`` (naming the block and its
command) and on a table of numbers or verdicts in neither form. ``docs/splice.py`` puts a
report's block into a page in place of the block of the same name."""

from __future__ import annotations

import re
from dataclasses import dataclass

BEGIN = "<!-- weightgraft:generated"
END = "<!-- /weightgraft:generated"
HAND = "<!-- weightgraft:hand-written"
_BEGIN = re.compile(r'^<!-- weightgraft:generated block=(?P<name>\S+) rules=(?P<rules>\d+) '
                    r'command="(?P<command>[^"]*)" -->$')
_END = re.compile(r"^<!-- /weightgraft:generated block=(?P<name>\S+) -->$")
_HAND = re.compile(r'^<!-- weightgraft:hand-written source="(?P<source>[^"]+)" -->$')
_RULE_ROW = re.compile(r"^\s*\|[\s:|-]+\|\s*$")
# A cell holds a number that was measured where it has a decimal, a percentage or an interval;
# a verdict where it is one of the claims' or the report's verdict words.
_NUMBER = re.compile(r"\d\.\d|\d\s*%|\[\s*-?\d")
# References that are not measurements: a section, figure, table or appendix number, a version.
_REFERENCE = re.compile(r"\b(Sec|Secs|App|Fig|Figs|Table|Eq|C|v|Python|Py)\.?\s*[A-Z]?\d+(\.\d+)*[a-z]?"
                        r"|§\s*\d+(\.\d+)*")
_VERDICT = re.compile(r"^\**(holds|fails|undecided|no effect|exceeds|does not exceed|same model: (not )?equivalent)\b")


@dataclass(frozen=True)
class Generated:
    """One generated block of a page: its name, rules version, command and lines (1-based,
    the markers' own)."""

    name: str
    rules: int
    command: str
    begin: int
    end: int
    body: str


@dataclass(frozen=True)
class LooseTable:
    """A table of numbers or verdicts outside every generated block with no hand-written
    marker above it: its first line (1-based) and header."""

    line: int
    header: str


def begin_marker(name: str, rules: int, command: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._/-]+", name):
        raise ValueError(f"a block name is letters, digits and ._/- only: {name!r}")
    if '"' in command or "-->" in command:
        raise ValueError(f"a block's command holds no double quote and no '-->': {command!r}")
    return f'{BEGIN} block={name} rules={rules} command="{command}" -->'


def end_marker(name: str) -> str:
    return f"{END} block={name} -->"


def wrap(name: str, rules: int, command: str, text: str) -> str:
    """``text`` between the block's two markers (a blank line after the first and before the
    second, so that markdown reads the markers as comments and the text as its own)."""
    return f"{begin_marker(name, rules, command)}\n\n{text.strip(chr(10))}\n\n{end_marker(name)}\n"


def hand_written(source: str) -> str:
    """The line that marks the table below it as written by hand from ``source``."""
    return f'{HAND} source="{source}" -->'


def generated_blocks(text: str) -> list[Generated]:
    """Every generated block of a page, in order. A marker that does not parse, an end without
    its begin, a begin without its end and nested blocks are errors (ValueError, naming the line)."""
    out: list[Generated] = []
    lines = text.split("\n")
    open_: tuple[re.Match[str], int] | None = None
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith(BEGIN):
            m = _BEGIN.match(s)
            if m is None:
                raise ValueError(f"line {i}: a generated block's marker that does not parse: {s}")
            if open_ is not None:
                raise ValueError(f"line {i}: block {m['name']} begins inside block {open_[0]['name']}")
            open_ = (m, i)
        elif s.startswith(END):
            m = _END.match(s)
            if m is None or open_ is None or m["name"] != open_[0]["name"]:
                raise ValueError(f"line {i}: an end marker without its begin: {s}")
            b, start = open_
            out.append(Generated(b["name"], int(b["rules"]), b["command"], start, i,
                                 "\n".join(lines[start:i - 1])))
            open_ = None
    if open_ is not None:
        raise ValueError(f"line {open_[1]}: block {open_[0]['name']} has no end marker")
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _fences(lines: list[str]) -> set[int]:
    """The 0-based indices of lines inside ``` fences."""
    inside, out = False, set()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            inside = not inside
            out.add(i)
        elif inside:
            out.add(i)
    return out


def loose_tables(text: str) -> list[LooseTable]:
    """Tables of numbers or verdicts outside every generated block, with no hand-written marker
    between the table before them (or the page's start) and their header."""
    lines = text.split("\n")
    inside: set[int] = set()
    for b in generated_blocks(text):
        inside.update(range(b.begin - 1, b.end))
    fenced = _fences(lines)
    out: list[LooseTable] = []
    marked = False
    i = 0
    while i < len(lines):
        if i in fenced:
            i += 1
            continue
        if _HAND.match(lines[i].strip()):
            marked = True
        elif lines[i].strip().startswith(HAND):
            raise ValueError(f"line {i + 1}: a hand-written marker that does not parse (source=\"...\"): {lines[i]}")
        if lines[i].lstrip().startswith("|") and i + 1 < len(lines) and _RULE_ROW.match(lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            cells = [c for row in lines[i + 2:j] for c in _cells(row)]
            measured = any(_NUMBER.search(_REFERENCE.sub("", c)) or _VERDICT.match(c) for c in cells)
            if measured and i not in inside and not marked:
                out.append(LooseTable(i + 1, lines[i].strip()))
            marked = False
            i = j
            continue
        i += 1
    return out


def replace_block(page: str, block_text: str) -> str:
    """``page`` with its generated block of the same name as the (one) block in ``block_text``
    replaced by it. The page must hold that block already (a pointer block at least)."""
    new = generated_blocks(block_text)
    if len(new) != 1:
        raise ValueError(f"the text to splice holds {len(new)} generated blocks, not 1")
    name = new[0].name
    old = [b for b in generated_blocks(page) if b.name == name]
    if len(old) != 1:
        raise ValueError(f"the page holds {len(old)} blocks named {name} (1 needed: add its markers where it goes)")
    lines = page.split("\n")
    fresh = block_text.strip("\n").split("\n")
    start = next(i for i, line in enumerate(fresh) if line.strip().startswith(BEGIN))
    stop = next(i for i, line in enumerate(fresh) if line.strip().startswith(END))
    return "\n".join(lines[:old[0].begin - 1] + fresh[start:stop + 1] + lines[old[0].end:])
