"""What a model will cost, from its config alone: parameter bytes (whole, or only the tensors
a lean donor holds), activation / KV bytes of a batch, and FLOPs per token.

Why: ``weightgraft plan`` and the refusal in ``run`` / ``localize`` must answer "will it fit"
before any weight is read. The architecture is built on the ``meta`` device (shapes, no
storage, milliseconds even for 8B parameters), so parameter counts, tied tensors and the
slot -> tensor map come from the very modules the engine will graft, not from a formula.

A ``quantized(SPEC, SCHEME)`` role has SPEC's shapes; the modules transformers would quantize
are found on the meta model by transformers' own rules, and their weights counted at the
scheme's bytes (:func:`quantized_weight_bytes`, equal to the byte to loaded models in
tests/planning/test_plan_quantized.py).

The activation estimates are upper-bound style sums of the tensors one layer holds at once
(inference) or that autograd keeps for the backward pass (attribution); they are checked
against measured memory in tests/planning/test_plan.py (within a factor stated there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from weightgraft.models.errors import ModelLoadError, ModelNotFoundError
from weightgraft.models.quantization.schemes import quantizes_nothing

__all__ = ["SCHEME_LAYOUT", "ModelFootprint", "Quantization", "dtype_bytes", "embedded_footprint", "location_footprint",
           "quantization_of", "quantized_footprint", "quantized_weight_bytes", "random_footprint"]

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
    dtype (:meth:`ModelFootprint.param_bytes`). On a CPU with AVX512-BF16, bitsandbytes repacks a
    4-bit weight at its first eval forward with a bfloat16 absmax (0.53125 bytes a weight): this
    is then an upper bound."""
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


@dataclass(frozen=True)
class Quantization:
    """How a role's linear weights are stored: the scheme (``nf4``, ``fp4``, ``int8``,
    ``torchao-int8``), bitsandbytes' double quantization, and the modules the user keeps
    unquantized (None: transformers' defaults, the output embedding and tied tensors)."""

    scheme: str
    double_quant: bool = False
    skip: tuple[str, ...] | None = None
    bnb: bool = True  # bitsandbytes converts ``nn.Linear`` exactly and GPT-2's ``Conv1D``; torchao any ``nn.Linear``


def quantization_of(spec: Any) -> Quantization:
    """The :class:`Quantization` a quantized spec loads with: its scheme's, or what the user's
    own transformers config (a ``BitsAndBytesConfig``, a ``TorchAoConfig`` of int8 weight-only) says."""
    custom = spec.custom
    if custom is None:
        return Quantization(spec.scheme, bnb=spec.scheme != "torchao-int8")
    kind = type(custom).__name__
    if kind == "BitsAndBytesConfig":
        skip = getattr(custom, "llm_int8_skip_modules", None)
        skip = tuple(skip) if skip is not None else None
        if getattr(custom, "load_in_4bit", False):
            return Quantization(str(custom.bnb_4bit_quant_type), bool(custom.bnb_4bit_use_double_quant), skip)
        if getattr(custom, "load_in_8bit", False):
            return Quantization("int8", skip=skip)
    if kind == "TorchAoConfig" and type(getattr(custom, "quant_type", None)).__name__ == "Int8WeightOnlyConfig" \
            and not getattr(custom, "include_input_output_embeddings", False):
        skip = getattr(custom, "modules_to_not_convert", None)
        return Quantization("torchao-int8", skip=tuple(skip) if skip is not None else None, bnb=False)
    raise ModelLoadError(f"{spec.text!r}: cannot plan a {kind} (the plan counts bitsandbytes 4-bit and 8-bit and "
                         "torchao int8 weight-only); give a scheme name")


def _default_skips(model: Any) -> list[str]:
    """transformers' ``get_keys_to_not_convert``: tied tensors, the last parameter's module and
    the output embedding stay unquantized."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    keys = set(tied) | set(tied.values()) | {list(model.named_parameters())[-1][0]}
    out = model.get_output_embeddings()
    keys |= {name for name, module in model.named_modules() if out is not None and module is out}
    return [k.removesuffix(".weight") for k in keys]


def _converted(name: str, skip: list[str]) -> bool:
    """transformers' ``should_convert_module``: no pattern matches ``name`` from its start (up
    to a module boundary, as a regex) or as a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return not any(re.match(rf"(?:{key}){boundary}", name) or name.endswith(key) for key in skip)


