"""``weightgraft train --lora RANK``: the Trainer trains a peft LoRA adapter and OUT is its
adapter directory, a donor at once (``peft(pre, OUT)``), equal to the merged model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from typer.testing import CliRunner

import weightgraft as wg
from weightgraft.cli.train import app
from weightgraft.models import load_model
from weightgraft.models.peft_donor import check_adapter_dir, load_peft


def _train(base: Path, data: Path, out: Path, *extra: str):
    args = ["train", "--model", str(base), "--data", str(data), "--split", "both", "--preset", "cpu-quick",
            "--out", str(out), "--max-steps", "3", "--lr", "1e-2", "--seed", "0", *extra]
    return CliRunner().invoke(app, args)


def test_lora_adapter_is_a_donor_equal_to_the_merged_model(base_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    result = _train(base_dir, data_dir, out, "--lora", "4", "--lora-targets", "o_proj,down_proj")
    assert result.exit_code == 0, result.output
    assert "a LoRA adapter: use it as peft(pre," in " ".join(result.output.split())
    cfg = check_adapter_dir(out)
    assert cfg["r"] == 4 and sorted(cfg["target_modules"]) == ["down_proj", "o_proj"]
    assert not (out / "model.safetensors").exists()  # the adapter only, not a full model
    manifest = json.loads((out / "training_manifest.json").read_text())
    assert manifest["lora"]["rank"] == 4 and manifest["parameters"]["trainable"] < manifest["parameters"]["total"]
    pre = load_model(base_dir, dtype=torch.float64)
    donor = load_peft(pre.model, out)
    prompts = ["Keanu Reeves starred in a movie with", "Tom Hanks"]
    everything = wg.Rule(model="sft", positions="all", components="all")
    grafted = wg.graft({"pre": pre.model, "sft": donor}, pre.tokenizer, prompts, everything).logits
    from peft import PeftModel

    merged = PeftModel.from_pretrained(copy.deepcopy(pre.model), str(out)).merge_and_unload()
    alone = wg.graft({"pre": merged}, pre.tokenizer, prompts, []).logits
    torch.testing.assert_close(grafted, alone, rtol=0, atol=1e-10)
    plain = wg.graft({"pre": pre.model}, pre.tokenizer, prompts, []).logits
    assert (plain - alone).abs().max() > 1e-4  # the adapter learned something
    only_o = wg.graft({"pre": pre.model, "sft": donor}, pre.tokenizer, prompts,
                      wg.Rule(model="sft", positions="all", components="q+k+v+gate+up")).logits
    torch.testing.assert_close(only_o, plain, rtol=0, atol=1e-12)  # it adapted o and down only


def test_lora_flags_are_refused_in_one_line(base_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    alone = _train(base_dir, data_dir, tmp_path / "a", "--lora-targets", "o_proj")
    assert alone.exit_code == 2 and "--lora-targets needs --lora RANK" in alone.output
    bad = _train(base_dir, data_dir, tmp_path / "b", "--lora", "4", "--lora-targets", "o_prj")
    assert bad.exit_code == 2 and "o_prj" in bad.output and "Traceback" not in bad.output


class _Stop(Exception):
    pass


def test_demo_lora_trains_an_adapter_and_grafts_it_as_peft(tmp_path: Path, monkeypatch) -> None:
    """The wiring of ``weightgraft demo --lora 8``: an adapter of that rank, cached apart from
    the full finetune, named ``peft(pre, ADAPTER)`` in the sweep, in its own run directory."""
    import weightgraft.data
    import weightgraft.experiments.runner
    import weightgraft.models
    import weightgraft.training
    from weightgraft.demo import demo_out, run_demo

    seen: dict = {}
    monkeypatch.setattr(weightgraft.models, "ensure_converted", lambda name: None)
    monkeypatch.setattr(weightgraft.training, "finetune", lambda *a, **k: seen.update(train=k))

    def stop(config, **kwargs):
        seen["config"] = config
        raise _Stop

    monkeypatch.setattr(weightgraft.experiments.runner, "run_experiment", stop)
    for lora in (None, 8):
        try:
            run_demo(out=tmp_path / f"demo-{lora}", n_relations=4, lora=lora)
        except _Stop:
            pass
        seen[lora] = (seen.pop("train"), seen.pop("config"))
    (full_train, full_config), (lora_train, lora_config) = seen[None], seen[8]
    assert full_train["lora"] is None and lora_train["lora"].rank == 8
    assert lora_train["out"] != full_train["out"] and lora_train["out"].name.startswith("lora-")
    assert full_config.models["sft"] == str(full_train["out"])
    assert lora_config.models["sft"] == f"peft(pre, {lora_train['out']})"
    assert str(demo_out("smollm2-135m", 8)) == "runs/demo-lora" and str(demo_out("smollm2-135m")) == "runs/demo"
