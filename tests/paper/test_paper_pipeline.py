"""``weightgraft paper`` end to end on a tiny random Llama with a byte-level tokenizer: every stage
runs (the control finetune on the shuffled answers included) and the report holds the paper's
rows for every figure it ran, its verdicts and its charts; a run stopped inside a sweep resumes
and gives the same report; a changed world seed gets folders of its own; a precondition not met
marks the figures that need it; bad input is one line before any training; --plan runs
nothing."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import pytest
from tiny_world import save_paper_base

from weightgraft.paper.figures import DEFAULT_SWEEPS, FINETUNES, MAIN_WORLD, sweeps_for
from weightgraft.paper.numbers import NOT_RUN, OTHER_MODEL, metric_text, paper_numbers
from weightgraft.paper.pipeline import PaperSettings, data_stage, finetune_stage, needed_finetunes, run_paper
from weightgraft.paper.report import NOT_MET, STATED_HEADING, side_by_side_part
from weightgraft.paper.stages import DataOutputs, DataRecord

ALL_MET = dict(trained_top5=0.0, both_b2a_top5=0.0)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    """A tiny tied 4-layer Llama and a byte-level BPE tokenizer trained on a small paper world."""
    return save_paper_base(tmp_path_factory.mktemp("paper_base"))


def settings(base: Path, out: Path, **extra) -> PaperSettings:
    return PaperSettings(model=str(base), relations=8, out=out, max_steps=2, batch_size=8, progress=False,
                         **{**ALL_MET, **extra})


SLOW_FIXTURES = ("full_run",)  # its tests are `slow` (tests/conftest.py): the paper pipeline, finetunes and all


@pytest.fixture(scope="module")
def full_run(base_model, tmp_path_factory):
    from rich.console import Console

    out = tmp_path_factory.mktemp("paper_full")
    console = Console(record=True, width=240, file=open(os.devnull, "w"))  # noqa: SIM115 - the fixture's lifetime
    run = run_paper(settings(base_model, out), console)
    (out / "console.txt").write_text(console.export_text())
    return run, out


def test_the_report_is_one_generated_block_with_the_rules_and_its_command(full_run):
    from weightgraft.localization.claims import RULES_VERSION
    from weightgraft.paper.report import PAPER_TITLE, block_name, paper_command
    from weightgraft.report.blocks import generated_blocks

    run, out = full_run
    text = (out / "paper.md").read_text()
    (block,) = generated_blocks(text)
    assert (block.name, block.rules, block.command) == (block_name(run.settings), RULES_VERSION,
                                                        paper_command(run.settings))
    assert PAPER_TITLE in text and "Nief et al., \"Multiple Streams" not in text
    assert run.claims.outputs.rules == RULES_VERSION


def _stage_dirs(out: Path, kind: str) -> list[Path]:
    return sorted(p for p in (out / f"{kind}s").iterdir() if p.is_dir())


def test_each_precondition_is_printed_as_it_is_checked(full_run):
    _, out = full_run
    text = (out / "console.txt").read_text()
    for name in ("a2b", "both", "task", "relation", "control"):
        line = next(x for x in text.splitlines() if x.startswith(f"{name}: ") and "precondition" in x)
        assert "top-5" in line and line.endswith(("precondition met", "precondition NOT met")), line


def test_every_stage_runs_and_the_report_has_a_paper_row_for_every_figure_it_ran(full_run):
    run, out = full_run
    assert set(run.finetunes) == {"a2b", "both", "task", "relation", "control"}
    assert set(run.sweeps) == set(DEFAULT_SWEEPS) and not run.skipped  # Fig. 13's only where asked (test_paper_appendix)
    for kind in ("data", "finetune", "sweep"):
        for folder in _stage_dirs(out, kind):
            record = json.loads((folder / "stage.json").read_text())
            assert folder.name.endswith(record["key"][:12])
    text = (out / "paper.md").read_text()
    assert (out / "paper.html").read_text().startswith("<!doctype html>")
    ran = {fid for s in sweeps_for(MAIN_WORLD) if s.name in DEFAULT_SWEEPS for fid in s.figure_ids}
    assert ran == {"fig2", "fig3a", "fig6", "fig7", "fig8", "fig9", "fig14", "fig4", "fig15", "fig5"}
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for n in paper_numbers():
        if n.figure_id in ran:
            model = f"{n.paper_text()} ({n.model})" if n.stated else ("all panels" if n.model == "all" else n.model)
            row = [r for r in rows if f"| {n.scheme} | {metric_text(n.metric)} | " in r and model in r
                   and n.figure in r.split(" | ")[0]]
            assert row, n.id
            assert not any(f"| {NOT_RUN} |" in r for r in row), n.id
    assert ("| Sec. 4.1; Fig. 2 | not stated; headline | LT | top-5 accuracy (% of prompts) | 53% (gemma-1.1-2b-it); "
            "shown, not stated (gpt2-xl, Llama-3.2-1B, pythia-2.8b) |") in text
    not_run = text.split("## Figures not run")[1].split("## ")[0]
    for fid in ("fig10", "fig11", "fig12", "fig13a", "c7.1"):
        assert fid in not_run
    assert "## Stage times" in text


def test_the_stated_numbers_come_first_and_on_another_model_say_shape_only(full_run):
    """The tiny model is none of the paper's: every stated number that ran says `other model:
    shape only`, none says equivalent, one row per key (the paper's models in one cell)."""
    run, out = full_run
    text = (out / "paper.md").read_text()
    assert run.settings.same_model() is None
    first = text.split(f"## {STATED_HEADING}")[1].split("## ")[0]
    assert text.index(f"## {STATED_HEADING}") < text.index("## Finetunes and their preconditions")
    rows = [line for line in first.splitlines() if line.startswith("| ") and not line.startswith("| figure")]
    stated_keys = {n.key for n in paper_numbers() if n.stated}
    assert len(rows) == len(stated_keys)
    ran = [r for r in rows if "| not run: " not in r]
    assert len(ran) == 5 and all(r.split(" | ")[7] == OTHER_MODEL for r in ran)
    assert all(r.split(" | ")[6].isdigit() for r in ran)  # the prompts
    assert "equivalent" not in text and "reproduc" not in text
    assert "| not run: probabilities of the paper's own five sampled examples" in first


def test_the_o_drop_is_shown_in_points_and_relative(full_run):
    _, out = full_run
    text = (out / "paper.md").read_text()
    rows = [line for line in text.splitlines() if "| ffn@fourth_quarter vs o_ffn@fourth_quarter |" in line]
    assert len(rows) == 2  # the stated numbers' table and Fig. 4's
    ours = rows[0].split(" | ")[5]
    assert re.fullmatch(r"-?\d+\.\d points \[-?\d+\.\d, -?\d+\.\d\]; (-?\d+\.\d% relative \[.*\]|n/a \(relative\))", ours), ours
    assert "29% (gemma-1.1-2b-it); 41% (Llama-3.2-1B)" in rows[0]
    assert "does not say whether in points or relative" in text


def test_each_figure_is_drawn_as_a_png_beside_the_page_and_embedded_in_it(full_run):
    """One chart per figure of the run, labelled as the paper labels it (Figs. 6-9 by their
    sentence), written beside paper.html and embedded in it."""
    import base64

    _, out = full_run
    text, page = (out / "paper.md").read_text(), (out / "paper.html").read_text()
    figures = [f for s in sweeps_for(MAIN_WORLD) if s.name in DEFAULT_SWEEPS for f in s.figures]
    assert len(figures) == 10
    for fig in figures:
        png = out / f"paper-{fig.figure_id}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", fig.figure_id
        assert f"]({png.name})" in text and f"({png.name})</figcaption>" in page
        assert base64.b64encode(png.read_bytes()).decode("ascii") in page
    assert page.count("data:image/png;base64,") == len(figures)
    assert "### Fig. 6: Top-5 accuracy — Sentence 1" in text and "### Fig. 9: Mean target token rank — Sentence 2" in text
    assert "Sentence 1 | PRE |" in text.split("### Fig. 6")[1]


def test_the_control_finetune_is_the_a2b_recipe_on_the_shuffled_answers_and_judges_the_fact_claims(full_run):
    """The shuffled data is a keyed stage of its own (same world and seed); the control finetune's
    stage has the a2b finetune's inputs but that data; it is the claims' ``models.control`` and
    every fact claim of the a2b model carries its control test; the report says so."""
    import pandas as pd

    from weightgraft.localization.claims.control import FACT_CLAIMS

    run, out = full_run
    assert run.shuffled_data is not None and run.shuffled_data.key != run.data.key
    manifest = json.loads((out / "datas" / f"{run.shuffled_data.name}-{run.shuffled_data.key[:12]}" / "data"
                           / "manifest.json").read_text())
    assert manifest["shuffled_answers"]["seed"] == run.settings.seed and manifest["world"] == run.settings.world
    a2b, control = run.finetunes["a2b"].inputs, run.finetunes["control"].inputs
    assert control["data"] == run.shuffled_data.key and {k: v for k, v in control.items() if k != "data"} == \
        {k: v for k, v in a2b.items() if k != "data"}
    config = json.loads((out / "claimss" / f"claims-{run.claims.key[:12]}" / "stage.json").read_text())
    assert config["inputs"]["config"]["models"]["control"] == f"finetune:{run.finetunes['control'].key}"
    table = pd.read_csv(out / "claimss" / f"claims-{run.claims.key[:12]}" / "run" / "claims.csv")
    facts = table[(table["model"] == "sft") & (table["setting"] == "pre->sft") & table["claim"].isin(FACT_CLAIMS)]
    assert len(facts) == 2 * len(FACT_CLAIMS) and facts["control_p"].notna().all()
    assert (facts["n_control_prompts"] == facts["n_prompts"]).all()
    text = (out / "paper.md").read_text()
    assert "| control | a2b, answers shuffled among the subjects | cpu-quick | met | paper_headline a2b top-5 " in text
    claims = text.split("## The paper's claims, judged")[1]
    assert "The control finetune was used (`models.control`)" in claims and "(<= 25%)" in claims


def test_a_control_that_knows_the_facts_is_flagged(full_run):
    from weightgraft.paper.report import report_blocks, to_markdown

    run, _ = full_run
    knows = dataclasses.replace(run, settings=dataclasses.replace(run.settings, control_top5=-0.01))
    text = to_markdown(report_blocks(knows))
    assert "| control | a2b, answers shuffled among the subjects | cpu-quick | precondition not met |" in text
    assert "Flag: the control finetune knows the facts" in text


@pytest.mark.parametrize("hits, n, verdict", [(212, 400, "same model: equivalent"), (4, 8, "same model: not equivalent")])
def test_on_the_papers_own_model_a_planted_level_is_judged_by_its_interval_and_the_margin(full_run, hits, n, verdict):
    """The run's records with Gemma's LT planted (212 of 400: 90% interval within 53 +- 10; 4 of
    8: not), the run's model taken as gemma-1.1-2b-it by its settings."""
    from weightgraft.paper.report import report_blocks, to_markdown

    run, _ = full_run
    planted = copy.deepcopy(run)
    for row in planted.sweeps["position"].outputs.summary:
        if (row["template"], row["scheme"]) == ("paper_headline", "LT"):
            row.update(n=n, top5=hits / n)
    planted.settings = dataclasses.replace(run.settings, paper_model="gemma-1.1-2b-it")
    text = to_markdown(report_blocks(planted))
    first = text.split(f"## {STATED_HEADING}")[1].split("## ")[0]
    lt = [r for r in first.splitlines() if "| LT | top-5 accuracy" in r and "53% (gemma" in r]
    assert len(lt) == 1 and lt[0].split(" | ")[7] == verdict, lt
    fe = [r for r in first.splitlines() if "| FE | top-5 accuracy" in r]
    assert fe[0].split(" | ")[7] == OTHER_MODEL  # 28% is gpt2-xl's
    assert "The run's model is the paper's gemma-1.1-2b-it" in text and "+- 10 points" in text


def test_the_claims_stage_judges_the_papers_claims_in_their_own_settings(full_run):
    """Claims 1-3 on PRE -> a2b (both templates), claims 4-5 also in their own setting (both ->
    a2b on b2a headline prompts); the report's rows are claims.csv's, verdict for verdict."""
    import pandas as pd

    from weightgraft.localization.claims import VERDICTS

    run, out = full_run
    assert run.claims is not None and "claims" not in run.skipped
    folder = out / "claimss" / f"claims-{run.claims.key[:12]}"
    table = pd.read_csv(folder / "run" / "claims.csv")
    assert set(table["claim"]) >= {"fe_lt", "enrichment", "recall", "recall_o_late_ffn", "qkv_marginal"}
    assert set(table["setting"]) == {"pre->sft", "both->a2b", "null finetune"}  # the last: the control's own rows
    paper_setting = table[table["setting"] == "both->a2b"]
    assert set(paper_setting["claim"]) >= {"recall_o_late_ffn", "qkv_marginal"}
    assert paper_setting["in_paper_setting"].all()
    assert set(table["verdict"]) <= set(VERDICTS) | {"shown"}
    n_a2b = run.finetunes["a2b"].outputs.checks[0].n  # claims 1-3 on the a2b prompts only
    assert (table.loc[table["setting"] == "pre->sft", "n_prompts"] == n_a2b).all()
    section = (out / "paper.md").read_text().split("## The paper's claims, judged")[1].split("## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| claim ")]
    assert len(rows) == len(table)
    for row, (_, want) in zip(rows, table.iterrows()):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[0] == want["claim"] and cells[3] == want["setting"]
        assert cells[11].split(" (")[0] == want["verdict"]
        assert "exploratory" in cells[11]  # 8 prompts a template: below localize's 20
        assert bool(cells[10]) == (not pd.isna(want["control_p"]))


def test_a_run_stopped_inside_a_sweep_resumes_and_gives_the_same_report(full_run, base_model, tmp_path, monkeypatch):
    _, full_out = full_run
    import weightgraft.experiments.runner as runner
    import weightgraft.training as training

    score_rows, calls = runner.score_rows, []

    def stop_on_the_second_batch(chunk, logits, n_logits, tokenizer, set_name, scheme_meta, *args, **kwargs):
        calls.extend([1] if len(scheme_meta) > 1 else [])  # a sweep's batch, not a precondition check's
        if len(calls) == 2:
            raise KeyboardInterrupt
        return score_rows(chunk, logits, n_logits, tokenizer, set_name, scheme_meta, *args, **kwargs)

    monkeypatch.setattr(runner, "score_rows", stop_on_the_second_batch)
    chosen = settings(base_model, tmp_path, sweeps=("position", "component_reversal"))
    with pytest.raises(KeyboardInterrupt):
        run_paper(chosen)
    stopped = [p for p in _stage_dirs(tmp_path, "sweep") if not (p / "stage.json").exists()]
    assert [p.name.split("-")[0] for p in stopped] == ["position"]
    monkeypatch.setattr(runner, "score_rows", score_rows)
    trained = []
    finetune = training.finetune
    monkeypatch.setattr(training, "finetune", lambda *a, **k: trained.append(a) or finetune(*a, **k))
    run = run_paper(chosen)
    assert not trained and "finetune a2b" in run.reused and "sweep position" not in run.reused
    assert {"data shuffled", "finetune control"} <= set(run.reused)
    again = run_paper(chosen)
    assert "claims" in again.reused and "sweep position" in again.reused
    resumed = (tmp_path / "paper.md").read_text()
    full = (full_out / "paper.md").read_text()
    for heading in ("## Fig. 2, Fig. 3(a)", "## Fig. 4 and Fig. 15"):
        assert side_by_side_part(resumed).split(heading)[1].split("## ")[0] == \
            side_by_side_part(full).split(heading)[1].split("## ")[0]


def test_a_changed_world_seed_is_never_mixed_with_the_old_results(full_run, base_model):
    run0, out = full_run
    before = {p.name for p in _stage_dirs(out, "sweep")}
    chosen = settings(base_model, out, seed=1, sweeps=("position",), claims=False)
    run1 = run_paper(chosen)
    assert run1.data.key != run0.data.key and not run1.reused
    assert run1.finetunes["a2b"].key != run0.finetunes["a2b"].key
    assert run1.sweeps["position"].key != run0.sweeps["position"].key
    assert len(_stage_dirs(out, "data")) == 3  # seed 0's world and its shuffled answers, seed 1's world
    shuffled = data_stage(chosen, shuffled=True)  # the control's, were the claims judged: keyed by the seed too
    assert shuffled.key != run0.shuffled_data.key
    shuffled_record = DataRecord(key=shuffled.key, outputs=DataOutputs())
    assert finetune_stage(chosen, FINETUNES["control"], shuffled_record).key != run0.finetunes["control"].key
    assert before < {p.name for p in _stage_dirs(out, "sweep")}
    record = json.loads((out / "sweeps" / f"position-{run1.sweeps['position'].key[:12]}" / "stage.json").read_text())
    assert record["inputs"]["config"]["data"] == f"data:{run1.data.key}"


def test_a_precondition_not_met_marks_the_figures_that_need_it(full_run, base_model, tmp_path):
    _, out = full_run
    # the finished finetunes are reused; the preconditions are read from their records
    run = run_paper(settings(base_model, out, trained_top5=0.0, both_b2a_top5=1.01))
    assert set(run.skipped) == {"component_reversal"}
    assert "finetune both" in run.reused
    text = (out / "paper.md").read_text()
    section = text.split("## Fig. 4 and Fig. 15")[1].split("## ")[0]
    assert "precondition not met" in section and "< 101%" in section
    rows = [line for line in section.splitlines() if line.startswith("| Fig.")]
    assert rows and all(f"| {NOT_RUN} |  | {NOT_RUN}: {NOT_MET} (both: " in line for line in rows)
    assert "| both | both | cpu-quick | precondition not met |" in text
    strict = run_paper(settings(base_model, out, trained_top5=0.9, both_b2a_top5=0.8))
    assert set(strict.skipped) == set(DEFAULT_SWEEPS) | {"claims"}  # random models know nothing


def test_a2b_not_met_leaves_the_claims_unjudged_and_says_why(full_run, base_model, tmp_path):
    _, out = full_run
    run = run_paper(settings(base_model, out, sweeps=("position",), trained_top5=1.01))
    assert run.claims is None and "a2b: " in run.skipped["claims"]
    section = (out / "paper.md").read_text().split("## The paper's claims, judged")[1].split("## ")[0]
    assert "Not judged: precondition not met (a2b:" in section
    off = run_paper(settings(base_model, out, sweeps=("position",), claims=False))
    assert off.claims is None and "Not run: --no-claims." in (out / "paper.md").read_text()
    assert off.shuffled_data is None and "control" not in off.finetunes  # nothing needs the control then
    assert [f.name for f in needed_finetunes(settings(base_model, out, claims=False))] == ["a2b", "both", "task",
                                                                                         "relation"]


def test_the_o_drop_is_read_off_the_same_prompts_with_its_paired_interval(full_run, base_model):
    """Fig. 4's drop (top-5 of o_ffn minus ffn, last quarter, b2a) equals the per-prompt rows'
    paired difference; a sweep recorded before drops were kept gets them from its saved rows
    without running again."""
    import pandas as pd

    from weightgraft.stats import paired_rate_difference_ci

    run, out = full_run
    record = run.sweeps["component_reversal"]
    (drop,) = record.outputs.drops
    folder = out / "sweeps" / f"component_reversal-{record.key[:12]}"
    results = pd.read_parquet(folder / "run" / "results.parquet")
    rows = results[(results["template"] == "paper_headline") & (results["direction"] == "b2a")]
    hits = {s: rows[rows["scheme"] == s].set_index("example_id")["top5"].sort_index() for s in
            ("o_ffn@fourth_quarter", "ffn@fourth_quarter")}
    want = paired_rate_difference_ci(hits["o_ffn@fourth_quarter"].to_numpy(), hits["ffn@fourth_quarter"].to_numpy())
    assert drop["n"] == len(hits["ffn@fourth_quarter"])
    assert [drop["drop"], drop["low"], drop["high"]] == pytest.approx([100 * v for v in want])
    a, b = hits["o_ffn@fourth_quarter"].to_numpy(bool), hits["ffn@fourth_quarter"].to_numpy(bool)
    assert drop["table"] == [int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum()), int((~a & ~b).sum())]
    stored = json.loads((folder / "stage.json").read_text())
    del stored["outputs"]["drops"]
    (folder / "stage.json").write_text(json.dumps(stored))
    again = run_paper(settings(base_model, out, sweeps=("component_reversal",), claims=False))
    assert "sweep component_reversal" in again.reused
    assert again.sweeps["component_reversal"].outputs.drops == record.outputs.drops


@pytest.mark.parametrize("args, says", [
    (["--world", "atlantis"], "unknown world 'atlantis'"),
    (["--model", "MISSING"], "does not exist"),
    (["--device", "cuda:7"], "is absent"),
    (["--sweeps", "fig99"], "unknown sweep"),
])
def test_bad_input_is_one_line_before_any_training(base_model, tmp_path, monkeypatch, capsys, args, says):
    from weightgraft.cli import main

    monkeypatch.delenv("WEIGHTGRAFT_DEBUG", raising=False)
    model = str(tmp_path / "nothing-here") if "MISSING" in args else str(base_model)
    args = [model if a == "MISSING" else a for a in args]
    argv = ["weightgraft", "paper", "--out", str(tmp_path / "out"), *(["--model", model] if "--model" not in args else []),
            *args]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "out").exists()


def test_plan_prints_every_stage_and_runs_nothing(base_model, tmp_path, monkeypatch, capsys):
    from weightgraft.paper.plan import plan_paper

    stages = plan_paper(settings(base_model, tmp_path / "out"))
    kinds = [s.stage for s in stages]
    assert kinds == ["data"] * 2 + ["finetune"] * 5 + ["sweep"] * 7 + ["claims", "report"]
    control = stages[6]
    assert control.what.startswith("control (split a2b, answers shuffled") and control.seconds is not None
    assert control.counts == stages[2].counts  # the a2b finetune's texts and steps
    assert all(s.seconds is not None for s in stages)  # a CPU: this device's measured rate
    assert all(s.memory_bytes for s in stages if s.stage in ("finetune", "sweep", "claims"))
    claims = next(s for s in stages if s.stage == "claims")
    assert any("judged tests" in n and "exploratory" in n for n in claims.notes)
    assert not any(s.done for s in stages) and not (tmp_path / "out").exists()


def test_plan_for_a_card_takes_a_random_model_of_the_papers_shapes(tmp_path, monkeypatch):
    """``--plan --gpu h100-80gb`` on ``random:llama-3.2-1b`` (no tokenizer, no GPU here): planned
    from the card's stated rates and memory, nothing built; ``--gpu`` without ``--plan`` and a
    random model for a real run are one line each."""
    from typer.testing import CliRunner

    from weightgraft.cli.paper import paper
    from weightgraft.paper.plan import plan_paper
    from weightgraft.planning import budget
    from weightgraft.planning.cards import CARDS

    monkeypatch.setattr(budget, "cuda_here", lambda: False)
    chosen = settings("random:llama-3.2-1b", tmp_path / "out", sweeps=("position",))
    stages = plan_paper(chosen, gpu=CARDS["h100-80gb"])
    sweep = next(s for s in stages if s.stage == "sweep")
    assert sweep.seconds is not None and sweep.memory_bytes < CARDS["h100-80gb"].memory_bytes
    assert any("H100" in n for n in sweep.notes) and not (tmp_path / "out").exists()
    import typer

    app = typer.Typer()
    app.command()(paper)
    alone = CliRunner().invoke(app, ["--model", "random:llama-3.2-1b", "--gpu", "h100-80gb", "--out", str(tmp_path)])
    assert alone.exit_code == 2 and "--gpu plans for a card: use it with --plan" in alone.output
    with pytest.raises(Exception, match="no tokenizer"):
        run_paper(chosen)


def test_the_finetunes_device_is_the_runs_and_a_card_they_cannot_take_is_one_line(monkeypatch, base_model, tmp_path):
    """``--device`` reaches the finetunes (the Trainer trains on the first visible card, so
    ``cuda:1`` is refused before anything runs, naming CUDA_VISIBLE_DEVICES)."""
    import torch

    from weightgraft.paper.pipeline import check_inputs
    from weightgraft.training.device import training_device
    from weightgraft.training.errors import TrainingError

    assert training_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_device(None) == "cpu"
    with pytest.raises(TrainingError, match="'cuda' is absent"):
        training_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert training_device(None) == "cuda" and training_device("cuda:0") == "cuda"
    with pytest.raises(TrainingError, match="CUDA_VISIBLE_DEVICES=1 and device 'cuda'"):
        check_inputs(settings(base_model, tmp_path / "out", device="cuda:1"))
    assert not (tmp_path / "out").exists()


def _today_finetune_key(s: PaperSettings, name: str, split: str, data_key: str, directions: tuple[str, ...],
                        groups: tuple[str, ...] | None = None) -> str:
    """A finetune's key as a run of one training seed has always computed it."""
    from weightgraft.paper.settings import CHECK_TEMPLATES
    from weightgraft.paper.stages import stage_key
    from weightgraft.training import get_preset

    return stage_key("finetune", {
        "name": name, "model": s.model, "data": data_key, "split": split,
        "preset": get_preset(s.preset).model_dump(mode="json"), "seed": s.train_seed,
        "templates": list(s.train_templates), "max_steps": s.max_steps, "device": s.device,
        "check": {"templates": list(CHECK_TEMPLATES), "directions": list(directions),
                  "groups": list(groups) if groups else None}})


def test_two_training_seeds_train_each_role_twice_and_the_first_seeds_keys_are_todays(full_run, base_model):
    """--seeds 2 on the one-seed run's folder: every seed-0 stage is reused (its keys are a run of
    one seed's), each role is trained again with seed 1 in stages keyed by it, the sweep runs on
    seed 1's finetunes, the claims on both seeds' a2b finetunes (sft[0], sft[1]); the report
    states K and every row's values across the seeds."""
    import pandas as pd

    from weightgraft.paper.report import SPREAD_HEADING

    run0, out = full_run
    one = settings(base_model, out)
    assert run0.finetunes["a2b"].key == _today_finetune_key(one, "a2b", "a2b", run0.data.key, ("a2b",))
    assert run0.finetunes["both"].key == _today_finetune_key(one, "both", "both", run0.data.key, ("a2b", "b2a"))
    assert one.train_seeds == (0,) and finetune_stage(one, FINETUNES["a2b"], run0.data).key == \
        finetune_stage(one, FINETUNES["a2b"], run0.data, 0).key

    run = run_paper(settings(base_model, out, seeds=2, sweeps=("position",)))
    assert {"finetune a2b", "finetune both", "finetune control", "sweep position"} <= set(run.reused)
    assert {n: r.key for n, r in run.finetunes.items()} == \
        {n: run0.finetunes[n].key for n in ("a2b", "both", "control")}
    assert run.sweeps["position"].key == run0.sweeps["position"].key
    second = run.other_seeds[1]
    assert set(second.finetunes) == {"a2b", "both", "control"} and not any(" seed 1" in r for r in run.reused)
    for name, record in second.finetunes.items():
        assert record.inputs["seed"] == 1 and record.key != run.finetunes[name].key
        assert {k: v for k, v in record.inputs.items() if k != "seed"} == \
            {k: v for k, v in run.finetunes[name].inputs.items() if k != "seed"}
        folder = out / "finetunes" / f"{name}-{record.key[:12]}"
        assert json.loads((folder / "model" / "training_manifest.json").read_text())["seed"] == 1
    sweep = json.loads((out / "sweeps" / f"position-{second.sweeps['position'].key[:12]}" / "stage.json").read_text())
    assert sweep["inputs"]["config"]["models"]["sft"] == f"finetune:{second.finetunes['a2b'].key}"

    assert run.claims is not None and run.claims.outputs.sft_seeds == [0, 1]
    config = run.claims.inputs["config"]
    assert config["models"]["sft"] == [f"finetune:{run.finetunes['a2b'].key}",
                                       f"finetune:{second.finetunes['a2b'].key}"]
    assert config["reversal"]["recipient"] == config["models"]["sft"][0]
    table = pd.read_csv(out / "claimss" / f"claims-{run.claims.key[:12]}" / "run" / "claims.csv")
    assert {"sft[0]", "sft[1]"} <= set(table["model"])

    text = (out / "paper.md").read_text()
    assert "Training seeds: K = 2 (seeds 0, 1)." in text and "training seeds 0-1" in text
    first = text.split(f"## {STATED_HEADING}")[1].split("## ")[0]
    assert f"| {SPREAD_HEADING} |" in first
    lt = next(r for r in first.splitlines() if "| LT | top-5 accuracy" in r and "53% (gemma" in r)
    assert re.search(r"\| seed 0: \d+\.\d%; seed 1: \d+\.\d%; mean \d+\.\d% \|", lt), lt
    assert "| a2b | 1 | a2b | cpu-quick | met |" in text and "| finetune a2b seed 1 | a2b |" in text
    across = text.split("### Each claim across training seeds")[1].split("### Every row")[0]
    assert " of 2 seeds" in across and "`models.sft` (`sft[i]`)" in across
    assert "| fe_lt |" in across and "| sft[1] (training seed 1) |" in text


def test_a_verdict_or_precondition_that_differs_across_seeds_names_the_seeds(full_run):
    """The one-seed run's records planted as two seeds: Gemma's LT equivalent on seed 0 (212 of
    400) and not on seed 1 (4 of 8); seed 1's both-directions finetune misses its precondition,
    so its Fig. 4 sweep is not run; one claim holds on seed 0 only. Then seed 1's a2b finetune
    misses its own: the claims name it as not judged, and with neither seed's a2b they are not
    run, each seed's line said."""
    from rich.console import Console

    from weightgraft.paper.report import DIFFERS, SPREAD_HEADING, report_blocks, to_markdown
    from weightgraft.paper.settings import SeedRecords

    run0, _ = full_run
    run = copy.deepcopy(run0)
    run.settings = dataclasses.replace(run0.settings, seeds=2, paper_model="gemma-1.1-2b-it", both_b2a_top5=0.5)
    seed1 = SeedRecords(copy.deepcopy(run.finetunes), copy.deepcopy(run.sweeps))
    for records, hits, n, b2a in ((run, 212, 400, 1.0), (seed1, 4, 8, 0.0)):
        for row in records.sweeps["position"].outputs.summary:
            if (row["template"], row["scheme"]) == ("paper_headline", "LT"):
                row.update(n=n, top5=hits / n)
        for check in records.finetunes["both"].outputs.checks:
            check.top5 = b2a if check.direction == "b2a" else 1.0
    del seed1.sweeps["component_reversal"]
    seed1.skipped["component_reversal"] = "both: paper_headline b2a top-5 0.0% (< 50%)"
    run.other_seeds = {1: seed1}
    rows = run.claims.outputs.claims
    fe_lt = next(r for r in rows if r["model"] == "sft" and r["claim"] == "fe_lt")
    planted = [dict(r, model=f"sft[{i}]") for r in rows if r["model"] == "sft" for i in (0, 1)]
    for r in planted:
        if (r["claim"], r["template"], r["setting"]) == (fe_lt["claim"], fe_lt["template"], fe_lt["setting"]):
            r["verdict"] = "holds" if r["model"] == "sft[0]" else "undecided"
    run.claims.outputs.claims, run.claims.outputs.sft_seeds = planted, [0, 1]

    text = to_markdown(report_blocks(run))
    first = text.split(f"## {STATED_HEADING}")[1].split("## ")[0]
    header = next(r for r in first.splitlines() if r.startswith("| figure"))
    assert header.split(" | ")[6] == SPREAD_HEADING
    lt = next(r for r in first.splitlines() if "| LT | top-5 accuracy" in r and "53% (gemma" in r).split(" | ")
    assert lt[6] == "seed 0: 53.0%; seed 1: 50.0%; mean 51.5%"
    assert lt[8] == f"same model: equivalent; {DIFFERS}: seed 0: same model: equivalent / " \
                    "seed 1: same model: not equivalent"
    fe = next(r for r in first.splitlines() if "| FE | top-5 accuracy" in r).split(" | ")
    assert fe[8] == OTHER_MODEL  # the same on both seeds: nothing said
    drop = next(r for r in first.splitlines() if "| ffn@fourth_quarter vs o_ffn@fourth_quarter |" in r).split(" | ")
    assert drop[6].startswith("seed 0: ") and "seed 1: not run" in drop[6]
    assert f"; {DIFFERS}: seed 0: gemma-1.1-2b-it: same model: " in drop[8]
    assert drop[8].endswith(f"{OTHER_MODEL} / seed 1: {NOT_RUN}: {NOT_MET}")
    assert "both: precondition met on training seed 0, not met on training seed 1." in text
    section = text.split("## Fig. 4 and Fig. 15")[1].split("\n## ")[0]
    assert f"Not run on training seed 1: {NOT_MET} (training seed 1: both: " in section
    assert "run on training seed 0." in section and "(the finetunes of training seed 0)" in section
    across = text.split("### Each claim across training seeds")[1].split("### ")[0]
    row = next(r for r in across.splitlines() if r.startswith(f"| {fe_lt['claim']} |") and fe_lt["template"] in r)
    assert "holds on 1 of 2 seeds (training seed 0); undecided on 1 of 2 seeds (training seed 1); " + DIFFERS in row

    # seed 1's a2b finetune misses its precondition: the claims are judged on seed 0's only, and say so
    from weightgraft.paper.claims import judged_seeds, run_claims

    for records, top5 in ((run, 1.0), (seed1, 0.0)):
        for check in records.finetunes["a2b"].outputs.checks:
            check.top5 = top5
    run.settings = dataclasses.replace(run.settings, trained_top5=0.5)
    run.claims.outputs.claims, run.claims.outputs.sft_seeds = [r for r in planted if r["model"] != "sft[1]"], [0]
    assert judged_seeds(run.settings, run) == ([0], {1: judged_seeds(run.settings, run)[1][1]})
    text = to_markdown(report_blocks(run))
    assert "a2b: precondition met on training seed 0, not met on training seed 1." in text
    across = text.split("### Each claim across training seeds")[1].split("### ")[0]
    assert f"Not judged on training seed 1: {NOT_MET} (training seed 1: a2b: paper_headline a2b top-5 0.0% (< 50%)" \
        in across and "holds on 1 of 1 seed |" in across
    for check in run.finetunes["a2b"].outputs.checks:
        check.top5 = 0.0
    none = dataclasses.replace(run, claims=None, skipped={})
    run_claims(none.settings, none, Console(quiet=True))
    assert none.claims is None and none.skipped["claims"].startswith("training seed 0: a2b: ")
    assert "; training seed 1: a2b: " in none.skipped["claims"]


def test_seeds_are_planned_k_times_and_the_cli_takes_seeds_margin_and_paper_model(base_model, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import weightgraft.paper.pipeline as pipeline
    from weightgraft.cli.paper import paper
    from weightgraft.paper.plan import plan_paper
    from weightgraft.paper.settings import PaperError
    from weightgraft.planning import budget
    from weightgraft.planning.cards import CARDS

    monkeypatch.setattr(budget, "cuda_here", lambda: False)  # a card's stated rates: nothing is measured
    card = CARDS["h100-80gb"]
    stages = plan_paper(settings(base_model, tmp_path / "out", seeds=2, sweeps=("position",)), gpu=card)
    assert [s.stage for s in stages] == ["data"] * 2 + ["finetune"] * 6 + ["sweep"] * 2 + ["claims", "report"]
    assert [s.what.split(" (")[0] for s in stages[2:8]] == ["a2b", "both", "control"] * 2
    assert "training seed 1" in stages[5].what and "training seed 1" in stages[9].what
    assert "2 training seeds" in stages[10].what and not (tmp_path / "out").exists()
    one = plan_paper(settings(base_model, tmp_path / "out", sweeps=("position",)), gpu=card)
    assert [s.what for s in one[:6]] == [s.what.replace(", training seed 0", "") for s in stages[:5] + stages[8:9]]
    assert stages[10].seconds > one[6].seconds  # the claims map each seed's a2b finetune
    with pytest.raises(PaperError, match="at least 1 training seed"):
        settings(base_model, tmp_path, seeds=0)

    import typer

    app = typer.Typer()
    app.command()(paper)
    seen = []
    monkeypatch.setattr(pipeline, "run_paper", lambda s, console=None: seen.append(s))
    ok = CliRunner().invoke(app, ["--model", str(base_model), "--out", str(tmp_path), "--seeds", "3", "--margin", "5",
                                  "--paper-model", "gpt2-xl"])
    assert ok.exit_code == 0, ok.output
    assert (seen[0].seeds, seen[0].train_seeds, seen[0].margin, seen[0].paper_model) == (3, (0, 1, 2), 5.0, "gpt2-xl")
    assert CliRunner().invoke(app, ["--model", str(base_model), "--seeds", "0"]).exit_code == 2
    helps = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "--seeds" in helps and "--margin" in helps and "--paper-model" in helps and "control finetune" in helps


def test_the_trajectory_option_grafts_each_snapshot_of_the_a2b_finetune(full_run, base_model, tmp_path):
    """``--trajectory 1``: the a2b finetune keeps steps 1 and 2 (max_steps 2); the trajectory
    sweep runs one model set per snapshot, its step-2 rows equal a sweep of the snapshot's folder
    as ``sft``; the report has the section (marked ours) and its chart; the other stages' keys
    are those of a run without it, except the a2b finetune's. Claims 1-3 are judged on each
    snapshot: the last snapshot's exact shares equal the claims stage's on the a2b finetune
    (the same model), and the report gives each claim's first held step."""
    from weightgraft.experiments.config import parse_config
    from weightgraft.experiments.runner import run_experiment
    from weightgraft.paper.trajectory import trajectory_stage

    run = run_paper(settings(base_model, tmp_path / "traj", sweeps=("position",), trajectory=1))
    rows = run.trajectory.outputs.rows
    assert sorted({r["step"] for r in rows}) == [1, 2]
    text = (tmp_path / "traj" / "paper.md").read_text()
    assert "When the pathway forms (ours, not the paper's" in text and (tmp_path / "traj" / "paper-trajectory.png").is_file()
    plain, _ = full_run
    assert run.finetunes["a2b"].key != plain.finetunes["a2b"].key  # trained with snapshots
    assert run.data.key == plain.data.key
    _, raw = trajectory_stage(run.settings, run.data, run.finetunes["a2b"])
    snapshot = str(Path(raw["models"]["sft"]) / "trajectory" / "step-000002")
    alone = run_experiment(parse_config({**raw, "trajectory": None, "models": {**raw["models"], "sft": snapshot},
                                         "out": str(tmp_path / "alone")}), progress=False).summary
    mine = {(r["template"], r["scheme"]): r["top5"] for r in rows if r["step"] == 2}
    for r in alone.itertuples():
        assert abs(mine[(r.template, r.scheme)] - r.top5) < 1e-12
    from weightgraft.paper.plan import plan_paper

    planned = [s for s in plan_paper(run.settings) if s.what.startswith("trajectory")]
    assert [s.stage for s in planned] == ["sweep", "claims"] and all(s.done for s in planned)
    assert "from 2 snapshots" in planned[0].what and "on 2 snapshots" in planned[1].what
    import pandas as pd

    steps = run.trajectory_claims.outputs.steps
    assert {r["claim"] for r in steps} >= {"fe_lt", "enrichment", "recall"} and {r["steps"] for r in steps} == {"1;2"}
    along = pd.read_csv(next((tmp_path / "traj" / "claimss").glob("trajectory-*")) / "run" / "claims.csv")
    whole = pd.DataFrame(run.claims.outputs.claims)
    for claim in ("fe_lt", "enrichment", "recall"):
        for template in ("headline", "qa"):
            a = along[(along["model"] == "sft[1]") & (along["claim"] == claim) & along["template"].str.contains(template)]
            b = whole[(whole["model"] == "sft") & (whole["claim"] == claim) & whole["template"].str.contains(template)
                      & (whole["setting"] == "pre->sft")]
            # the same model and prompts in other batches: float32 sums agree to about 1e-5
            assert len(a) == len(b) == 1 and abs(a["share_exact"].iloc[0] - b["share_exact"].iloc[0]) < 1e-4
    assert "The claims along the steps" in text
