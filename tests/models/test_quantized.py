"""Grafting quantized models (bitsandbytes nf4 / fp4 / int8, torchao int8 weight-only): PRE and
SFT saved and loaded back quantized by transformers, as users load them; the one-pass grafted
forward equals the per-token definition run on the same quantized modules (each token through
its own model's quantized module, fused q/k/v split by output columns included), on a
right-padded batch.

Tolerance: the two sides run the same quantized kernels on the same inputs, in different
row groupings (the engine: all rows of a model at once; the reference: one token at a time),
so they differ by float rounding only: float32, 2-layer tiny models, |logits| up to ~10,
measured worst 5.2e-6 (Gemma 3, torchao int8). TOL = 2e-5 * max(1, |logits|) leaves >10x of room and sits four
orders below any quantization effect (PRE quantized vs float moves logits by 0.1-1; a
reference that copies packed weights without their scales was off by 0.57).
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
from tiny_models import make_donor, make_tiny

import weightgraft.models.quantization as q
from weightgraft.engine.forward import graft_forward, slots
from weightgraft.engine.reference import per_token_forward, per_token_mixed_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentTypeError, WeightgraftError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None or importlib.util.find_spec("torchao") is None,
    reason="needs the quant extra: pip install 'weightgraft[quant]'",
)
REL_TOL = 2e-5
ARCHS = ["llama", "gemma3_text", "qwen2", "gpt2"]
SCHEMES = ["nf4", "int8", "torchao-int8"]
LENGTHS = [7, 5, 3]  # right padding, prompts of different lengths


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``saved(arch)``: a tiny PRE and an SFT near it saved as model directories (cached)."""
    cache = {}

    def build(arch: str):
        if arch not in cache:
            root = tmp_path_factory.mktemp(f"q_{arch}")
            base = make_tiny(arch, seed=0)
            for role, model in (("pre", base), ("sft", make_donor(base, seed=1))):
                model.save_pretrained(root / role)
            cache[arch] = (root / "pre", root / "sft")
        return cache[arch]

    return build


def _load(paths, scheme: str) -> list[torch.nn.Module]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [q.load_quantized(p, scheme) for p in paths]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 64, (len(LENGTHS), max(LENGTHS)), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(ids)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
    return ids.masked_fill(mask == 0, 0), mask


