"""``weightgraft check``: the engine against the per-token definition, on your models."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def _dtype(name: str):
    import torch

    table = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}
    if name not in table:
        raise typer.BadParameter(f"dtype must be one of {', '.join(table)}")
    return table[name]


def check(
    base: str = typer.Argument(..., help="Base model: directory, .gguf file or embedded name."),
    donor: list[str] = typer.Argument(..., help="One or more donor models (same architecture)."),
    prompts: Path | None = typer.Option(None, help="Text file, one prompt per line."),
    maps: int = typer.Option(2, help="Random source maps of each kind to check."),
    seed: int = typer.Option(0),
    atol: Optional[float] = typer.Option(None, help="Absolute tolerance on logits (default: per dtype, see weightgraft.engine.check.ORACLE_TOLERANCE)."),
    rtol: Optional[float] = typer.Option(None, help="Tolerance relative to the largest |logit| (default: per dtype)."),
    dtype: str = typer.Option(
        "float64",
        help="float64 (default: rounding is then ~1e-13, so any real difference stands out) | "
        "float32 | bfloat16 | float16 (the engine as you run it; tolerances per dtype)",
    ),
    device: str = typer.Option("cpu"),
    allow_pickle: bool = typer.Option(False, help="Allow pickle (.bin) checkpoints."),
) -> None:
    """Check the fast engine against the per-token KV-cache definition on YOUR models."""
    from weightgraft.engine.architectures import text_config
    from weightgraft.engine.check import DEFAULT_PROMPTS, check_engine
    from weightgraft.engine.projections import hf_config
    from weightgraft.models.donors import LoadSettings, load_role
    from weightgraft.models.random_models import random_token_batch
    from weightgraft.models.spec import parse_spec
    from weightgraft.models.tokenization import batch_encode, check_same_tokenizer

    specs = [parse_spec(s) for s in [base, *donor]]
    randoms = [not s.has_tokenizer for s in specs]
    if any(randoms) and (not all(randoms) or prompts is not None):
        raise typer.BadParameter("random: models have no tokenizer: check them only against each other, "
                                 "on random token ids (without --prompts)")
    settings = LoadSettings(device=device, dtype=_dtype(dtype), allow_pickle=allow_pickle)
    loaded = [load_role(spec, settings) for spec in specs]
    for other in loaded[1:]:
        if not all(randoms):
            check_same_tokenizer(loaded[0].tokenizer, other.tokenizer, other.source)
    if prompts is not None:
        texts = [t for t in prompts.read_text(encoding="utf-8").splitlines() if t.strip()]
        if not texts:
            raise typer.BadParameter(f"{prompts} holds no prompt")
    else:
        texts = list(DEFAULT_PROMPTS)
    if all(randoms):  # token ids of the default prompts' lengths, drawn with the seed
        input_ids, mask = random_token_batch(text_config(hf_config(loaded[0].model)).vocab_size, len(texts), seed, device)
    else:
        tokenizer = next(m.tokenizer for m in loaded if m.tokenizer is not None)  # not all random: one has one
        input_ids, mask = batch_encode(tokenizer, texts, device=device)
    with console.status("running the per-token reference and the engine..."):
        report = check_engine(
            [lm.model for lm in loaded], input_ids, mask,
            n_random=maps, seed=seed, atol=atol, rtol=rtol,
        )
    table = Table(title=f"engine vs per-token definition ({len(texts)} prompts)")
    for col in ("source map", "max |Δ logit|", "max |logit|", "top-1 agree", "result"):
        table.add_column(col)
    for case in report.cases:
        ok = report.passed_case(case)
        table.add_row(
            case.name, f"{case.max_abs_diff:.2e}", f"{case.logit_scale:.1f}",
            f"{case.top1_agree:.0%}", "[green]pass[/]" if ok else "[red]FAIL[/]",
        )
    console.print(table)
    for case in report.cases:
        if case.engine_vs_plain is not None:
            console.print(
                f"{case.name}, against its plain forward pass: engine max |Δ logit| "
                f"{case.engine_vs_plain:.2e}, per-token reference {case.reference_vs_plain:.2e}"
            )
    if any(
        c.engine_vs_plain is not None and c.reference_vs_plain > c.engine_vs_plain
        and not report.passed_case(c) for c in report.cases
    ):
        console.print(
            "where the engine is closer to the plain forward pass than the per-token reference "
            "is, the gap is the reference's own rounding (its position-by-position pass rounds "
            "differently in this dtype); compare in float32 to test the engine itself"
        )
    if dtype == "float64":
        console.print(
            "float64 throughout: HF's float32 casts (norms, rotary, eager softmax) run in float64 "
            "here, so differences are float64 rounding"
        )
    if report.routing_flips is not None:
        differing, decisions = report.routing_flips
        console.print(f"routing: {differing} of {decisions} top-k decisions (positions x routers, every map) pick "
                      "other experts than a float32 pass of the same maps: half-precision rounding, whose logits "
                      "move there by more than the tolerance says")
    verdict = "PASS" if report.passed else "FAIL"
    console.print(f"{verdict}: max |Δ logit| = {report.max_abs_diff:.3e} (atol {report.atol}, rtol {report.rtol})")
    raise typer.Exit(0 if report.passed else 1)


