"""Put a report's generated block into a docs page, in place of the block of the same name.

    python docs/splice.py RUN/paper.md --assets docs/paper-smollm2     # a `weightgraft paper` report
    python docs/splice.py RUN/report/claims.md                          # a localize run's claims

The report must be one generated block (``weightgraft.report.blocks``: written by today's report
writers; a report written by older code has none: write it again with the command it was run
with, which reuses every finished stage). The page (``--page``; default docs/paper.md for a
``paper-*`` block, docs/localize.md for a ``localize-*`` one) must hold a block of that name already,
a pointer block at least. Headings are shifted to sit under the page's heading above the block;
the images and linked reports the block names by a relative path are copied into ``--assets``
(a folder under docs/) and their links rewritten to it."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "src"))

from weightgraft.report.blocks import BEGIN, END, generated_blocks, replace_block  # noqa: E402

_LINK = re.compile(r"(!?\[[^\]]*\])\((?!https?:|#|/)([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6}) ")


def _level_above(page: str, line: int) -> int:
    """The level of the last heading of ``page`` above line ``line`` (1-based), 0 for none."""
    level = 0
    for text in page.split("\n")[: line - 1]:
        m = _HEADING.match(text)
        if m:
            level = len(m.group(1))
    return level


def _shift(body: str, by: int) -> str:
    if by <= 0:
        return body
    return "\n".join(("#" * by + line) if _HEADING.match(line) and len(_HEADING.match(line).group(1)) + by <= 6
                     else line for line in body.split("\n"))


def _copy_linked(body: str, source: Path, assets: Path | None, page_dir: Path) -> str:
    """Copy each relative link's target (a PNG, a linked report and the PNGs beside it) into
    ``assets`` and point the link there."""

    def move(m: re.Match[str]) -> str:
        target = source / m.group(2)
        if not target.is_file():
            return m.group(0)
        if assets is None:
            raise SystemExit(f"the block links {m.group(2)}: pass --assets FOLDER (under docs/) to copy it into")
        dest = assets / m.group(2)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, dest)
        if target.suffix == ".md":  # a linked report: its own images beside it
            for png in target.parent.glob("*.png"):
                shutil.copyfile(png, dest.parent / png.name)
        return f"{m.group(1)}({dest.relative_to(page_dir).as_posix()})"

    return _LINK.sub(move, body)


def splice(report: Path, page: Path | None = None, assets: Path | None = None) -> Path:
    text = report.read_text()
    blocks = generated_blocks(text)
    if len(blocks) != 1:
        raise SystemExit(f"{report}: {len(blocks)} generated blocks, not 1 (a report written before the markers? "
                         "write it again with today's code: its command reuses every finished stage)")
    block = blocks[0]
    if page is None:
        page = DOCS / ("paper.md" if block.name.startswith("paper-") else "localize.md")
    old = page.read_text()
    mine = [b for b in generated_blocks(old) if b.name == block.name]
    if len(mine) != 1:
        raise SystemExit(f"{page}: no block named {block.name} (add its two markers where it goes)")
    first = next((len(m.group(1)) for line in block.body.split("\n") if (m := _HEADING.match(line))), None)
    above = _level_above(old, mine[0].begin)
    body = _shift(block.body, above + 1 - first if first else 0)
    body = _copy_linked(body, report.parent, assets.resolve() if assets else None, page.resolve().parent)
    lines = text.split("\n")
    begin = next(line for line in lines if line.strip().startswith(BEGIN))
    end = next(line for line in lines if line.strip().startswith(END))
    page.write_text(replace_block(old, f"{begin}\n{body}\n{end}\n"))
    print(f"{page}: block {block.name} (claims rules {block.rules}) replaced from {report}")
    return page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path)
    parser.add_argument("--page", type=Path, default=None)
    parser.add_argument("--assets", type=Path, default=None)
    args = parser.parse_args()
    splice(args.report, args.page, args.assets)


if __name__ == "__main__":
    main()
