"""The localize plan's exact-effect terms (the pass and the states depth sharing holds beside
it, with the reference rows of the largest call) and its prompt lengths from a config's
``tokenizer:`` (random models), read from configs alone."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_world import write_world
from typer.testing import CliRunner

from weightgraft.cli import app
from weightgraft.localization.config import parse_localize_config
from weightgraft.localization.found_sets import split_prompts
from weightgraft.localization.prompts import select_prompts
from weightgraft.localization.run import plan_input
from weightgraft.models.spec import parse_spec
from weightgraft.models.tokenization import load_tokenizer
from weightgraft.planning.costs import attribution_bytes, inference_bytes
from weightgraft.planning.depth_states import depth_state_bytes
from weightgraft.planning.localize import DEPTH_STATES, EXACT_BATCH, plan_localize_work

SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256}


@pytest.fixture
def raw(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> dict:
    return {"data": str(write_world(tmp_path / "data", n=6)), "out": str(tmp_path / "loc"),
            "models": {"pre": str(tiny_model_dirs["pre"]), "sft": str(tiny_model_dirs["sft"])},
            "claims": {"enabled": False}, "exact": "none"}


def _plan(raw: dict, **kw):
    config = parse_localize_config(raw)
    return config, plan_localize_work(plan_input(config), memory="64GiB", with_time=False, **kw)


def test_the_search_plans_two_reference_rows_a_prompt(raw: dict) -> None:
    """Search, refinement and controls run over a template's fit (or held-out) prompts, each
    with its base and its sets' union; the states are depth_state_bytes of those rows, the
    longest prompt and exact_chunk, beside a pass whose keys and values they hold."""
    config, plan = _plan({**raw, "exact_chunk": 64})
    prompts = select_prompts(config)
    by_template: dict[str, list[str]] = {}
    for p in prompts:
        by_template.setdefault(p.template, []).append(p.id)
    halves = [len(split_prompts(ids, 0, t, 0.5)[k]) for t, ids in by_template.items() for k in ("fit_ids", "heldout_ids")]
    work = plan_input(config)
    assert work.exact_references == 2 * max(halves) > 0
    pre = parse_spec(work.pre).footprint()
    seq = plan.prompts["max_tokens"]
    states = depth_state_bytes(pre.config, work.exact_references, seq, 64, 4)
    exact = sum(inference_bytes(pre, 64, seq, 1, "float32", kv=False).values())
    attribution = sum(attribution_bytes(pre, min(plan.batch_size, len(prompts)), seq, "float32").values())
    assert plan.memory[EXACT_BATCH] == max(exact, attribution)
    assert plan.memory[DEPTH_STATES] == max(plan.memory[EXACT_BATCH], exact + states) - plan.memory[EXACT_BATCH] > 0
    assert any("depth sharing holds" in note for note in plan.notes)


def test_single_cell_maps_share_with_their_bases_alone(raw: dict) -> None:
    """Exact maps only: a group of (at most 8) prompts, one reference row each; more chunk
    rows, more states."""
    off = {**raw, "search": {"enabled": False}}
    config, plan = _plan({**off, "exact": 1})
    assert plan_input(config).exact_references == 2  # one prompt of each of the two templates
    _, wider = _plan({**off, "exact": 1, "exact_chunk": 1024})
    assert DEPTH_STATES in plan.memory and sum(wider.memory.values()) > sum(plan.memory.values())


def test_no_exact_effect_no_exact_terms(raw: dict) -> None:
    """Without exact maps, search or claims no exact pass runs: the batch is attribution's and
    no state is held (the plan counted the exact chunk before whatever ran)."""
    config, plan = _plan({**raw, "search": {"enabled": False}})
    assert plan_input(config).exact_references == 0 and DEPTH_STATES not in plan.memory
    pre = parse_spec(plan_input(config).pre).footprint()
    rows = min(plan.batch_size, plan.prompts["n"])
    assert plan.memory[EXACT_BATCH] == sum(attribution_bytes(pre, rows, plan.prompts["max_tokens"], "float32").values())


def test_the_plan_prints_the_states_as_their_own_line(raw: dict, tmp_path: Path) -> None:
    path = tmp_path / "loc.yaml"
    path.write_text(json.dumps(raw))
    result = CliRunner().invoke(app, ["plan", str(path), "--no-time", "--memory", "64GiB"])
    assert result.exit_code == 0, result.output
    assert DEPTH_STATES in result.output and "depth sharing holds" in result.output


def _random(raw: dict, tmp_path: Path, tokenizer: str) -> dict:
    spec = tmp_path / "small.json"
    spec.write_text(json.dumps(SMALL))
    return {**raw, "models": {"pre": f"random:{spec}", "sft": f"random:{spec}@1"}, "tokenizer": tokenizer}


def test_a_random_model_counts_tokens_with_the_configs_tokenizer(raw: dict, tmp_path: Path) -> None:
    """``tokenizer: bytes`` or a tokenizer directory: real token counts, said so; one not at
    hand here: the character estimate, said to be one."""
    tok = load_tokenizer("bytes")
    tok.save_pretrained(tmp_path / "tok")
    config, plan = _plan(_random(raw, tmp_path, "bytes"))
    longest = max(len(tok(p.prompt)["input_ids"]) for p in select_prompts(config))
    assert plan.prompts["max_tokens"] == longest and "the config's tokenizer 'bytes'" in plan.prompts["counted"]
    _, saved = _plan(_random(raw, tmp_path, str(tmp_path / "tok")))
    assert saved.prompts["max_tokens"] == longest and not saved.prompts["counted"].startswith("estimated")
    _, missing = _plan(_random(raw, tmp_path, str(tmp_path / "nowhere")))
    assert missing.prompts["counted"].startswith("estimated: the config's tokenizer")
    assert missing.prompts["max_tokens"] != longest  # 4 characters a token, not one byte



def test_the_graft_maps_term_is_what_exact_effects_builds(tiny_model_dirs: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan counts a single-cell map of a prompt of t tokens as (t x slots)^2 bytes
    (``_graft_map_bytes``): the items ``exact_effects`` builds, counted on a real call, are one
    byte per (position, slot) of every cell's map (int64 maps were 8x that)."""
    from weightgraft.engine import cells as cells_mod
    from weightgraft.engine.cells import ScoredExample, exact_effects, example_cells
    from weightgraft.models import load_model
    from weightgraft.planning.localize import _graft_map_bytes

    pre, sft = (load_model(str(tiny_model_dirs[r])).model for r in ("pre", "sft"))
    t = 5
    example = ScoredExample(tuple(range(3, 3 + t)), t - 1, 7)
    built: list[int] = []
    original = cells_mod._item

    def counting(ex, cells, slot_list):
        item = original(ex, cells, slot_list)
        built.append(item.maps.slots.nbytes + sum(m.nbytes for m in item.unit_maps().values()))
        return item

    monkeypatch.setattr(cells_mod, "_item", counting)
    cells = [[c] for c in example_cells(pre, example)]
    exact_effects([pre, sft], [example], [cells], pad_id=0, chunk=64)
    slots = len(cells_mod.model_slots(pre))
    maps = sum(built[1 : 1 + len(cells)])  # one item per cell, after the base's
    work = SimpleNamespace(exact_units=0, set_rows=0)
    planned = _graft_map_bytes(work, SimpleNamespace(slot_names=[None] * slots, layers=1), t, [t], 0)
    assert maps <= planned and maps >= 0.9 * planned  # output-only slots are cells at the scored position only
