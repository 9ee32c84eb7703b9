"""Expert maps: each picked expert cell equals the per-token definition, a skipped cell is checked
bit for bit (and a coupled bank is refused), and ``weightgraft experts`` writes its tables."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from tiny_models import make_donor, make_tiny, random_ids
from tiny_world import write_world
from typer.testing import CliRunner

import weightgraft as wg
from weightgraft.cli import app
from weightgraft.engine.cells import ScoredExample
from weightgraft.engine.precision import float64_exact
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.expert_maps.cells import SkippedCellMoved, expert_map
from weightgraft.expert_maps.summary import region_of, summarize

TARGET = 5


def _examples() -> list[ScoredExample]:
    return [ScoredExample(tuple(random_ids(1, n, seed=n)[0].tolist()), n - 1, target=TARGET, other_answers=(6, 7))
            for n in (7, 9)]


def _reference_effect(models, example: ScoredExample, bank: str, position: int, expert: int, n_experts: int) -> float:
    ids = torch.tensor([example.input_ids])
    source = torch.zeros(1, ids.shape[1], len(wg.slots(models[0])), dtype=torch.long)
    experts = {bank: torch.zeros(1, ids.shape[1], n_experts, dtype=torch.long)}
    experts[bank][0, position, expert] = 1
    grafted = per_token_forward(list(models), ids, SourceMap(source, experts=experts))[0, -1].double().log_softmax(-1)
    plain = models[0](input_ids=ids).logits[0, -1].double().log_softmax(-1)
    return float(grafted[TARGET] - plain[TARGET])


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "glm4_moe"])
@torch.no_grad()
def test_each_picked_expert_cell_equals_the_per_token_definition(model_type):
    base = make_tiny(model_type, seed=0).double()
    models = [base, make_donor(base, 1)]
    examples = _examples()
    with float64_exact(models):
        frame = expert_map(models, examples, [[2, 6], [0, 8]], pad_id=0, metric="fact_logprob")
        n_experts = int(frame["expert"].max()) + 1
        picked = frame[frame["picked"]]
        worst = max(abs(_reference_effect(models, examples[r.example], r.bank, r.position, r.expert, n_experts) - r.effect_plain)
                    for r in picked.itertuples())
    assert worst < 1e-10
    assert picked["effect_plain"].abs().max() > 1e-3  # the cells move the metric far beyond the tolerance
    top_k = int(picked.groupby(["example", "position", "bank"]).size().iloc[0])
    assert (picked.groupby(["example", "position", "bank"]).size() == top_k).all()  # the router's k, everywhere
    skipped = frame[~frame["picked"]]
    assert len(skipped) and (skipped["effect"] == 0).all() and not skipped["computed"].any()
    assert frame.attrs["skipped_checked"] == min(4, len(skipped))


def test_a_bank_coupled_across_experts_is_refused(monkeypatch):
    """The null of the skipped-cell check: a bank whose output also reads experts it did not pick."""
    base = make_tiny("mixtral", seed=0)
    models = [base, make_donor(base, 1)]
    bank = type(base.model.layers[0].mlp.experts)
    plain = bank.forward

    def coupled(self, hidden_states, top_k_index, top_k_weights):
        return plain(self, hidden_states, top_k_index, top_k_weights) + 0.1 * self.down_proj.mean()

    monkeypatch.setattr(bank, "forward", coupled)
    with pytest.raises(SkippedCellMoved, match="did not pick"):
        expert_map(models, _examples(), [[2], [3]], pad_id=0, check_skipped=20)


def test_regions_and_the_summary_count_unpicked_cells_as_zero():
    assert [region_of(x) for x in ("first_entity", "first_entity_last", "first_entity_last-1", "last", "tok0",
                                   "relation")] == ["first_entity", "first_entity", "first_entity", "last", None, None]
    cells = pd.DataFrame({"model": "sft", "template": "t", "region": "last", "layer": 0, "expert": 1,
                          "example_id": ["a", "b", "c", "d"], "effect": [1.0, 0.0, 2.0, 1.0],
                          "effect_plain": [1.0, 0.0, 2.0, 1.0], "picked": [True, False, True, True]})
    row = summarize(cells).iloc[0]
    assert row["n_prompts"] == 4 and row["pick_rate"] == pytest.approx(0.75)
    assert row["effect"] == pytest.approx(1.0) and row["ci_low"] < 1.0 < row["ci_high"]


def test_the_command_writes_the_map_with_the_control_beside_it(experts_out):
    out = experts_out
    top = pd.read_csv(out / "top_cells.csv")
    assert {"effect[control]", "ci_low[control]"} <= set(top.columns)
    assert set(top["region"]) == {"first_entity", "last"} and set(top["template"]) == {"headline", "qa"}
    regions = pd.read_csv(out / "regions.csv")
    assert set(regions["graft"]) == {"experts", "router", "moe", "all"} and set(regions["model"]) == {"sft", "control"}
    assert set(regions["direction"]) == {"sufficiency", "necessity"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_prompts"] == {"headline": 6, "qa": 6} and manifest["models"]["sft"]["weights_sha256"]
    cells = pd.read_parquet(out / "expert_cells.parquet")
    assert cells.loc[~cells["picked"], "effect"].eq(0).all()


def test_a_dense_base_is_refused_in_one_line_before_loading(tmp_path, tiny_model_dirs):
    data = write_world(tmp_path / "data")
    result = CliRunner().invoke(app, ["experts", "--pre", str(tiny_model_dirs["pre"]), "--sft",
                                      str(tiny_model_dirs["sft"]), "--data", str(data), "--template", "headline"])
    assert result.exit_code != 0
    assert "has no expert bank" in str(result.exception)


@torch.no_grad()
def test_an_upcycled_bases_router_moves_nothing_until_the_experts_differ():
    """In an upcycled PRE every expert is one MLP: its routing is no function of its router, so the
    finetune's router grafted into it moves nothing (float32 rounding of the renormalised weights),
    while PRE's router grafted into the finetune, whose experts differ, moves the answer."""
    from types import SimpleNamespace

    from weightgraft.expert_maps.run import region_grafts
    from weightgraft.training.upcycle import Upcycling, upcycle

    pre = upcycle(make_tiny("llama", seed=0).double(), Upcycling(experts=4, top_k=2))
    pre.set_experts_implementation("eager")
    sft = make_donor(pre, 1)
    examples = [SimpleNamespace(scored=ex, labels=tuple(["first_entity"] * 2 + ["tok"] * (ex.position - 2) + ["last"]),
                                prompt=SimpleNamespace(id=f"p{i}", template="t"))
                for i, ex in enumerate(_examples())]
    into_pre = region_grafts([pre, sft], examples, pad_id=0, metric="first_logprob").set_index(["example_id", "region", "graft"])
    into_sft = region_grafts([sft, pre], examples, pad_id=0, metric="first_logprob").set_index(["example_id", "region", "graft"])
    routers = [(e.prompt.id, r, "router") for e in examples for r in ("first_entity", "last")]
    assert into_pre.loc[routers, "effect"].abs().max() < 1e-5
    assert into_sft.loc[routers, "effect"].abs().max() > 1e-3
