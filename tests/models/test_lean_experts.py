"""A lean donor per expert: where a run grafts some experts of a bank, the donor holds those
experts' slices alone, equals the whole donor bit for bit on them, hashes as the whole donor, and
refuses in one line to serve an expert it does not hold."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import MOE_CONFIGS, make_donor, make_tiny, random_ids
from tiny_world import tokenizer, write_world

import weightgraft as wg
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.moe import held_experts
from weightgraft.engine.reference import per_token_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.plan import plan_experiment
from weightgraft.experiments.runner import run_experiment
from weightgraft.models.hashing import weights_sha256
from weightgraft.models.lean import bank_experts, lean_from_safetensors, memory_report, needed_parameters

HELD = (1, 3)


def _maps(base: torch.nn.Module, shape: tuple[int, int], experts: tuple[int, ...]) -> dict[str, torch.Tensor]:
    out = {}
    for slot in model_slots(base):
        if slot.experts:
            m = torch.zeros(*shape, slot.experts, dtype=torch.long)
            m[:, shape[1] // 2:, list(experts)] = 1
            out[slot.name] = m
    return out


@pytest.mark.parametrize("model_type", sorted(MOE_CONFIGS))
@pytest.mark.parametrize("implementation", ["eager", "grouped_mm"])
@torch.no_grad()
def test_a_donor_holding_some_experts_equals_the_whole_donor_bit_for_bit(model_type, implementation, tmp_path):
    base = make_tiny(model_type, seed=0)
    base.set_experts_implementation(implementation)
    donor = make_donor(base, 1)
    donor.save_pretrained(tmp_path / "donor")
    banks = [s.name for s in model_slots(base) if s.experts]
    held = bank_experts(base, {b: HELD for b in banks})
    lean, digest = lean_from_safetensors(base, tmp_path / "donor", needed_parameters(base, banks), held)
    assert digest == weights_sha256(donor)
    assert all(held_experts(lean.get_submodule(path)) == HELD for path in held)
    whole_bank = sum(p.numel() for b in held for p in base.get_submodule(b).parameters())
    n_experts = next(s.experts for s in model_slots(base) if s.experts)
    # the held experts and one zero expert, not the bank
    assert memory_report(lean, base).bytes_held <= whole_bank * 4 * (len(HELD) + 1) / n_experts
    ids = random_ids(3, 9)
    source = torch.zeros(*ids.shape, len(wg.slots(base)), dtype=torch.long)
    maps = _maps(base, tuple(ids.shape), HELD)
    got = wg.graft_forward([base, lean], ids, source, expert_source=maps)
    assert torch.equal(got, wg.graft_forward([base, donor], ids, source, expert_source=maps))
    assert (got - base(input_ids=ids).logits).abs().max().item() > 1e-3
    with pytest.raises(GraftArgumentError, match="holds experts"):  # an expert it does not hold: refused
        wg.graft_forward([base, lean], ids, source, expert_source=_maps(base, tuple(ids.shape), (0, 1)))
    with pytest.raises(GraftArgumentError, match="load that donor whole"):
        per_token_forward([base, lean], ids, SourceMap(source, experts=maps))


def test_a_run_grafting_two_experts_holds_two_and_gives_the_whole_donors_rows(tmp_path):
    tok = tokenizer()
    base = make_tiny("mixtral", seed=0, vocab_size=len(tok))
    for role, model in (("pre", base), ("sft", make_donor(base, 1))):
        model.save_pretrained(tmp_path / role)
        tok.save_pretrained(tmp_path / role)
    data = write_world(tmp_path / "data")
    rows, held = {}, {}
    for lean in (True, False):
        config = parse_config({
            "name": "experts", "data": str(data), "models": {"pre": str(tmp_path / "pre"), "sft": str(tmp_path / "sft")},
            "schemes": [{"name": "two_experts", "rules": [{"model": "sft", "positions": "last", "components": "experts",
                                                          "experts": "1,3"}]}],
            "templates": ["headline"], "lean_donors": lean, "out": str(tmp_path / f"run-{lean}")})
        result = run_experiment(config)
        rows[lean] = pd.read_parquet(result.run_dir / "results.parquet").sort_values(["example_id", "scheme"])
        held[lean] = json.loads((result.run_dir / "manifest.json").read_text())["models"]["default"]["sft"]["bytes_held"]
        if lean:  # the plan prices what the run holds, from the configs alone
            plan = plan_experiment(config, with_time=False)
            (sft,) = [r for r in plan.roles if r.role == "sft"]
            assert sft.held_bytes == held[True] and "experts of 2 banks" in sft.holds
    banks = [base.get_submodule(s.parts[0].path) for s in model_slots(base) if s.experts]
    bank_bytes = sum(p.numel() * p.element_size() for b in banks for p in b.parameters())
    assert held[True] == bank_bytes * 3 // 4  # experts 1 and 3 and the zero expert of 4: nothing else
    cols = ["first_logprob", "fact_logprob", "rank", "top5"]
    assert np.array_equal(rows[True][cols].to_numpy(), rows[False][cols].to_numpy())  # bit for bit
