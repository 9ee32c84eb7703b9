"""What a model costs, from its footprint alone: parameter bytes (whole, a lean donor's tensors,
a LoRA adapter, quantized weights at their scheme's bytes), activation / KV bytes of a batch,
the graft deltas of attribution, and FLOPs per token.

A footprint (``weightgraft.models.footprint``) says what a model is: its module tree on the
``meta`` device and which weights a quantized role stores quantized. These functions price it.
A spec says how a role holds its model (:class:`~weightgraft.models.spec.Holding`); what that
holding costs is :func:`holding_bytes`.

Quantized weights are counted at their scheme's bytes (:func:`quantized_weight_bytes`, equal to
the byte to loaded models in tests/planning/test_plan_quantized.py). The activation estimates
are upper-bound style sums of the tensors one layer holds at once (inference) or that autograd
keeps for the backward pass (attribution); they are checked against measured memory in
tests/planning/test_plan.py (within a factor stated there).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weightgraft.models.footprint import ModelFootprint
from weightgraft.models.spec import Holding

__all__ = ["SCHEME_LAYOUT", "adapter_bytes", "attribution_bytes", "cache_bytes", "delta_bytes", "dtype_bytes",
           "forward_flops", "holding_bytes", "inference_bytes", "lean_bytes", "param_bytes", "quantized_parts", "quantized_weight_bytes"]

_DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}

BNB_BLOCK, BNB_NESTED_BLOCK = 64, 256  # bitsandbytes 4-bit blocksize (transformers' default), its nested one
# How each scheme stores a weight, in words (the plan's arithmetic says it)
SCHEME_LAYOUT = {"nf4": "4-bit + a float32 scale per 64", "fp4": "4-bit + a float32 scale per 64",
                 "int8": "int8 + a float32 scale per row", "torchao-int8": "int8 + a float32 scale and int8 zero per row"}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (a torch dtype or its name)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def quantized_weight_bytes(scheme: str, out_features: int, in_features: int, double_quant: bool = False) -> int:
    """Bytes one linear weight of ``out_features`` x ``in_features`` (n = out x in weights) takes
    stored by ``scheme``, as transformers' quantizers leave it in memory:

    - ``nf4`` / ``fp4`` (bitsandbytes ``Linear4bit``): ceil(n / 2) bytes of packed 4-bit codes, one
      float32 absmax per block of 64 weights (4 ceil(n / 64)) and the 4-bit type's 16-entry
      float32 table (64 bytes): 0.5625 bytes a weight. With double quantization
      (``bnb_4bit_use_double_quant``, off in ``quantization.load.quantization_config``) the
      absmax is one uint8 per block plus, per 256 blocks, one float32, with a 256-entry float32
      table and a float32 offset: about 0.5159 bytes a weight.
    - ``int8`` (bitsandbytes ``Linear8bitLt``): n int8 bytes + one float32 scale per output row (``SCB``).
    - ``torchao-int8`` (torchao ``Int8Tensor``, weight-only): n int8 bytes + per output row a float32
      scale and an int8 zero point (5 bytes), whatever the compute dtype.

    Biases, norms, embeddings and the modules transformers keeps unquantized stay in the compute
    dtype (:func:`param_bytes`). On a CPU with AVX512-BF16, bitsandbytes repacks a 4-bit weight at
    its first eval forward with a bfloat16 absmax (0.53125 bytes a weight): this is then an upper
    bound."""
    n = out_features * in_features
    if scheme in ("nf4", "fp4"):
        blocks = -(-n // BNB_BLOCK)
        if double_quant:
            scales = blocks + 4 * -(-blocks // BNB_NESTED_BLOCK) + 4 * BNB_NESTED_BLOCK + 4
        else:
            scales = 4 * blocks
        return -(-n // 2) + scales + 4 * 16
    if scheme == "int8":
        return n + 4 * out_features
    if scheme == "torchao-int8":
        return n + 5 * out_features
    raise ValueError(f"no byte formula for quantization {scheme!r}")


def _quantized_weights(fp: ModelFootprint) -> dict[int, int]:
    """id of a quantized weight on the meta model -> its bytes (:func:`quantized_weight_bytes`)."""
    q = fp.quantization
    if q is None:
        return {}
    return {id(fp.meta.get_submodule(path).weight): quantized_weight_bytes(q.scheme, o, i, q.double_quant)
            for path, (o, i) in fp.quantized_shapes.items()}


def param_bytes(fp: ModelFootprint, dtype: Any, quantized: bool = True) -> int:
    """Bytes of the whole model's parameters and buffers in ``dtype``; a quantized role's
    quantized weights at their scheme's bytes (``quantized=False``: as read, dense)."""
    size = dtype_bytes(dtype)
    buffers = sum(b.numel() * b.element_size() for b in fp.meta.buffers())
    if not quantized or fp.quantization is None:
        return fp.n_params * size + buffers
    packed = _quantized_weights(fp)
    return sum(packed.get(id(p), p.numel() * size) for p in fp.meta.parameters()) + buffers


