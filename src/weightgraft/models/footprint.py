"""What a model will cost, from its config alone: parameter bytes (whole, or only the tensors
a lean donor holds), activation / KV bytes of a batch, and FLOPs per token.

Why: ``weightgraft plan`` and the refusal in ``run`` / ``localize`` must answer "will it fit"
before any weight is read. The architecture is built on the ``meta`` device (shapes, no
storage, milliseconds even for 8B parameters), so parameter counts, tied tensors and the
slot -> tensor map come from the very modules the engine will graft, not from a formula.

The activation estimates are upper-bound style sums of the tensors one layer holds at once
(inference) or that autograd keeps for the backward pass (attribution); they are checked
against measured memory in tests/test_plan.py (within a factor stated there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from weightgraft.models.errors import ModelLoadError, ModelNotFoundError
from weightgraft.models.spec import EmbeddedSpec, ModelSpec, RandomSpec, is_derived

__all__ = ["ModelFootprint", "dtype_bytes", "resolve_footprint"]

_DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (a torch dtype or its name)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


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

    def param_bytes(self, dtype: Any) -> int:
        """Bytes of the whole model's parameters and buffers in ``dtype``."""
        size = dtype_bytes(dtype)
        buffers = sum(b.numel() * b.element_size() for b in self.meta.buffers())
        return self.n_params * size + buffers

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
        unique = {id(params[n]): params[n].numel() for n in names}
        return sum(unique.values()) * dtype_bytes(dtype)

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


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def resolve_footprint(spec: str | os.PathLike[str] | ModelSpec) -> ModelFootprint:
    """The footprint of a model spec, reading its config only (the same specs ``load_model``
    takes: ``random:``, embedded names, directories, ``.gguf`` files, cached hub ids)."""
    from transformers import AutoConfig

    from weightgraft.models.embedded import embedded_cache_dir
    from weightgraft.models.loading import resolved_spec
    from weightgraft.models.random_models import parse_random_spec, random_config, shipped_config_path

    parsed_spec = resolved_spec(spec)
    if is_derived(parsed_spec):
        raise ModelLoadError(f"{parsed_spec.text!r} is built from other roles: plan for the roles it names")
    text = parsed_spec.text.strip()
    if isinstance(parsed_spec, RandomSpec):
        parsed = parse_random_spec(parsed_spec)
        return ModelFootprint(text, random_config(parsed), f"config {parsed.config_path}", None)
    if isinstance(parsed_spec, EmbeddedSpec):
        directory = embedded_cache_dir(parsed_spec.name)
        if (directory / "config.json").is_file():
            config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
            return ModelFootprint(text, config, f"{directory}/config.json",
                                  str(directory) if _has_tokenizer(directory) else None)
        shipped = shipped_config_path(parsed_spec.name)
        if shipped is not None:  # not converted yet: the shipped copy of its config
            return ModelFootprint(text, random_config(RandomSpec(parsed_spec.name)), f"shipped config {shipped}", None)
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
