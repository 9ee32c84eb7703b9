"""The claims stage of ``weightgraft paper``: the paper's statements as exact region grafts judged
against their nulls (``weightgraft localize``'s claims), on the pipeline's own models.

Claims 1-3 (FE+LT, enrichment, recall) in their setting, PRE -> the a2b finetune on both paper
templates; claims 4-5 (O + late FFN, q/k/v marginal) in theirs (Fig. 4): the both-directions
finetune grafted into the a2b finetune on the reversed headline prompts, judged only where the
donor knows the reversed facts. Each fact claim of the a2b finetune must also beat the same
region grafted from the control finetune (``models.control``: the a2b recipe on the same texts
with the answers shuffled among the subjects). With several training seeds the claims 1-3 are
judged on each seed's a2b finetune (``models.sft`` as a list: rows ``sft[0]``, ``sft[1]``, ...).
Every row, verdict and reason is ``claims.csv``'s."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console

from weightgraft.localization.claims.regions import RULES_VERSION
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.run import run_localize
from weightgraft.paper.figures import FINETUNES, HEADLINE, QA
from weightgraft.paper.settings import PaperRun, PaperSettings, precondition
from weightgraft.paper.stages import ClaimsOutputs, DataRecord, FinetuneRecord, Stage, stage_path
from weightgraft.planning.localize import partial_grafts_refused
from weightgraft.resume.manifests import Json

CLAIM_FINETUNES = ("a2b", "both", "control")
NULL_DRAWS = 20
MIN_PROMPTS = 20  # localize's floor for a judged (not exploratory) row

# What the report keeps of each claims.csv row.
CLAIM_COLUMNS = ("model", "setting", "template", "claim", "statement", "n_prompts", "evidence", "share_exact",
                 "ci_low", "ci_high", "ci_level", "share_plain", "threshold", "side", "null_kind", "p", "p_parts", "p_holm",
                 "family_size", "least_p", "control_p", "control_region_effect", "n_control_prompts", "control_note",
                 "verdict", "reason", "in_paper_setting", "donor_top5")


_partial_refused = functools.lru_cache(maxsize=8)(partial_grafts_refused)  # read once per spec, not per stage


def claims_config(settings: PaperSettings, models: Mapping[str, str | list[str]], data: str) -> dict[str, Any]:
    """The raw localize config of the claims (``models``: ``pre``, ``a2b`` and, where run,
    ``both`` and ``control`` -> spec; ``a2b`` a list where the claims are judged on several
    training seeds' a2b finetunes, ``models.sft``, whose first is the reversal's recipient),
    without ``out``. Fewer than 20 prompts a template (a small ``--relations``): the rows run and
    say ``exploratory``. A model whose partial grafts are refused (a mixture of experts) runs them
    with ``estimates: false``: the claims are whole grafts and need no gradient estimate."""
    a2b = models["a2b"]
    roles = {"pre": models["pre"], "sft": a2b, **({"control": models["control"]} if "control" in models else {})}
    raw: dict[str, Any] = {
        "name": "paper-claims", "data": data, "models": roles,
        "templates": [HEADLINE, QA], "directions": ["a2b"], "metric": "first_logprob",
        "graft_directions": ["sufficiency"], "exact": "none", "search": {"enabled": False},
        "claims": {"null_draws": NULL_DRAWS, "min_prompts": min(MIN_PROMPTS, settings.relations)},
        "device": settings.device, "seed": settings.seed, "report": False,
    }
    if _partial_refused(str(models["pre"])):  # an MoE: no partial grafts, and the claims read no estimate
        raw["estimates"] = False  # (only share_estimate, which the report does not keep); dense keys unchanged
    if "both" in models:  # its b2a prompts are chosen by the setting, not by ``directions``
        raw["reversal"] = {"donor": models["both"], "recipient": a2b if isinstance(a2b, str) else a2b[0],
                           "template": HEADLINE, "direction": "b2a"}
    return raw


def claims_stage(settings: PaperSettings, data: DataRecord, finetunes: Mapping[str, FinetuneRecord],
                 a2b: Sequence[FinetuneRecord] | None = None) -> tuple[Stage[ClaimsOutputs], dict[str, Any]]:
    """The claims' stage (keyed by its config with each finetune named by its stage key) and its
    raw localize config to run. ``finetunes``: the records of one training seed (its a2b, both
    and control); ``a2b``: the a2b records of every seed judged (``models.sft`` as a list), or
    None for one seed (``models.sft`` its one spec, as a run of one seed has it)."""
    names = [n for n in CLAIM_FINETUNES if n in finetunes]
    keyed: dict[str, str | list[str]] = {"pre": settings.model,
                                         **{n: f"finetune:{finetunes[n].key}" for n in names}}
    paths: dict[str, str | list[str]] = {"pre": settings.model,
                                         **{n: str(stage_path(finetunes[n], settings.out, "model")) for n in names}}
    if a2b is not None:
        keyed["a2b"] = [f"finetune:{r.key}" for r in a2b]
        paths["a2b"] = [str(stage_path(r, settings.out, "model")) for r in a2b]
    inputs: dict[str, Any] = {"config": claims_config(settings, keyed, f"data:{data.key}")}
    if RULES_VERSION != 8:  # the rules are part of the key from 9 on (8's keys, the runs made with it, unchanged)
        inputs["rules"] = RULES_VERSION
    stage = Stage("claims", "claims", inputs, settings.out, ClaimsOutputs)
    return stage, claims_config(settings, paths, str(stage_path(data, settings.out, "dir")))


def _value(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


def claim_rows(table: Any) -> list[Json]:
    """``claims.csv``'s rows as the report reads them (NaN -> None)."""
    keep = [c for c in CLAIM_COLUMNS if c in table.columns]
    return [{c: _value(row[c]) for c in keep} for _, row in table.iterrows()]