def _maps(names: list[str], batch: int, seq: int) -> dict[str, torch.Tensor]:
    """Several rules as source maps: a position window, components by name, every other slot
    (splits GPT-2's fused c_attn: q and v from SFT, k from PRE), and a last-token graft."""
    S = len(names)
    window = torch.zeros(batch, seq, S, dtype=torch.long)
    window[:, 1:3] = 1
    comps = torch.zeros(batch, seq, S, dtype=torch.long)
    for s, n in enumerate(names):
        if n.endswith((".q", ".v", ".down")) or n == "layers.1.up":
            comps[:, 2:, s] = 1
    every_other = torch.zeros(batch, seq, S, dtype=torch.long)
    every_other[:, :, ::2] = 1
    every_other[:, 0] = 0
    last = torch.zeros(batch, seq, S, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        last[b, n - 1] = 1
    return {"window": window, "components": comps, "every_other": every_other, "last": last}


def _worst(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    real = mask.bool()
    return (a[real] - b[real]).abs().max().item(), b[real].abs().max().item()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_graft_equals_per_token_definition(saved, arch, scheme):
    if (arch, scheme) == ("gpt2", "torchao-int8"):  # torchao converts nn.Linear only: Conv1D would stay float
        with pytest.raises(q.QuantizationError, match="no module would be quantized.*Conv1D"):
            _load(saved(arch), scheme)
        return
    models = _load(saved(arch), scheme)
    assert q.quantized_modules(models[0]), f"{arch} loaded in {scheme} has no quantized module"
    ids, mask = _batch()
    names = slots(models[0])
    with torch.no_grad():
        plain = models[0](input_ids=ids, attention_mask=mask).logits
        for rule, source in _maps(names, *ids.shape).items():
            fast = graft_forward(models, ids, source, attention_mask=mask)
            ref = per_token_forward(models, ids, source, attention_mask=mask)
            diff, scale = _worst(fast, ref, mask)
            print(f"{arch} {scheme} {rule}: max |engine - reference| {diff:.2e} (logit scale {scale:.2f})")
            assert diff <= REL_TOL * max(1.0, scale), rule
            assert _worst(ref, plain, mask)[0] > 1e-2, rule  # the graft moved the logits
        # q by head (output columns of each model's quantized q), SFT as the base
        source = torch.zeros(*ids.shape, len(names), dtype=torch.long)
        heads = {"layers.0.q": torch.randint(0, 2, (*ids.shape, 4), generator=torch.Generator().manual_seed(1))}
        fast = graft_forward(models[::-1], ids, source, attention_mask=mask, head_source=heads)
        ref = per_token_forward(models[::-1], ids, SourceMap(source, heads), attention_mask=mask)
        diff, scale = _worst(fast, ref, mask)
        print(f"{arch} {scheme} q by head: {diff:.2e}")
        assert diff <= REL_TOL * max(1.0, scale)


def test_fp4_graft_equals_per_token_definition(saved):
    models = _load(saved("llama"), "fp4")
    ids, mask = _batch()
    source = _maps(slots(models[0]), *ids.shape)["every_other"]
    with torch.no_grad():
        diff, scale = _worst(graft_forward(models, ids, source, attention_mask=mask),
                             per_token_forward(models, ids, source, attention_mask=mask), mask)
    assert diff <= REL_TOL * max(1.0, scale)


def test_input_side_units_and_mixing_on_quantized_refused_in_one_line(saved):
    """Per-head o needs o's input columns, mixing needs the weights' entries: neither exists in
    a packed layout, so both are refused (engine and reference alike), never computed wrong."""
    models = _load(saved("llama"), "nf4")
    ids, mask = _batch()
    source = torch.zeros(*ids.shape, len(slots(models[0])), dtype=torch.long)
    heads = {"layers.0.o": torch.randint(0, 2, (*ids.shape, 4), generator=torch.Generator().manual_seed(2))}
    for run in (graft_forward, per_token_forward):
        with pytest.raises(WeightgraftError) as err:
            run(models, ids, SourceMap(source, heads), attention_mask=mask)
        assert "\n" not in str(err.value) and "quantized" in str(err.value), str(err.value)
    with pytest.raises(GraftArgumentTypeError, match="quantized"):
        per_token_mixed_forward(models, ids, torch.full((*ids.shape, source.shape[-1]), 0.5), mask)


def test_schemes_refused_in_one_line(monkeypatch):
    with pytest.raises(q.QuantizationError, match="unknown quantization 'int3'"):
        q.quantization_config("int3")
    with pytest.raises(q.QuantizationError, match="torchao-int4 is refused: .*mslk"):
        q.quantization_config("torchao-int4")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(q.QuantizationError, match=r"needs bitsandbytes: pip install 'weightgraft\[quant\]'"):
        q.quantization_config("nf4")
    assert type(q.quantization_config("torchao-int8")).__name__ == "TorchAoConfig"


def test_a_scheme_that_quantizes_nothing_is_refused_before_and_after_loading(saved, monkeypatch):
    """GPT-2 in torchao-int8 (its projections are Conv1D, torchao converts nn.Linear only) is
    refused from its config before any weight loads, by the check, the plan and load_model; a
    custom config (not planned) is refused once a load leaves no module quantized."""
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    from weightgraft.models import load_model
    from weightgraft.models.spec import parse_spec, quantized

    pre = saved("gpt2")[0]
    loads = []
    real = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a) or real(cls, *a, **k)))
    for spec in (f"quantized({pre}, torchao-int8)", "quantized(random:gpt2-xl, torchao-int8)"):
        for attempt in (lambda s: parse_spec(s).check(), lambda s: parse_spec(s).footprint(), load_model):
            with pytest.raises(q.QuantizationError, match="no module would be quantized.*Conv1D.*nf4, fp4 or int8") as err:
                attempt(spec)
            assert "\n" not in str(err.value) and spec in str(err.value)
    assert loads == []  # refused from the config alone
    parse_spec(f"quantized({pre}, nf4)").check()  # bitsandbytes converts Conv1D
    custom = TorchAoConfig(Int8WeightOnlyConfig())
    for spec in (quantized(str(pre), custom), quantized(f"random:{pre}/config.json", custom)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(q.QuantizationError, match="no module would be quantized.*Conv1D") as err:
                load_model(spec)
        assert "\n" not in str(err.value)
    assert len(loads) == 2  # each loaded, then refused
