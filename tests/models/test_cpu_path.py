"""4-bit layers compute the same on every CPU: bitsandbytes rewrites a ``Linear4bit``'s weight in
place on its first eval forward where the CPU has AVX512-BF16 (bfloat16 block scales, a layout
that cannot run layers narrower than 64 inputs). Every loading path of the product, and a model
the user hands to the engine, keeps its 4-bit layers off that path.

The tests hold on any CPU: bitsandbytes' CPU check is made to answer "AVX512-BF16 here" while
the layers are built (``wants_repack``), so every layer starts out wanting the repack whatever
this machine's CPU is; the product must turn it off before the first forward. On the old code
these tests fail on every machine (the tiny layers cannot be repacked: the forward raises)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

import weightgraft as wg
from weightgraft.engine.precision import one_cpu_path
from weightgraft.errors import GraftArgumentError
from weightgraft.models import load_model
from weightgraft.models.donors import LoadSettings, load_role
from weightgraft.models.hashing import weights_sha256

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                reason="needs the quant extra: pip install 'weightgraft[quant]'")
IDS = torch.tensor([[5, 9, 11, 3, 7, 2], [8, 4, 6, 12, 10, 13]])


@pytest.fixture
def wants_repack(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layers built from here on believe the CPU has AVX512-BF16 (bitsandbytes reads the flag
    once, in ``Linear4bit.__init__``)."""
    import bitsandbytes.nn.modules as modules

    monkeypatch.setattr(modules, "has_avx512bf16", lambda: True)


@pytest.fixture(scope="module")
def saved(tiny_model_dirs: dict[str, Path]) -> tuple[Path, Path]:
    """A tiny Llama pair saved with its tokenizer (4 layers, 32 wide: too narrow to repack)."""
    return tiny_model_dirs["pre"], tiny_model_dirs["sft"]


def _four_bit(model: torch.nn.Module) -> list[torch.nn.Module]:
    import bitsandbytes as bnb

    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def _assert_one_path(model: torch.nn.Module) -> None:
    """No 4-bit layer can take the repack path; a forward leaves the weights' hash alone and
    two forwards of one input give the same bits (the same process and threads: a
    deterministic kernel, so bitwise equality is the property, not a float comparison)."""
    layers = _four_bit(model)
    assert layers, "the model has no 4-bit layer: nothing was tested"
    assert not any(m.support_avx512bf16_for_cpu for m in layers)
    before = weights_sha256(model)
    with torch.no_grad():
        first = model(IDS).logits
        second = model(IDS).logits
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in layers)
    assert weights_sha256(model) == before
    assert torch.equal(first, second)
    assert torch.isfinite(first).all()


@pytest.mark.parametrize("scheme", ["nf4", "fp4"])
def test_load_quantized_keeps_one_path(wants_repack: None, saved: tuple[Path, Path], scheme: str) -> None:
    from weightgraft.models.quantization.load import load_quantized

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_quantized(saved[0], scheme)
    _assert_one_path(model)


def test_wg_load_and_spec_and_random_keep_one_path(wants_repack: None, saved: tuple[Path, Path]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_api, _ = wg.load(saved[0], quantization="nf4")
        loaded = load_model(f"quantized({saved[0]}, nf4)")
        random = load_model(f"quantized(random:{saved[0] / 'config.json'}@3, nf4)")
    for model in (by_api, loaded.model, random.model):
        _assert_one_path(model)
    assert loaded.weights_sha256 == weights_sha256(loaded.model)  # the recorded identity is the model's


def test_qlora_base_keeps_one_path(wants_repack: None, saved: tuple[Path, Path], tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = get_peft_model(AutoModelForCausalLM.from_pretrained(saved[0]), LoraConfig(r=2, target_modules=["q_proj", "down_proj"],
                                                                     init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "adapter")
    roles = {"pre": f"quantized({saved[0]}, nf4)", "sft": f"peft(pre, {tmp_path / 'adapter'})"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre = load_role(roles["pre"], LoadSettings(), roles=roles)
        sft = load_role(roles["sft"], LoadSettings(), roles=roles, loaded={"pre": pre})
    _assert_one_path(sft.model)
    _assert_one_path(pre.model)


def test_a_users_own_model_is_brought_onto_the_path_by_the_engine(wants_repack: None, saved: tuple[Path, Path]) -> None:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = [AutoModelForCausalLM.from_pretrained(str(p), quantization_config=config, dtype=torch.float32,
                                                       device_map="cpu").eval() for p in saved]
    assert all(m.support_avx512bf16_for_cpu for model in models for m in _four_bit(model))  # as the user has it
    source = torch.randint(0, 2, (*IDS.shape, len(wg.slots(models[0]))), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = wg.graft_forward(models, IDS, source)
        second = wg.graft_forward(models, IDS, source)
    assert torch.equal(first, second)
    for model in models:
        _assert_one_path(model)


def test_a_model_already_repacked_is_refused_in_one_line(saved: tuple[Path, Path]) -> None:
    from weightgraft.models.quantization.load import load_quantized

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_quantized(saved[0], "nf4")
    layer = _four_bit(model)[0]
    layer.weight.quant_state.packing_format_for_cpu = True  # what bitsandbytes' repack leaves behind
    with pytest.raises(GraftArgumentError) as err:
        one_cpu_path([model])
    assert "\n" not in str(err.value) and "bfloat16" in str(err.value)
    source = torch.zeros(*IDS.shape, len(wg.slots(model)), dtype=torch.long)
    with pytest.raises(GraftArgumentError):
        wg.graft_forward([model], IDS, source)


_INT8_CHECK = r"""
import sys, warnings, torch
warnings.simplefilter("ignore")
from weightgraft.models.quantization.load import load_quantized
load_quantized(sys.argv[1], "int8")  # the product's path: its int8 layers get the exact kernel
A = torch.full((3, 1536), 127, dtype=torch.int8); A[1] = -127
B = torch.randint(-127, 128, (64, 1536), dtype=torch.int8, generator=torch.Generator().manual_seed(0)); B[0] = 127
exact = A.long() @ B.long().t()
got = torch.ops.bitsandbytes.int8_linear_matmul.default(A, B)
out = torch.empty(3, 64, dtype=torch.int32)
torch.ops.bitsandbytes.int8_linear_matmul.out(A, B, out)
print(int((got.long() - exact).abs().max()), int((out.long() - exact).abs().max()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["", "AVX512_CORE"])
def test_int8_matmuls_are_exact_integers_on_every_cpu(saved: tuple[Path, Path], isa: str) -> None:
    """bitsandbytes' CPU int8 kernel depends on the CPU: oneDNN's ``_int_mm`` where torch reports
    AVX-512, which without AVX512-VNNI (``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` makes any AVX-512 CPU run
    that path: Skylake-SP Xeons have it) saturates its sums; else a float32 matmul. After a load,
    the products of int8 values come out exact (int32 == the integer product), 1536 wide at the
    extremes, whatever the CPU."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"ONEDNN_MAX_CPU_ISA": isa} if isa else {})}
    done = subprocess.run([sys.executable, "-c", _INT8_CHECK, str(saved[0])], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "0"]
