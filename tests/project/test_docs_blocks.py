"""Pages that cannot go stale silently: every table of numbers or verdicts under docs/ is either a
generated block (``weightgraft.report.blocks``) made with today's claims rules, or says above it
that it is written by hand and from what. A block made with older rules fails, named with the
command that makes it again; so does a table in neither form. The checks are shown to fail on a
planted stale block and a planted loose table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from weightgraft.localization.claims import RULES_VERSION
from weightgraft.report.blocks import generated_blocks, hand_written, loose_tables, replace_block, wrap

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md"))


def stale_blocks(page: str, text: str) -> list[str]:
    """One line per block of ``text`` made with older claims rules than the code's."""
    return [f"{page}: block {b.name} (lines {b.begin}-{b.end}) was made with claims rules {b.rules}, the code's are "
            f"{RULES_VERSION}: regenerate it with `{b.command}`, then `python docs/splice.py REPORT`"
            for b in generated_blocks(text) if b.rules < RULES_VERSION]


def unmarked_tables(page: str, text: str) -> list[str]:
    return [f"{page}:{t.line}: a table of numbers or verdicts outside every generated block and with no "
            f"`<!-- weightgraft:hand-written source=\"...\" -->` above it: {t.header[:80]}" for t in loose_tables(text)]


def test_no_page_holds_a_block_made_by_older_rules():
    stale = [line for p in PAGES for line in stale_blocks(str(p.relative_to(ROOT)), p.read_text())]
    assert not stale, "\n".join(stale)


def test_no_block_is_newer_than_the_code():
    newer = [(str(p.relative_to(ROOT)), b.name, b.rules) for p in PAGES for b in generated_blocks(p.read_text())
             if b.rules > RULES_VERSION]
    assert not newer, newer


def test_every_table_of_numbers_is_generated_or_says_it_is_written_by_hand():
    loose = [line for p in PAGES for line in unmarked_tables(str(p.relative_to(ROOT)), p.read_text())]
    assert not loose, "\n".join(loose)


def test_a_planted_block_of_older_rules_fails_naming_the_block_and_its_command():
    page = (ROOT / "docs" / "paper.md").read_text()
    planted = page + "\n" + wrap("paper-planted", RULES_VERSION - 1, "weightgraft paper --model planted --out runs/p",
                                 "| scheme | top-5 |\n|---|---|\n| LT | 17.5% [7.3, 32.8] |")
    (line,) = stale_blocks("docs/paper.md", planted)
    assert "block paper-planted" in line and f"claims rules {RULES_VERSION - 1}" in line
    assert "`weightgraft paper --model planted --out runs/p`" in line
    assert not stale_blocks("docs/paper.md", page)


def test_a_planted_table_without_a_marker_is_named_and_a_marked_one_is_not():
    table = "| scheme | top-5 |\n|---|---|\n| LT | 17.5% [7.3, 32.8] |\n"
    (line,) = unmarked_tables("docs/x.md", "Some prose.\n\n" + table)
    assert line.startswith("docs/x.md:3:") and "| scheme | top-5 |" in line
    assert not unmarked_tables("docs/x.md", hand_written("weightgraft run configs/x.yaml") + "\n\n" + table)
    verdicts = "| claim | verdict |\n|---|---|\n| fe_lt | holds |\n"
    assert unmarked_tables("docs/x.md", verdicts)
    words = "| template | text |\n|---|---|\n| `paper_qa` | Q: Who stars in a movie with {first_actor}? |\n"
    assert not unmarked_tables("docs/x.md", words)  # no number, no verdict: nothing to mark


def test_broken_markers_are_errors():
    begin = wrap("a", RULES_VERSION, "weightgraft paper --model m", "x").split("\n")[0]
    with pytest.raises(ValueError, match="no end marker"):
        generated_blocks(begin + "\nx\n")
    with pytest.raises(ValueError, match="does not parse"):
        generated_blocks("<!-- weightgraft:generated block=a -->\n")
    with pytest.raises(ValueError, match="command holds no double quote"):
        wrap("a", 8, 'say "x"', "")


def test_splice_puts_a_report_in_place_of_its_pointer(tmp_path):
    spec = importlib.util.spec_from_file_location("docs_splice", ROOT / "docs" / "splice.py")
    splice = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(splice)
    page = tmp_path / "paper.md"
    page.write_text("# Page\n\n### SmolLM2-135M\n\n" + wrap("paper-m", RULES_VERSION, "weightgraft paper --model m",
                                                             "pointer") + "\n## After\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "paper-fig2.png").write_bytes(b"png")
    report = run / "paper.md"
    report.write_text(wrap("paper-m", RULES_VERSION, "weightgraft paper --model m --out run",
                           "# The paper's numbers beside ours: m\n\n![Fig. 2](paper-fig2.png)\n\n## Stage times\n"))
    splice.splice(report, page, tmp_path / "assets")
    text = page.read_text()
    (block,) = generated_blocks(text)
    assert block.command == "weightgraft paper --model m --out run" and "pointer" not in text
    assert "#### The paper's numbers beside ours: m" in text and "##### Stage times" in text
    assert "![Fig. 2](assets/paper-fig2.png)" in text
    assert (tmp_path / "assets" / "paper-fig2.png").read_bytes() == b"png"
    assert text.rstrip().endswith("## After")
    with pytest.raises(ValueError, match="holds 0 blocks named other"):
        replace_block(text, wrap("other", RULES_VERSION, "c", "x"))