@dataclass
class ModelFootprint:
    """A model's shapes, from its config (no weights read).

    ``where`` says where the config came from; ``tokenizer_dir`` is a directory (or cached hub
    id) a tokenizer can be loaded from without loading the model, or None.
    """

    spec: str
    config: Any
    where: str
    tokenizer_dir: str | None = None
    quantization: Quantization | None = None  # a ``quantized(SPEC, SCHEME)`` role's
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @cached_property
    def meta(self) -> Any:
        """The model on the meta device: real module tree and shapes, no storage."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config)
        model.tie_weights()
        return model

    # ---- parameters ------------------------------------------------------------------------

    @cached_property
    def n_params(self) -> int:
        """Parameters, tied tensors counted once (what ``model.parameters()`` yields)."""
        return sum(p.numel() for p in self.meta.parameters())

    @cached_property
    def quantized_shapes(self) -> dict[str, tuple[int, int]]:
        """Path -> (out, in) of each module whose weight transformers stores quantized (none
        unquantized): bitsandbytes converts every exact ``nn.Linear`` (and GPT-2's ``Conv1D``),
        torchao every ``nn.Linear``, but those of transformers' ``modules_to_not_convert``."""
        q = self.quantization
        if q is None:
            return {}
        from torch import nn
        from transformers.pytorch_utils import Conv1D

        skip = list(q.skip) if q.skip is not None else _default_skips(self.meta)
        skip += list(getattr(self.meta, "_keep_in_fp32_modules", None) or [])
        out = {}
        for name, module in self.meta.named_modules():
            if not name or not _converted(name, skip):
                continue
            if (type(module) is nn.Linear) if q.bnb else isinstance(module, nn.Linear):
                out[name] = (module.out_features, module.in_features)
            elif q.bnb and isinstance(module, Conv1D):
                out[name] = (module.weight.shape[1], module.weight.shape[0])
        return out

    @cached_property
    def _quantized_weights(self) -> dict[int, int]:
        """id of a quantized weight on the meta model -> its bytes (:func:`quantized_weight_bytes`)."""
        q = self.quantization
        if q is None:
            return {}
        return {id(self.meta.get_submodule(path).weight): quantized_weight_bytes(q.scheme, o, i, q.double_quant)
                for path, (o, i) in self.quantized_shapes.items()}

    def _tensor_bytes(self, p: Any, size: int) -> int:
        return self._quantized_weights.get(id(p), p.numel() * size)

    def param_bytes(self, dtype: Any, quantized: bool = True) -> int:
        """Bytes of the whole model's parameters and buffers in ``dtype``; a quantized role's
        quantized weights at their scheme's bytes (``quantized=False``: as read, dense)."""
        size = dtype_bytes(dtype)
        buffers = sum(b.numel() * b.element_size() for b in self.meta.buffers())
        if not quantized or self.quantization is None:
            return self.n_params * size + buffers
        return sum(self._tensor_bytes(p, size) for p in self.meta.parameters()) + buffers

    def quantized_parts(self, dtype: Any) -> tuple[int, int, int, int]:
        """(quantized weights, their bytes, other parameters, their bytes and the buffers'):
        the two terms of :meth:`param_bytes` of a quantized role."""
        shapes = self.quantized_shapes
        n_q = sum(o * i for o, i in shapes.values())
        q_bytes = sum(self._quantized_weights.values())
        return n_q, q_bytes, self.n_params - n_q, self.param_bytes(dtype) - q_bytes

    @cached_property
    def slot_parameters(self) -> dict[str, list[str]]:
        """Slot name -> parameter names its modules hold (as lean donors count them)."""
        from weightgraft.models.lean import slot_parameters

        return slot_parameters(self.meta)

    @cached_property
    def slot_names(self) -> list[str]:
        return list(self.slot_parameters)

    def held_bytes(self, slots: set[str] | None, dtype: Any) -> int:
        """Bytes a donor holds when it serves ``slots`` (None: the whole model). A lean donor
        holds each needed tensor once (tied names share one), an upper bound: tensors equal to
        the base's are shared at load time."""
        if slots is None:
            return self.param_bytes(dtype)
        from weightgraft.models.lean import needed_parameters

        names = needed_parameters(self.meta, slots)
        params = dict(self.meta.named_parameters(remove_duplicate=False))
        size = dtype_bytes(dtype)
        unique = {id(params[n]): self._tensor_bytes(params[n], size) for n in names}
        return sum(unique.values())

    def delta_bytes(self, dtype: Any, donor_slots: set[str] | None = None) -> int:
        """Bytes of a ``PartialGraft``'s deltas (localize's attribution): per grafted module, the
        weight difference of a projection (in at least float32), or two float32 copies of any
        other module (norms, embeddings: ``f(x; Δθ) - f(x; 0)``). With ``donor_slots`` (a lean
        donor), a projection the donor shares with the base costs nothing."""
        from weightgraft.engine import projections
        from weightgraft.engine.architectures import model_slots

        size = max(dtype_bytes(dtype), 4)
        owners: dict[str, set[str]] = {}
        for slot in model_slots(self.meta):
            for part in slot.parts:
                owners.setdefault(part.path, set()).add(slot.name)
        total = 0
        for path, slots in owners.items():
            module = self.meta.get_submodule(path)
            n = sum(p.numel() for p in module.parameters())
            if not projections.is_projection(module):
                total += 2 * n * size
            elif donor_slots is None or slots & donor_slots:
                total += n * size
        return total

    # ---- shapes ----------------------------------------------------------------------------

    def _get(self, *names: str, default: Any = None) -> Any:
        for n in names:
            value = getattr(self.config, n, None)
            if value is not None:
                return value
        return default

    @property
    def hidden(self) -> int:
        return int(self._get("hidden_size", "n_embd"))

    @property
    def layers(self) -> int:
        return int(self._get("num_hidden_layers", "n_layer"))

    @property
    def heads(self) -> int:
        return int(self._get("num_attention_heads", "n_head"))

    @property
    def kv_heads(self) -> int:
        return int(self._get("num_key_value_heads", default=self.heads))

    @property
    def head_dim(self) -> int:
        return int(self._get("head_dim", default=self.hidden // self.heads))

    @property
    def intermediate(self) -> int:
        return int(self._get("intermediate_size", "n_inner", default=4 * self.hidden))

    @property
    def vocab(self) -> int:
        return int(self.config.vocab_size)

    @cached_property
    def matmul_params(self) -> int:
        """Parameters of the matrices a token multiplies by in the layers (not the embedding
        lookup, not the unembedding: those are counted per logit position)."""
        from weightgraft.engine import projections

        emb = self.meta.get_input_embeddings()
        out = self.meta.get_output_embeddings()
        skip = {id(emb)} | ({id(out)} if out is not None else set())
        total = 0
        for module in self.meta.modules():
            if id(module) in skip or not projections.is_projection(module):
                continue
            total += module.weight.numel()
        return total

    def forward_flops(self, tokens: int, seq: int, logit_positions: int) -> float:
        """FLOPs of a forward pass over ``tokens`` token rows of sequences ``seq`` long, with
        logits at ``logit_positions`` positions in all."""
        attention = 4 * self.layers * seq * self.heads * self.head_dim  # QK^T and AV per token
        return float(tokens) * (2 * self.matmul_params + attention) + 2.0 * logit_positions * self.vocab * self.hidden

    def inference_bytes(self, rows: int, seq: int, logits_per_row: int, dtype: Any, kv: bool = True) -> dict[str, int]:
        """Activation and KV bytes of one grafted forward batch (rows x seq tokens).

        Per token, one layer holds at once: about 6 hidden-size vectors (residual, norm output,
        attention output, the engine's donor rows and their scatter), q/k/v (k/v repeated to
        every head: 2 more), 4 intermediate-size vectors (gate, up, activation, product, and the
        engine's copy), and the attention scores of its heads (2 copies, softmax). The KV cache
        of prefix sharing holds every layer's keys and values; logits are kept in float32."""
        b = dtype_bytes(dtype)
        tokens = rows * seq
        per_token = 6 * self.hidden + (3 * self.heads + 2 * self.kv_heads) * self.head_dim + 4 * self.intermediate
        activations = b * tokens * per_token + b * 2 * rows * self.heads * seq * seq
        kv_cache = (2 * self.layers * tokens * self.kv_heads * self.head_dim * b) if kv else 0
        logits = rows * logits_per_row * self.vocab * (b + 4 + 4)  # model dtype, float32, softmax
        return {"activations": activations, "kv_cache": kv_cache, "logits": logits}

    def attribution_bytes(self, rows: int, seq: int, dtype: Any) -> dict[str, int]:
        """Bytes autograd keeps for the backward pass of graft attribution (forward + backward
        w.r.t. every cell's share ``a``), plus ``a`` and its gradient.

        Per token and layer it keeps about 10 hidden-size vectors (inputs of norms and
        projections, residuals), q/k/v before and after rotary, 5 intermediate-size vectors and
        the attention probabilities; the deltas run in at least float32."""
        b = max(dtype_bytes(dtype), 4)
        tokens = rows * seq
        per_token_layer = (10 * self.hidden + 2 * (self.heads + 2 * self.kv_heads) * self.head_dim
                           + 5 * self.intermediate)
        saved = self.layers * (b * tokens * per_token_layer + b * 2 * rows * self.heads * seq * seq)
        n_slots = len(self.slot_names)
        alpha = 3 * tokens * n_slots * b  # a, its gradient, the accumulated total
        logits = rows * self.vocab * b * 3
        return {"activations": saved, "alpha": alpha, "logits": logits}


def _check_converts(footprint: ModelFootprint) -> None:
    """A torchao role on a model of no ``nn.Linear`` to convert (GPT-2's projections are
    ``Conv1D``) refused from its config: loaded, it would run unquantized under a quantized name.
    bitsandbytes converts ``Conv1D`` too; what a custom skip list leaves is checked after loading."""
    q = footprint.quantization
    if q is None or q.bnb or footprint.quantized_shapes:
        return
    from transformers.pytorch_utils import Conv1D

    raise quantizes_nothing(footprint.spec, any(isinstance(m, Conv1D) for m in footprint.meta.modules()))


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def quantized_footprint(text: str, inner: ModelFootprint, spec: Any) -> ModelFootprint:
    """A ``quantized(...)`` role's footprint: the named model's shapes, its linear weights
    quantized as ``spec`` (``.scheme``, ``.custom``) says; refused where nothing would convert."""
    footprint = ModelFootprint(text, inner.config, inner.where, inner.tokenizer_dir, quantization=quantization_of(spec))
    _check_converts(footprint)
    return footprint


def random_footprint(spec: Any) -> ModelFootprint:
    """A ``random:`` model's footprint, from its config file."""
    from weightgraft.models.random_models import parse_random_spec, random_config

    parsed = parse_random_spec(spec)
    return ModelFootprint(parsed.text, random_config(parsed), f"config {parsed.config_path}", None)


def embedded_footprint(name: str, text: str) -> ModelFootprint:
    """An embedded model's footprint: its converted config, else the shipped copy of it."""
    from transformers import AutoConfig

    from weightgraft.models.embedded import embedded_cache_dir
    from weightgraft.models.random_models import random_config, shipped_config_path

    directory = embedded_cache_dir(name)
    if (directory / "config.json").is_file():
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        return ModelFootprint(text, config, f"{directory}/config.json", str(directory) if _has_tokenizer(directory) else None)
    shipped = shipped_config_path(name)
    if shipped is not None:  # not converted yet: the shipped copy of its config
        return ModelFootprint(text, random_config(f"random:{name}"), f"shipped config {shipped}", None)
    return location_footprint(text)


def location_footprint(text: str) -> ModelFootprint:
    """The footprint of a model directory, a ``.gguf`` file or a cached hub id, reading its
    config only."""
    from transformers import AutoConfig

    text = text.strip()
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} holds no config.json: cannot plan for it")
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        return ModelFootprint(text, config, f"{path.resolve()}/config.json",
                              str(path) if _has_tokenizer(path) else None)
    if path.is_file() and path.suffix.lower() == ".gguf":
        try:
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as exc:
            raise ModelLoadError(f"cannot read the config of {path} ({exc})") from exc
        return ModelFootprint(text, config, f"gguf metadata {path}", None)
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model directory nor a .gguf file: cannot plan for it")
    try:
        config = AutoConfig.from_pretrained(text, local_files_only=True)
    except Exception as exc:
        raise ModelNotFoundError(
            f"cannot read the config of {text!r}: it is no random:/embedded name, no path, and "
            "no hub id in the local Hugging Face cache"
        ) from exc
    return ModelFootprint(text, config, f"hub-cache:{text}", text)
