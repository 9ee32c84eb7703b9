"""The claims section of a ``weightgraft paper`` report: the paper's claims as the claims stage
judged them (``claims.csv``'s rows, each p as localize prints it), the control finetune they were
tested against and, with several training seeds, each claim's verdicts across the seeds. Its own
module because it reads the claims stage's record, which no other section does."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from weightgraft.paper.figures import FINETUNES
from weightgraft.paper.page import Block, Table
from weightgraft.paper.seed_tables import DIFFERS, NOT_MET
from weightgraft.paper.settings import precondition, seeds_text
from weightgraft.paper.stages import ClaimsOutputs, ClaimsRecord, TrajectoryClaimsRecord

if TYPE_CHECKING:
    from weightgraft.paper.settings import PaperRun


def rules_of(record: ClaimsRecord | TrajectoryClaimsRecord | None) -> int | None:
    """The claims' rules version a claims record (or the claims-by-step record) was judged
    with: as recorded (``outputs.rules``), else read off its rows (8 recorded each row's
    interval level, ``ci_level``; a record without it is older, counted as 7); None without a record."""
    if record is None:
        return None
    outputs = record.outputs
    if outputs.rules is not None:
        return outputs.rules
    rows = outputs.claims if isinstance(outputs, ClaimsOutputs) else outputs.steps
    return 8 if any("ci_level" in row for row in rows) else 7


def _share(row: dict[str, Any]) -> str:
    """The share, its interval and the interval's own level (rules 8: 99% where skew widened
    it; a record written before the level was kept says "level not recorded")."""
    from weightgraft.localization.claims.verdicts import share_text

    return share_text(row.get("share_exact"), row.get("ci_low"), row.get("ci_high"), row.get("ci_level"))


def _p(row: dict[str, Any], column: str, floor: float | None) -> str:
    """A p as localize prints it: at its floor (the least p its test can reach), ``<= floor``."""
    from weightgraft.localization.claims.verdicts import p_text

    value = row.get(column)
    if value is None:
        return "n/a"
    return p_text(value, floor) if floor is not None else f"{value:.3g}"


def _floors(row: dict[str, Any]) -> tuple[float | None, float | None]:
    """The row's least reachable p: Holm-adjusted at its family's size, and unadjusted."""
    least, family = row.get("least_p"), row.get("family_size")
    if least is None:
        return None, None
    return (min(1.0, family * least) if family else None), least


def _claims_seed(run: PaperRun) -> int:
    """The training seed whose both-directions and control finetunes the claims used (the first
    seed judged)."""
    judged = run.claims.outputs.sft_seeds if run.claims is not None else None
    return judged[0] if judged else run.settings.train_seed


def _control_note(run: PaperRun) -> list[Block]:
    seed = _claims_seed(run)
    record = run.by_seed().get(seed, run.by_seed()[run.settings.train_seed]).finetunes.get("control")
    if record is None:
        return [("p", "No control finetune in this run: the fact claims are judged against their nulls only.")]
    s = run.settings
    ok, line = precondition(s, FINETUNES["control"], record)
    said = (f"at most {100 * s.control_top5:.0f}%, its precondition" if ok else
            f"above {100 * s.control_top5:.0f}%: flagged above, the control knows facts it was not taught")
    which = "" if s.seeds == 1 else (f" The claims use one control finetune (localize takes one), training seed "
                                     f"{seed}'s, for the a2b finetune of every seed.")
    return [("p", f"The control finetune was used (`models.control`): the a2b finetune's recipe (split a2b, preset "
                  f"{s.preset}, training seed {seed}, the same training templates) on the same world and seed "
                  "with each answer moved to another subject. Each fact claim of the a2b finetune "
                  f"({'`sft`' if s.seeds == 1 else 'each `sft[i]`'}) is tested "
                  "against the same region grafted from it, prompt by prompt (`control p`; its rows are the "
                  "`control` donor's, `null finetune`). Its own trained-direction top-5 on the world's true facts: "
                  f"{line.partition(': ')[2]} ({said}).{which}")]


def _donor(model: str, sft_seeds: Sequence[int] | None) -> str:
    """``sft[1] (training seed 1)`` where the claims ran on several seeds' a2b finetunes."""
    found = re.fullmatch(r"sft\[(\d+)\]", model)
    if sft_seeds is None or found is None or int(found.group(1)) >= len(sft_seeds):
        return model
    return f"{model} (training seed {sft_seeds[int(found.group(1))]})"