def quantized_parts(fp: ModelFootprint, dtype: Any) -> tuple[int, int, int, int]:
    """(quantized weights, their bytes, other parameters, their bytes and the buffers'): the two
    terms of :func:`param_bytes` of a quantized role."""
    n_q = sum(o * i for o, i in fp.quantized_shapes.values())
    q_bytes = sum(_quantized_weights(fp).values())
    return n_q, q_bytes, fp.n_params - n_q, param_bytes(fp, dtype) - q_bytes


def lean_bytes(fp: ModelFootprint, slots: set[str] | frozenset[str], dtype: Any,
               experts: Mapping[str, frozenset[int]] | None = None) -> int:
    """Bytes a lean donor holds when it serves ``slots``: each needed tensor once (tied names
    share one), an upper bound, since tensors equal to the base's are shared at load time. A bank
    of ``experts`` (slot -> experts served) holds those experts and one zero expert
    (``engine.moe.hold_experts``), not the bank."""
    params = dict(fp.meta.named_parameters(remove_duplicate=False))
    size = dtype_bytes(dtype)
    packed = _quantized_weights(fp)
    unique: dict[int, int] = {}
    for s in slots:
        banks = {slot.name: slot.experts for slot in _banks(fp)}
        share = (len((experts or {})[s]) + 1) / banks[s] if s in (experts or {}) and s in banks else 1.0
        for n in fp.slot_parameters[s]:
            unique[id(params[n])] = round(packed.get(id(params[n]), params[n].numel() * size) * share)
    return sum(unique.values())


def _banks(fp: ModelFootprint) -> list[Any]:
    from weightgraft.engine.architectures import model_slots

    return [slot for slot in model_slots(fp.meta) if slot.experts]


def adapter_bytes(directory: str | Path, dtype: Any) -> int:
    """Bytes a LoRA adapter's own tensors take in ``dtype`` (what a LoRA donor holds), read from
    the safetensors header without loading a tensor."""
    from safetensors import safe_open

    from weightgraft.engine import lora

    with safe_open(str(Path(directory).expanduser() / "adapter_model.safetensors"), framework="pt") as fh:
        numel = 0
        for key in fh.keys():
            if lora.canonical_name(key) is None:
                n = 1
                for d in fh.get_slice(key).get_shape():
                    n *= d
                numel += n
    return numel * dtype_bytes(dtype)


def holding_bytes(fp: ModelFootprint, holding: Holding, dtype: Any) -> tuple[int, str]:
    """The bytes a role holds in a run, held as its spec says, and how, in words."""
    if holding.adapter is not None:
        return adapter_bytes(holding.adapter, dtype), holding.how
    if holding.slots is not None:
        some = f"; {sum(len(e) for e in holding.experts.values())} experts of {len(holding.experts)} banks" if holding.experts else ""
        return (lean_bytes(fp, holding.slots, dtype, holding.experts),
                f"{holding.how} ({len(holding.slots)} of {len(fp.slot_names)} slots{some})")
    return param_bytes(fp, dtype), holding.how


def delta_bytes(fp: ModelFootprint, dtype: Any, donor_slots: set[str] | None = None) -> int:
    """Bytes of a ``PartialGraft``'s deltas (localize's attribution): per grafted module, the
    weight difference of a projection (in at least float32), or two float32 copies of any other
    part's tensors (norms, embeddings: ``f(x; Δθ) - f(x; 0)``; of a part naming some tensors of its
    module, a mixer's ``A_log`` or gpt-oss's ``sinks``, those alone). With ``donor_slots`` (a lean
    donor), a projection the donor shares with the base costs nothing."""
    from torch import nn

    from weightgraft.engine import projections
    from weightgraft.engine.architectures import model_slots, part_state

    size = max(dtype_bytes(dtype), 4)
    owners: dict[tuple[str, tuple[str, ...] | None], tuple[Any, set[str]]] = {}
    for slot in model_slots(fp.meta):
        for part in slot.parts:
            owners.setdefault((part.path, part.tensors), (part, set()))[1].add(slot.name)
    total = 0
    for part, slots in owners.values():
        n = sum(t.numel() for _, t in part_state(fp.meta, part) if isinstance(t, nn.Parameter))
        if part.tensors is not None or not projections.is_projection(fp.meta.get_submodule(part.path)):
            total += 2 * n * size
        elif donor_slots is None or slots & donor_slots:
            total += n * size
    return total


def forward_flops(fp: ModelFootprint, tokens: int, seq: int, logit_positions: int) -> float:
    """FLOPs of a forward pass over ``tokens`` token rows of sequences ``seq`` long, with logits
    at ``logit_positions`` positions in all."""
    attention = 4 * fp.layers * seq * fp.heads * fp.head_dim  # QK^T and AV per token
    return float(tokens) * (2 * fp.matmul_params + attention) + 2.0 * logit_positions * fp.vocab * fp.hidden