def judged_seeds(settings: PaperSettings, run: PaperRun) -> tuple[list[int], dict[int, str]]:
    """The training seeds whose a2b finetune meets its precondition (the claims are judged on
    them), and the others' precondition lines, by seed."""
    met, missed = [], {}
    for seed, records in run.by_seed().items():
        if "a2b" in records.finetunes:
            ok, line = precondition(settings, FINETUNES["a2b"], records.finetunes["a2b"])
            if ok:
                met.append(seed)
            else:
                missed[seed] = line
    return met, missed


def run_claims(settings: PaperSettings, run: PaperRun, console: Console) -> None:
    """Judge the paper's claims on the run's models (``weightgraft.localization.run_localize``,
    which resumes from its saved parts): with several training seeds, on each seed's a2b
    finetune that meets its precondition (``models.sft`` as a list; the reversal setting and the
    control are the first such seed's). Not run, and said so in ``run.skipped["claims"]``, where
    no a2b finetune meets its precondition (no fact to localize); a both-directions donor that
    misses its own is judged by localize itself (its rows say ``precondition not met``)."""
    import pandas as pd

    if "a2b" not in run.finetunes:
        return
    met, missed = judged_seeds(settings, run)
    if not met:
        run.skipped["claims"] = "; ".join(line if settings.seeds == 1 else f"training seed {seed}: {line}"
                                          for seed, line in missed.items())
        console.print(f"[yellow]claims not judged: precondition not met ({run.skipped['claims']})[/]")
        return
    seeds = run.by_seed()
    several = settings.seeds > 1
    stage, raw = claims_stage(settings, run.data, seeds[met[0]].finetunes,
                              [seeds[s].finetunes["a2b"] for s in met] if several else None)
    done = stage.finished()
    if done is not None:
        run.claims = done
        run.reused.append("claims")
        return
    started = time.time()
    console.rule("claims: the paper's statements as exact region grafts against their nulls"
                 + (f", on training seeds {', '.join(map(str, met))}" if several else ""))
    result = run_localize(parse_localize_config({**raw, "out": str(stage.folder / "run")}), progress=settings.progress)
    table = pd.read_csv(result.run_dir / "claims.csv")
    outputs = ClaimsOutputs(run="run", claims=claim_rows(table), rules=RULES_VERSION)
    if several:
        outputs.sft_seeds = met  # models.sft[i] is the a2b finetune of training seed sft_seeds[i]
    run.claims = stage.finish(outputs, time.time() - started)