def claims_across_seeds(run: PaperRun) -> list[Block]:
    """With several training seeds, each claim of the a2b finetune (``sft[i]``, one per seed
    judged) with its verdicts across the seeds (``holds on 3 of 3 seeds``), and the seeds not
    judged (their a2b finetune misses its precondition); nothing for one seed."""
    if run.claims is None or run.settings.seeds == 1:
        return []
    from weightgraft.paper.claims import judged_seeds

    judged = run.claims.outputs.sft_seeds or []
    if not judged:
        return []
    _, missed = judged_seeds(run.settings, run)
    groups: dict[tuple[str, str, str, str], dict[int, dict[str, Any]]] = {}
    for r in run.claims.outputs.claims:
        found = re.fullmatch(r"sft\[(\d+)\]", str(r.get("model")))
        if found is None or int(found.group(1)) >= len(judged):
            continue
        key = (str(r.get("claim")), str(r.get("statement", "")), str(r.get("setting")), str(r.get("template")))
        groups.setdefault(key, {})[judged[int(found.group(1))]] = r
    rows = []
    for key, by_seed in groups.items():
        verdicts: dict[str, list[int]] = {}
        for seed, r in by_seed.items():
            verdicts.setdefault(str(r.get("verdict")), []).append(seed)
        parts = [f"{v} on {len(on)} of {len(judged)} seed{'s' if len(judged) > 1 else ''}"
                 + (f" ({seeds_text(on)})" if len(on) < len(judged) else "")
                 for v, on in verdicts.items()]
        differs = f"; {DIFFERS}" if len(verdicts) > 1 else ""
        exploratory = [seed for seed, r in by_seed.items() if r.get("evidence") == "exploratory"]
        evidence = ("exploratory on every seed" if len(exploratory) == len(by_seed) else
                    f"exploratory on {seeds_text(exploratory)}" if exploratory else "judged")
        rows.append((*key, "; ".join(parts) + differs, evidence))
    blocks: list[Block] = [("h3", "Each claim across training seeds"),
                           ("p", f"The a2b finetune of each of {seeds_text(judged)} is one donor of the claims' "
                                 "`models.sft` (`sft[i]`), each judged on its own; the both-directions setting "
                                 f"(`both->a2b`) and the control are training seed {_claims_seed(run)}'s only. "
                                 "Holm's adjustment runs over every row of the run, every seed's included."
                                 + ("" if not missed else
                                    f" Not judged on {seeds_text(list(missed))}: {NOT_MET} ("
                                    + "; ".join(f"training seed {seed}: {line}" for seed, line in missed.items())
                                    + ")."))]
    blocks.append(Table(("claim", "statement", "setting", "template", "verdicts across seeds", "evidence"), rows))
    return blocks


def claims_blocks(run: PaperRun) -> list[Block]:
    """The paper's claims as judged by the claims stage (``claims.csv``'s rows), or why not."""
    blocks: list[Block] = [("h2", "The paper's claims, judged")]
    if not run.settings.claims:
        return blocks + [("p", "Not run: --no-claims.")]
    if "claims" in run.skipped:
        return blocks + [("p", f"Not judged: {NOT_MET} ({run.skipped['claims']}).")]
    if run.claims is None:
        return blocks + [("p", "Not judged: no a2b finetune in this run.")]
    blocks.append(("p", "Each claim's region grafted whole, exactly, in every prompt (`weightgraft localize`'s "
                        "claims; docs/localize.md): its share of the fact-specific effect (`fact_logprob`: the answer's "
                        "log-probability minus the mean over the world's other answers; the plain first-token effect "
                        "beside it) with a per-row interval at the level printed beside it (95%: Fieller's bounds at "
                        "99.99999%, the width that keeps 95% on every design of docs/statistics.md, declined where the "
                        "whole effect is not told from 0 at that level). A row's p is the largest of its parts: the "
                        "threshold test, a paired test against a null region of its kind and, for fact claims, against "
                        "the same region grafted from the control finetune; Holm-adjusted once over the run. A p at the "
                        "least its test can reach prints as `<= floor`. Holds: Holm p <= 0.05; fails: interval on the "
                        "other side of the threshold; undecided otherwise (the reason names the largest part). Rows of "
                        "claims 4-5 on PRE -> SFT are outside the paper's setting (the paper made them for both "
                        "directions -> a2b on reversed prompts, the rows `both->a2b`)."))
    blocks += _control_note(run)
    blocks += claims_across_seeds(run)
    sft_seeds = run.claims.outputs.sft_seeds
    rows = []
    for r in run.claims.outputs.claims:
        holm_floor, floor = _floors(r)
        rows.append((str(r.get("claim")), str(r.get("statement", "")), _donor(str(r.get("model")), sft_seeds),
                     str(r.get("setting")),
                     "yes" if r.get("in_paper_setting") else "no", str(r.get("template")),
                     f"{r['n_prompts']:.0f}" if r.get("n_prompts") is not None else "",
                     f"{r.get('side', '')} {r['threshold']:g}" if r.get("threshold") is not None else "",
                     _share(r), _p(r, "p_holm", holm_floor),
                     _p(r, "control_p", floor) if r.get("control_p") is not None else "",
                     str(r.get("verdict")) + (" (exploratory)" if r.get("evidence") == "exploratory" else ""),
                     str(r.get("reason") or "")))
    if sft_seeds:
        blocks.append(("h3", "Every row"))
    blocks.append(Table(("claim", "statement", "donor", "setting", "paper's setting", "template", "prompts",
                         "threshold", "share [interval] (its level)", "p (Holm)", "control p", "verdict", "why"), rows))
    return blocks