def inference_bytes(fp: ModelFootprint, rows: int, seq: int, logits_per_row: int, dtype: Any,
                    kv: bool = True) -> dict[str, int]:
    """Activation and KV bytes of one grafted forward batch (rows x seq tokens).

    Per token, one layer holds at once: about 6 hidden-size vectors (residual, norm output,
    attention output, the engine's donor rows and their scatter), q/k/v (k/v repeated to every
    head: 2 more), 4 intermediate-size vectors (gate, up, activation, product, and the engine's
    copy), and the attention scores of its heads (2 copies, softmax). The cache of prefix
    sharing is :func:`cache_bytes`; logits are kept in float32."""
    b = dtype_bytes(dtype)
    tokens = rows * seq
    per_token = 6 * fp.hidden + (3 * fp.heads + 2 * fp.kv_heads) * fp.head_dim + 4 * fp.intermediate
    activations = b * tokens * per_token + b * 2 * rows * fp.heads * seq * seq
    kv_cache = cache_bytes(fp, rows, seq, dtype) if kv else 0
    logits = rows * logits_per_row * fp.vocab * (b + 4 + 4)  # model dtype, float32, softmax
    return {"activations": activations, "kv_cache": kv_cache, "logits": logits}


def cache_bytes(fp: ModelFootprint, rows: int, seq: int, dtype: Any) -> int:
    """Bytes of a batch's cache (prefix sharing's, a pass continued from it): every attention
    layer's keys and values per token; a hybrid's mixer layers hold no keys or values but, per
    row, a conv state (the conv's channels times its kernel width) and a recurrent state (Gated
    DeltaNet: value heads x key dim x value dim; Mamba2: heads x head dim x state size; computed
    in float32, so counted in at least that), neither growing with the prompt. Multi-head latent
    attention caches its keys and values decompressed, per query head (:func:`latent_cache_width`)."""
    from weightgraft.engine.architectures import text_config
    from weightgraft.planning.depth_states import latent_cache_width

    b = dtype_bytes(dtype)
    width = latent_cache_width(text_config(fp.config)) or 2 * fp.kv_heads * fp.head_dim
    keys_values = width * b * rows * seq
    layers = _cache_layers(fp)
    if layers is None:
        return fp.layers * keys_values
    attention, conv, recurrent = layers
    return attention * keys_values + rows * (conv * b + recurrent * max(b, 4))


def _cache_layers(fp: ModelFootprint) -> tuple[int, int, int] | None:
    """A hybrid's attention layers and, over its mixer layers, the elements of one row's conv
    and recurrent states; None for a model without mixers (every layer caches keys and values)."""
    from weightgraft.engine.architectures import model_slots, text_config
    from weightgraft.engine.architectures.adapter import ATTENTION_COMPONENTS
    from weightgraft.engine.source_map import SlotName

    slots = model_slots(fp.meta)
    mixers = {slot.mixer.path: slot.mixer.kind for slot in slots if slot.mixer is not None}
    if not mixers:
        return None
    config = text_config(fp.config)
    delta = (int(getattr(config, "linear_num_value_heads", 0)) * int(getattr(config, "linear_key_head_dim", 0))
             * int(getattr(config, "linear_value_head_dim", 0)))
    recurrent_per_layer = {
        "short_conv": 0,
        "gated_delta_net": delta,
        "olmo_gated_delta_net": delta,
        "next_gated_delta_net": delta,
        "mamba2": int(getattr(config, "mamba_num_heads", 0)) * int(getattr(config, "mamba_head_dim", 0))
        * int(getattr(config, "ssm_state_size", 0)),
        "falcon_mamba2": int(getattr(config, "mamba_n_heads", 0)) * int(getattr(config, "mamba_d_head", 0))
        * int(getattr(config, "mamba_d_state", 0)),
    }
    conv = 0
    for slot in slots:
        if slot.mixer is not None and slot.mixer.component == "mixer_conv":
            weight = fp.meta.get_submodule(slot.parts[0].path).weight  # [channels, 1, kernel]
            conv += int(weight.shape[0]) * int(weight.shape[-1])
    names = [SlotName.parse(slot.name) for slot in slots]
    attention = len({name.layer for name in names if name.layer is not None and name.component in ATTENTION_COMPONENTS})
    return attention, conv, sum(recurrent_per_layer[kind] for kind in mixers.values())


def attribution_bytes(fp: ModelFootprint, rows: int, seq: int, dtype: Any) -> dict[str, int]:
    """Bytes autograd keeps for the backward pass of graft attribution (forward + backward w.r.t.
    every cell's share ``a``), plus ``a`` and its gradient.

    Per token and layer it keeps about 10 hidden-size vectors (inputs of norms and projections,
    residuals), q/k/v before and after rotary, 5 intermediate-size vectors and the attention
    probabilities; the deltas run in at least float32."""
    b = max(dtype_bytes(dtype), 4)
    tokens = rows * seq
    per_token_layer = 10 * fp.hidden + 2 * (fp.heads + 2 * fp.kv_heads) * fp.head_dim + 5 * fp.intermediate
    saved = fp.layers * (b * tokens * per_token_layer + b * 2 * rows * fp.heads * seq * seq)
    alpha = 3 * tokens * len(fp.slot_names) * b  # a, its gradient, the accumulated total
    logits = rows * fp.vocab * b * 3
    return {"activations": saved, "alpha": alpha, "logits": logits}
