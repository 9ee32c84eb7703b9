"""The reports write the blocks docs/ holds: a paper report is one generated block named by its
model (and world), with the claims' rules version its claims records were judged with (recorded,
or read off the rows for a record written before it was recorded) and the command that writes it
again; a localize run's claims are one block too. The report names the paper by its title and
each of its models by the paper's name beside the code's id; a chart's stated values say whose
level they are."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from weightgraft.localization.claims import RULES_VERSION
from weightgraft.paper.appendix import appendix_settings
from weightgraft.paper.charts import _other_model
from weightgraft.paper.figures import SWEEP_NAMES
from weightgraft.paper.report import PAPER_TITLE, block_name, paper_command, paper_models_text, report_rules
from weightgraft.paper.report_claims import rules_of
from weightgraft.paper.settings import PaperSettings
from weightgraft.paper.stages import ClaimsOutputs, ClaimsRecord, TrajectoryClaimsOutputs, TrajectoryClaimsRecord
from weightgraft.report.blocks import generated_blocks
from weightgraft.report.claims_page import claims_markdown, rules_of_table


def _record(rows, **outputs):
    return ClaimsRecord(outputs=ClaimsOutputs(claims=rows, **outputs))


def _steps(rows):
    return TrajectoryClaimsRecord(outputs=TrajectoryClaimsOutputs(steps=rows))


def test_a_claims_records_rules_are_recorded_or_read_off_its_rows():
    assert rules_of(None) is None
    assert rules_of(_record([{"claim": "fe_lt"}], rules=9)) == 9
    assert rules_of(_record([{"claim": "fe_lt", "ci_level": 0.95}])) == 8  # rows with their level: rules 8
    assert rules_of(_record([{"claim": "fe_lt", "ci_low": 0.1}])) == 7  # written before the level was kept
    assert rules_of(_steps([{"claim": "fe_lt", "ci_level": None}])) == 8


def test_a_report_carries_its_oldest_claims_records_rules_else_the_codes():
    run = SimpleNamespace(claims=_record([{"ci_low": 0.1}]), trajectory_claims=_steps([{"ci_level": 0.95}]))
    assert report_rules(run) == 7
    assert report_rules(SimpleNamespace(claims=None, trajectory_claims=None)) == RULES_VERSION


def test_the_block_names_its_model_and_world_and_the_command_that_writes_it_again():
    main = PaperSettings(model="smollm2-135m", seeds=3, out=Path("/work/seeds/smollm2"))
    assert block_name(main) == "paper-smollm2-135m"
    assert paper_command(main) == "weightgraft paper --model smollm2-135m --seeds 3 --out /work/seeds/smollm2"
    both = PaperSettings(model="google/gemma-1.1-2b-it", worlds=("fake_movies_fake_actors",), sweeps=SWEEP_NAMES,
                         claims=False, preset="paper-aggressive", device="cuda")
    assert block_name(both) == "paper-gemma-1.1-2b-it"
    assert paper_command(both) == ("weightgraft paper --model google/gemma-1.1-2b-it --device cuda --preset "
                                   "paper-aggressive --worlds fake_movies_fake_actors --no-claims --out runs/paper")
    world = appendix_settings(PaperSettings(model="smollm2-135m"), "fake_movies_fake_actors")
    assert block_name(world) == "paper-smollm2-135m-fake_movies_fake_actors"
    assert "--world fake_movies_fake_actors --sweeps position --no-claims" in paper_command(world)


def test_the_paper_and_its_models_are_named_as_the_paper_names_them():
    assert "Dynamic Weight Grafting: Localizing Finetuned Factual Knowledge in Transformers" in PAPER_TITLE
    assert "ICLR 2026" in PAPER_TITLE and 'earlier titled \\"Multiple Streams' not in PAPER_TITLE
    assert "Gemma 2B (gemma-1.1-2b-it)" in paper_models_text() and "LLaMA 3.2 1B (Llama-3.2-1B)" in paper_models_text()


def test_a_charts_stated_value_says_whose_level_it_is():
    other = _other_model("gemma-1.1-2b-it", "smollm2-135m")
    assert "Gemma 2B (gemma-1.1-2b-it)" in other and "another model's level" in other and "smollm2-135m" in other
    assert "this model" in _other_model("gemma-1.1-2b-it", "google/gemma-1.1-2b-it")


def test_a_localize_runs_claims_are_one_block_with_their_rules(tmp_path):
    row = {"model": "sft", "setting": "pre->sft", "template": "paper_headline", "claim": "fe_lt", "n_prompts": 40,
           "threshold": 0.5, "side": ">", "share_exact": 0.88, "ci_low": 0.84, "ci_high": 0.91, "ci_level": 0.99,
           "share_plain": 0.99, "null_kind": "complement", "p_parts": "0.0001 / 0.0001", "p_holm": 0.0007,
           "least_p": 0.0001, "family_size": 7, "control_p": 0.0001, "verdict": "holds", "reason": ""}
    pd.DataFrame([row]).to_csv(tmp_path / "claims.csv", index=False)
    (block,) = generated_blocks(claims_markdown(tmp_path, "localize_claims", "weightgraft localize c.yaml"))
    assert (block.name, block.rules, block.command) == ("localize-localize_claims", 8, "weightgraft localize c.yaml")
    assert "0.88 [0.84, 0.91] (99%)" in block.body and "| holds |" in block.body
    assert rules_of_table(pd.DataFrame([{k: v for k, v in row.items() if k != "ci_level"}])) == 7
    assert claims_markdown(tmp_path / "none", "x") is None
