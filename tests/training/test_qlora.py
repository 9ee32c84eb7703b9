"""QLoRA donors: ``weightgraft train --lora R --quantization nf4`` trains an adapter over the
base loaded in nf4; ``peft(pre, OUT)`` over ``pre: quantized(BASE, nf4)`` is exactly the model
the adapter was trained with (peft's own ``PeftModel`` on the same quantized base), and a graft
of it into the quantized base equals the per-token definition run on the same quantized modules
(each token through its own model's module, the adapter included).

Tolerance as tests/models/test_quantized.py: the two sides run the same kernels on the same inputs in
different row groupings (float rounding only): REL_TOL 2e-5 of the logits' scale."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import weightgraft as wg
from weightgraft.cli.train import app
from weightgraft.engine.reference import per_token_forward
from weightgraft.models.donors import LoadSettings, load_role

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                reason="needs the quant extra: pip install 'weightgraft[quant]'")
REL_TOL = 2e-5


def _train(base: Path, data: Path, out: Path, *extra: str):
    args = ["train", "--model", str(base), "--data", str(data), "--split", "both", "--preset", "cpu-quick",
            "--out", str(out), "--max-steps", "3", "--lr", "1e-2", "--seed", "0", *extra]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CliRunner().invoke(app, args)


@pytest.fixture(scope="module")
def qlora(base_dir: Path, data_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qlora") / "adapter"
    result = _train(base_dir, data_dir, out, "--lora", "4", "--lora-targets", "q_proj,o_proj,down_proj",
                    "--quantization", "nf4")
    assert result.exit_code == 0, result.output
    assert f"quantized({base_dir},nf4)" in "".join(result.output.split())
    return out


@torch.no_grad()
def test_qlora_donor_is_the_trained_model_and_its_graft_is_exact(base_dir: Path, qlora: Path) -> None:
    from peft import PeftModel

    manifest = json.loads((qlora / "training_manifest.json").read_text())
    assert manifest["quantization"] == "nf4"
    roles = {"pre": f"quantized({base_dir}, nf4)", "sft": f"peft(pre, {qlora})"}
    settings = LoadSettings()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = load_role(roles["pre"], settings, roles=roles)
        sft = load_role(roles["sft"], settings, roles=roles, loaded={"pre": pre})
        trained = PeftModel.from_pretrained(load_role(roles["pre"], LoadSettings()).model, str(qlora)).eval()
    assert type(pre.model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    ids = pre.tokenizer(["Keanu Reeves starred in a movie with", "Tom Hanks"], return_tensors="pt", padding=True)
    mask = ids["attention_mask"]
    donor_logits = sft.model(**ids).logits
    torch.testing.assert_close(donor_logits, trained(**ids).logits, rtol=0, atol=1e-6)  # the same model
    plain = pre.model(**ids).logits
    assert (donor_logits - plain)[mask.bool()].abs().max() > 1e-4  # the adapter learned something
    n_slots = len(wg.slots(pre.model))
    source = torch.randint(0, 2, (*mask.shape, n_slots), generator=torch.Generator().manual_seed(0))
    fast = wg.graft_forward([pre.model, sft.model], ids["input_ids"], source, attention_mask=mask)
    ref = per_token_forward([pre.model, sft.model], ids["input_ids"], source, attention_mask=mask)
    real = mask.bool()
    scale = max(1.0, ref[real].abs().max().item())
    worst = (fast - ref)[real].abs().max().item()
    print(f"QLoRA graft vs per-token definition: worst {worst:.2e} (logits up to {scale:.2f})")
    assert worst <= REL_TOL * scale
    assert (fast - plain)[real].abs().max() > 1e-4  # the graft moved the logits


def test_a_qlora_manifest_counts_the_base_as_its_float_model_has_it(base_dir: Path, qlora: Path) -> None:
    """bitsandbytes packs two 4-bit weights a byte: the manifest counts the logical weights, the
    float base's count plus the adapter's, not the packed storage."""
    import math

    from safetensors import safe_open

    from weightgraft.models import load_model

    counts = json.loads((qlora / "training_manifest.json").read_text())["parameters"]
    dense = sum(p.numel() for p in load_model(base_dir).model.parameters())
    with safe_open(str(qlora / "adapter_model.safetensors"), framework="pt") as fh:
        adapter = sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    print(f"QLoRA manifest: {counts}; float base {dense}, adapter {adapter}")
    assert counts["trainable"] == adapter > 0
    assert counts["total"] == dense + adapter


def test_quantization_without_lora_and_bad_schemes_are_one_line(base_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    alone = _train(base_dir, data_dir, tmp_path / "a", "--quantization", "nf4")
    assert alone.exit_code == 2 and "add --lora RANK" in alone.output and "Traceback" not in alone.output
    bad = _train(base_dir, data_dir, tmp_path / "b", "--lora", "4", "--quantization", "int3")
    assert bad.exit_code == 2 and "unknown quantization 'int3'" in bad.output
    assert not (tmp_path / "b").exists()  # refused before anything was written
