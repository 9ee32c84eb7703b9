"""The claims of a ``weightgraft localize`` run as markdown (``report/claims.md``): one generated
block (``report.blocks``) holding ``claims.csv``'s rows as the docs show them, with the claims'
rules version the rows were judged with and the command that makes them again, so that
docs/localize.md takes it with ``python docs/splice.py RUN/report/claims.md``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.localization.claims.verdicts import p_text, share_text
from weightgraft.report.blocks import wrap

HEADER = ("donor", "setting", "template", "claim", "prompts", "test", "fact share [interval] (its level)",
          "plain share", "parts of p: threshold / null / control", "Holm p", "control p", "verdict", "why")


def rules_of_table(table: pd.DataFrame) -> int:
    """The claims' rules version of a ``claims.csv``: its ``rules`` column where it has one, else
    read off its columns (8 recorded each row's interval level, ``ci_level``; older, counted as 7)."""
    if "rules" in table and table["rules"].notna().any():
        return int(table["rules"].dropna().min())
    return 8 if "ci_level" in table else 7


def claims_markdown(run_dir: Path, name: str, command: str | None = None) -> str | None:
    """``claims.csv``'s rows as one generated block named ``localize-NAME`` (None: the run
    judged no claims). ``command`` defaults to ``weightgraft localize`` on the config of that
    name."""
    path = Path(run_dir) / "claims.csv"
    if not path.is_file():
        return None
    table = pd.read_csv(path, keep_default_na=False, na_values=[""])
    if table.empty or "null_kind" not in table:
        return None
    family = int(table["family_size"].max()) if "family_size" in table else 0

    def f(v: Any) -> str:
        return "-" if v is None or pd.isna(v) else f"{float(v):.2f}"

    def text(v: object) -> str:
        return "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)

    rows = []
    for _, r in table.iterrows():
        least = r.get("least_p")
        floor = None if least is None or pd.isna(least) else float(least)
        holm_floor = None if floor is None else min(1.0, family * floor)
        holm, control, share = r.get("p_holm"), r.get("control_p"), (r["share_exact"], r["ci_low"], r["ci_high"])
        holm_text = "-" if holm is None or pd.isna(holm) else (p_text(holm, holm_floor) if holm_floor else
                                                              f"{holm:.3g}")
        control_text = "" if control is None or pd.isna(control) else (p_text(control, floor) if floor else
                                                                         f"{control:.3g}")
        rows.append((text(r.get("model", "sft")), text(r.get("setting")), text(r.get("template")), text(r["claim"]),
                     text(int(r["n_prompts"])) if pd.notna(r.get("n_prompts")) else "",
                     "-" if pd.isna(r.get("threshold")) else f"{r['side']} {r['threshold']:g}",
                     share_text(*share, r.get("ci_level")), f(r.get("share_plain")), text(r.get("p_parts")) or "-",
                     holm_text, control_text, text(r["verdict"]), text(r.get("reason"))))
    lines = _table(HEADER, rows) + _steps(Path(run_dir))
    command = command or f"weightgraft localize CONFIG (the config named {name})"
    return wrap(f"localize-{name}", rules_of_table(table), command, "\n".join(lines))


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows])


def _steps(run_dir: Path) -> list[str]:
    """``claims_steps.csv`` (the SFT models are snapshots of one finetune): each claim's first
    held step and its verdict by step, below the rows."""
    from weightgraft.localization.claims.steps import first_held_text, verdicts_text

    path = run_dir / "claims_steps.csv"
    if not path.is_file():
        return []
    table = pd.read_csv(path, keep_default_na=False, na_values=[""])
    rows = [(str(r["setting"]), str(r["direction"]), str(r["template"]), str(r["claim"]), first_held_text(r),
             verdicts_text(r)) for _, r in table.iterrows()]
    return ["", "Along the training steps (the SFT models are snapshots of one finetune; a claim's first held step "
                "is the earliest saved step from which it holds at every later one):", "",
            *_table(("setting", "direction", "template", "claim", "first held [share, interval (its level)]",
                     "verdict by step"), rows)]


def write_claims_markdown(run_dir: Path, out: Path, name: str) -> Path | None:
    """``out/claims.md`` (see ``claims_markdown``); None where the run judged no claims."""
    from weightgraft import atomic

    block = claims_markdown(run_dir, name)
    if block is None:
        return None
    path = Path(out) / "claims.md"
    atomic.write_text(path, block)
    return path
