"""Lean donors: only grafted tensors are held (read lazily from safetensors), the rest shared
with the base, and the numbers do not change."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch
import transformers as T
from tiny_models import TINY_CONFIGS, make_donor, make_tiny
from tiny_world import write_world

import weightgraft as wg
from weightgraft.engine.compat import ModelMismatchError
from weightgraft.experiments.config import parse_config
from weightgraft.experiments.runner import run_experiment
from weightgraft.models import load_model
from weightgraft.models.lean import donor_view, lean_from_safetensors, memory_report, needed_parameters


def _save(model, path):
    model.save_pretrained(path)
    return path


def _late_slots(model, comps=("o", "gate", "up", "down")):
    n = model.config.get_text_config(decoder=True).num_hidden_layers
    return {f"layers.{n - 1}.{c}" for c in comps}


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_lean_donor_holds_only_grafted_tensors_and_grafts_identically(tmp_path, arch):
    base = make_tiny(arch, seed=0)
    donor = make_donor(base, 1)
    directory = _save(donor, tmp_path / "sft")
    wanted = (_late_slots(base, ("o", "up", "down")) | {"final_norm"}) & set(wg.slots(base))
    needed = needed_parameters(base, wanted)
    view, digest = lean_from_safetensors(base, directory, needed)

    assert digest == wg.models.weights_sha256(donor)  # the hash of the donor, not of the view
    report = memory_report(view, base)
    assert report.tensors_held == len(needed)
    assert report.bytes_held == sum(p.numel() * 4 for n, p in donor.named_parameters() if n in needed)
    assert report.bytes_held < memory_report(donor, base).bytes_held / 3

    names = wg.slots(base)
    ids = torch.randint(0, base.config.get_text_config(decoder=True).vocab_size, (2, 7))
    source = torch.zeros(2, 7, len(names), dtype=torch.long)
    for s in wanted:
        source[:, 4:, names.index(s)] = 1
    with torch.no_grad():
        lean = wg.graft_forward([base, view], ids, source)
        full = wg.graft_forward([base, donor], ids, source)
    assert torch.equal(lean, full)


def test_identical_tensors_are_shared_and_tied_embed_keeps_base_unembedding(tmp_path):
    base = make_tiny("gemma", seed=0)  # tied embeddings
    assert base.get_input_embeddings().weight is base.get_output_embeddings().weight
    donor = make_donor(base, 1)
    with torch.no_grad():  # a donor that differs from the base in the embedding and one norm only
        for (name, p), (_, q) in zip(donor.named_parameters(), base.named_parameters()):
            if "embed" not in name and "layers.1.input_layernorm" not in name:
                p.copy_(q)
    directory = _save(donor, tmp_path / "sft")
    all_but_unembed = [s for s in wg.slots(base) if s != "unembed"]
    view, _ = lean_from_safetensors(base, directory, needed_parameters(base, all_but_unembed))
    report = memory_report(view, base)
    assert report.tensors_held == 2  # the embedding and that norm; all else shared
    assert view.get_output_embeddings().weight is base.get_output_embeddings().weight
    assert torch.equal(view.get_input_embeddings().weight, donor.get_input_embeddings().weight)
    everything, _ = lean_from_safetensors(base, directory, needed_parameters(base, wg.slots(base)))
    assert memory_report(everything, base).tensors_held == 2  # the tied pair is one tensor
    assert everything.get_output_embeddings().weight is everything.get_input_embeddings().weight


def test_mismatching_donor_is_refused_naming_the_tensor(tmp_path):
    base = make_tiny("llama", seed=0)
    config = copy.deepcopy(TINY_CONFIGS["llama"])
    config.intermediate_size += 8
    other = T.AutoModelForCausalLM.from_config(config)
    directory = _save(other, tmp_path / "other")
    with pytest.raises(ModelMismatchError, match="mlp.*shape"):
        lean_from_safetensors(base, directory, needed_parameters(base, {"layers.0.up"}))
    with pytest.raises(ModelMismatchError, match="shape"):
        donor_view(base, {"model.layers.0.mlp.up_proj.weight": other.model.layers[0].mlp.up_proj.weight})


def test_run_with_lean_donors_equals_full_donors_and_reports_memory(tmp_path, world_model_dirs):
    data = write_world(tmp_path / "data")
    schemes = [
        {"name": "O+FFN@last", "rules": [{"model": "sft", "positions": "last", "layers": "-1", "components": "o+ffn"}]},
        {"name": "attn@FE", "rules": [{"model": "sft", "positions": "first_actor", "layers": "0", "components": "attn"}]},
    ]

    def run(lean: bool):
        raw = {"name": "lean", "data": str(data), "schemes": schemes, "lean_donors": lean,
               "models": world_model_dirs,
               "out": str(tmp_path / f"run-{lean}"), "report": False}
        return run_experiment(parse_config(raw), progress=False)

    lean, full = run(True), run(False)
    cols = ["scheme", "example_id", "rank", "prob", "answer_logprob"]
    pd.testing.assert_frame_equal(lean.results[cols], full.results[cols])
    info = json.loads((tmp_path / "run-True" / "manifest.json").read_text())["models"]["default"]
    sft_full = load_model(world_model_dirs["sft"])
    assert info["sft"]["weights_sha256"] == sft_full.weights_sha256
    assert 0 < info["sft"]["bytes_held"] < info["pre"]["bytes_held"]
    full_info = json.loads((tmp_path / "run-False" / "manifest.json").read_text())["models"]["default"]
    assert full_info["sft"]["bytes_held"] == full_info["pre"]["bytes_held"]


def test_names_that_do_not_map_fall_back_to_a_full_load(tmp_path):
    from safetensors.torch import load_file, save_file

    base = make_tiny("llama", seed=0)
    directory = _save(make_donor(base, 1), tmp_path / "sft")
    tensors = load_file(directory / "model.safetensors")
    tensors["renamed.norm.weight"] = tensors.pop("model.norm.weight")
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    assert lean_from_safetensors(base, directory, needed_parameters(base, {"layers.0.up"})) is None
