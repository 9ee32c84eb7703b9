"""Architecture adapters: for each HF ``model_type``, which module (and which output columns)
each logical component of a decoder is.

A new architecture is one entry in ``ADAPTERS``. Components are named canonically
(``q, k, v, o, gate, up, down, attn_norm, mlp_norm, ...``); a component is either a whole
module (``"mlp.down_proj"``) or a set of output columns of a fused projection
(``Fused("attn.c_attn", "qkv_blocks", "q")``), so that q, k and v graft separately.
"""

from __future__ import annotations

import weakref
from enum import Enum
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from torch import nn

from weightgraft.engine import projections
from weightgraft.errors import UnsupportedArchitectureError as UnsupportedArchitectureError

# The canonical order of per-layer components; ``slots()`` lists them in this order.
LAYER_COMPONENTS: tuple[str, ...] = (
    "attn_norm",
    "q",
    "k",
    "v",
    "q_norm",
    "k_norm",
    "o",
    "post_attn_norm",
    "mlp_norm",
    "gate",
    "up",
    "down",
    "post_mlp_norm",
)
GLOBAL_SLOTS: tuple[str, ...] = ("embed", "pos_embed", "final_norm", "unembed")

Layout = Literal["qkv_blocks", "qkv_per_head", "halves"]


@dataclass(frozen=True)
class Fused:
    """A component that is a subset of the output columns of a fused projection.

    ``qkv_blocks``: [q | k | v] contiguous (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``);
    ``qkv_per_head``: per head [q_h | k_h | v_h] (GPT-NeoX ``query_key_value``);
    ``halves``: [first | second] (Phi-3 ``gate_up_proj``).
    """

    module: str
    layout: Layout
    part: str  # "q" | "k" | "v" for qkv layouts, "first" | "second" for halves


@dataclass(frozen=True)
class Part:
    """One module (or column subset of one) that a slot consists of, bound to a model."""

    path: str  # full dotted path from the CausalLM root
    columns: torch.Tensor | None  # output columns the slot owns; None = the whole output
    pos_axis: int  # which axis of the module's input/output is the token position


@dataclass(frozen=True)
class Adapter:
    """Declarative description of one HF architecture."""

    layers: str  # path of the ModuleList of decoder blocks
    embed: tuple[str, ...]  # modules whose outputs together form the token embedding
    final_norm: str | None
    unembed: str
    components: dict[str, str | Fused]  # canonical name -> module path inside a block
    # The position axis of modules whose input is not [batch, seq, ...] (Gemma 3 q/k norms).
    pos_axis: dict[str, int] = field(default_factory=dict)
    # Config attributes that change the computation in ways this adapter does not model:
    # attribute -> the only value supported.
    requires: dict[str, Any] = field(default_factory=dict)
    # Learned position embeddings (GPT-2's wpe): a slot of their own, ``pos_embed``.
    pos_embed: str | None = None


def _llama_like(**extra: str) -> dict[str, str | Fused]:
    comps: dict[str, str | Fused] = {
        "attn_norm": "input_layernorm",
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.o_proj",
        "mlp_norm": "post_attention_layernorm",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    }
    comps.update(extra)
    return comps


_GEMMA2_NORMS = {
    "post_attn_norm": "post_attention_layernorm",
    "mlp_norm": "pre_feedforward_layernorm",  # NOT post_attention_layernorm in Gemma 2/3
    "post_mlp_norm": "post_feedforward_layernorm",
}
_QK_NORMS = {"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}


def _llama_family(components: dict[str, str | Fused], **kw: Any) -> Adapter:
    return Adapter(
        layers="model.layers",
        embed=("model.embed_tokens",),
        final_norm="model.norm",
        unembed="lm_head",
        components=components,
        **kw,
    )


ADAPTERS: dict[str, Adapter] = {
    "gpt2": Adapter(
        layers="transformer.h",
        embed=("transformer.wte",),
        pos_embed="transformer.wpe",
        final_norm="transformer.ln_f",
        unembed="lm_head",
        components={
            "attn_norm": "ln_1",
            "q": Fused("attn.c_attn", "qkv_blocks", "q"),
            "k": Fused("attn.c_attn", "qkv_blocks", "k"),
            "v": Fused("attn.c_attn", "qkv_blocks", "v"),
            "o": "attn.c_proj",
            "mlp_norm": "ln_2",
            "up": "mlp.c_fc",
            "down": "mlp.c_proj",
        },
        requires={"add_cross_attention": False},
    ),
    "gpt_neox": Adapter(
        layers="gpt_neox.layers",
        embed=("gpt_neox.embed_in",),
        final_norm="gpt_neox.final_layer_norm",
        unembed="lm_head",
        components={
            "attn_norm": "input_layernorm",
            "q": Fused("attention.query_key_value", "qkv_per_head", "q"),
            "k": Fused("attention.query_key_value", "qkv_per_head", "k"),
            "v": Fused("attention.query_key_value", "qkv_per_head", "v"),
            "o": "attention.dense",
            "mlp_norm": "post_attention_layernorm",
            "up": "mlp.dense_h_to_4h",
            "down": "mlp.dense_4h_to_h",
        },
    ),
    "llama": _llama_family(_llama_like()),
    "mistral": _llama_family(_llama_like()),
    "qwen2": _llama_family(_llama_like()),
    "granite": _llama_family(_llama_like()),
    "gemma": _llama_family(_llama_like()),
    "gemma2": _llama_family(_llama_like(**_GEMMA2_NORMS)),
    "gemma3_text": _llama_family(
        _llama_like(**_GEMMA2_NORMS, **_QK_NORMS),
        pos_axis={"q_norm": 2, "k_norm": 2},  # they see [batch, heads, seq, head_dim]
    ),
    "qwen3": _llama_family(_llama_like(**_QK_NORMS)),  # q/k norms see [batch, seq, heads, dim]
    # OLMo 1 norms are parameter-free LayerNorms: nothing to graft there.
    "olmo": _llama_family(
        {k: v for k, v in _llama_like().items() if k not in ("attn_norm", "mlp_norm")}
    ),
    # OLMo 2 is post-norm: the norms act on the attention / MLP outputs.
    "olmo2": _llama_family(
        {
            **{k: v for k, v in _llama_like().items() if k not in ("attn_norm", "mlp_norm")},
            **_QK_NORMS,
            "post_attn_norm": "post_attention_layernorm",
            "post_mlp_norm": "post_feedforward_layernorm",
        }
    ),
    "phi3": _llama_family(
        {
            "attn_norm": "input_layernorm",
            "q": Fused("self_attn.qkv_proj", "qkv_blocks", "q"),
            "k": Fused("self_attn.qkv_proj", "qkv_blocks", "k"),
            "v": Fused("self_attn.qkv_proj", "qkv_blocks", "v"),
            "o": "self_attn.o_proj",
            "mlp_norm": "post_attention_layernorm",
            "gate": Fused("mlp.gate_up_proj", "halves", "first"),
            "up": Fused("mlp.gate_up_proj", "halves", "second"),
            "down": "mlp.down_proj",
        }
    ),
    "stablelm": _llama_family(_llama_like(), requires={"qk_layernorm": False}),
}


def supported_model_types() -> list[str]:
    return sorted(ADAPTERS)


def adapter_for(config: Any) -> Adapter:
    """The adapter for a model config; a clear error for anything we do not model exactly."""
    model_type = getattr(config, "model_type", None)
    if model_type not in ADAPTERS:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported by weightgraft. "
            f"Supported: {', '.join(supported_model_types())}. "
            "Adding one is a single entry in weightgraft/engine/architectures.py."
        )
    adapter = ADAPTERS[model_type]
    for attr, wanted in adapter.requires.items():
        value = getattr(config, attr, wanted)
        if value != wanted:
            raise UnsupportedArchitectureError(
                f"{model_type}: config.{attr}={value!r} changes the computation in a way "
                f"weightgraft does not model; only {attr}={wanted!r} is supported."
            )
    return adapter


def _head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    return int(config.hidden_size // config.num_attention_heads)


def fused_columns(fused: Fused, config: Any, out_features: int) -> torch.Tensor:
    """The output-column indices of ``fused.part`` inside its fused projection."""
    if fused.layout == "halves":
        half = out_features // 2
        start = 0 if fused.part == "first" else half
        return torch.arange(start, start + half)
    n_heads = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    hd = _head_dim(config)
    if fused.layout == "qkv_blocks":
        sizes = {"q": n_heads * hd, "k": n_kv * hd, "v": n_kv * hd}
        if sum(sizes.values()) != out_features:
            raise UnsupportedArchitectureError(
                f"fused projection {fused.module} has {out_features} outputs, expected "
                f"{sum(sizes.values())} from the config's heads"
            )
        start = {"q": 0, "k": sizes["q"], "v": sizes["q"] + sizes["k"]}[fused.part]
        return torch.arange(start, start + sizes[fused.part])
    if fused.layout == "qkv_per_head":
        if n_kv != n_heads or 3 * n_heads * hd != out_features:
            raise UnsupportedArchitectureError(
                f"fused projection {fused.module}: per-head q/k/v layout needs "
                f"3*heads*head_dim={3 * n_heads * hd} outputs, found {out_features}"
            )
        which = "qkv".index(fused.part)
        grid = torch.arange(out_features).view(n_heads, 3, hd)
        return grid[:, which, :].reshape(-1)
    raise UnsupportedArchitectureError(f"unknown fused layout {fused.layout!r}")


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


# Components that can be grafted head by head, and which side of the module the heads are on:
# q/k/v heads are groups of output columns, o's heads are groups of its input columns. Under
# grouped-query attention k and v have ``num_key_value_heads`` heads: one k/v head's columns
# serve its whole group of q heads, so a k/v head is that shared key/value head, not a q head's.
HEAD_COMPONENTS: dict[str, Literal["out", "in"]] = {"q": "out", "k": "out", "v": "out", "o": "in"}
# Components that can be grafted neuron by neuron (MLP neurons): a neuron of gate/up is one
# output column (its bias entry included), of down one input column (down's bias belongs to no
# neuron). GPT-2's ``c_fc`` and GPT-NeoX's ``dense_h_to_4h`` are ``up``.
NEURON_COMPONENTS: dict[str, Literal["out", "in"]] = {"gate": "out", "up": "out", "down": "in"}


class Units(str, Enum):
    """A map's cell: a whole slot, or a slot split into attention heads (q/k/v/o) or MLP
    neurons (gate/up/down); parsed once from a localize config, taken by every module after."""

    CELL = "cell"
    HEAD = "head"
    NEURON = "neuron"

    def __str__(self) -> str:
        return self.value


UnitKind = Literal[Units.HEAD, Units.NEURON]  # the units a slot can split into


@dataclass(frozen=True)
class Slot:
    """A graftable slot of a concrete model: its name and the module parts it consists of.

    ``heads`` is the number of attention heads the slot can be split into (0: not per-head),
    ``head_side`` whether a head is a group of output (q/k/v) or input (o) columns.
    """

    name: str
    parts: tuple[Part, ...]
    heads: int = 0
    head_side: Literal["out", "in"] | None = None
    neurons: int = 0  # MLP neurons (gate/up: output columns, down: input columns); 0: not per-neuron
    neuron_side: Literal["out", "in"] | None = None

    def units(self, kind: Units) -> int:
        """How many units of ``kind`` (heads or neurons) the slot splits into (0: none, and
        for ``Units.CELL``)."""
        return self.heads if kind == Units.HEAD else self.neurons if kind == Units.NEURON else 0

    def unit_side(self, kind: Units) -> Literal["out", "in"] | None:
        """Whether a unit of ``kind`` is a group of output or of input columns."""
        return self.head_side if kind == Units.HEAD else self.neuron_side if kind == Units.NEURON else None

    def unit_kind(self) -> UnitKind | None:
        """``Units.HEAD`` for q/k/v/o, ``Units.NEURON`` for gate/up/down, else None."""
        return Units.HEAD if self.heads else Units.NEURON if self.neurons else None

    def head_columns(self, module: nn.Module) -> list[torch.Tensor]:
        """Per head, the columns of ``module`` (output side for q/k/v, input side for o)."""
        return self.unit_columns(module, Units.HEAD)

    def unit_columns(self, module: nn.Module, kind: Units) -> list[torch.Tensor]:
        """Per unit (head or neuron), the columns of ``module`` it owns (output side for
        q/k/v/gate/up, input side for o/down)."""
        part = self.parts[0]
        n, side = self.units(kind), self.unit_side(kind)
        if side == "in":
            width = _in_features(module)
            cols = torch.arange(width)
        else:
            cols = part.columns if part.columns is not None else torch.arange(_out_features(module))
        if not n or cols.numel() % n:
            raise UnsupportedArchitectureError(
                f"slot {self.name} cannot be split into {n} {kind}s ({cols.numel()} columns)"
            )
        return list(cols.view(n, -1))


_SLOTS: weakref.WeakKeyDictionary[nn.Module, tuple[str, list[Slot]]] = weakref.WeakKeyDictionary()  # model -> (config json, slots)


def model_slots(model: nn.Module) -> list[Slot]:
    """All graftable slots of ``model`` in the canonical order, bound to module paths.

    Components whose module has no parameters (OLMo's LayerNorms) are not slots: grafting
    them could change nothing. Remembered per model while its config stays the same (every
    ``graft_forward`` call asks for them).
    """
    key = projections.hf_config(model).to_json_string()
    cached = _SLOTS.get(model)
    if cached is not None and cached[0] == key:
        return list(cached[1])
    slots = _build_slots(model)
    _SLOTS[model] = (key, slots)
    return list(slots)


def _build_slots(model: nn.Module) -> list[Slot]:
    config = projections.hf_config(model)
    adapter = adapter_for(config)
    try:
        layers = cast(nn.ModuleList, model.get_submodule(adapter.layers))  # HF's decoder blocks
    except AttributeError as exc:
        raise UnsupportedArchitectureError(
            f"{config.model_type}: expected decoder blocks at {adapter.layers!r}: {exc}"
        ) from exc

    def part(path: str, pos_axis: int = 1, columns: torch.Tensor | None = None) -> Part:
        try:
            model.get_submodule(path)
        except AttributeError as exc:
            raise UnsupportedArchitectureError(
                f"{config.model_type}: expected module {path!r}: {exc}"
            ) from exc
        return Part(path=path, columns=columns, pos_axis=pos_axis)

    n_heads = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    out = [Slot("embed", tuple(part(p) for p in adapter.embed))]
    if adapter.pos_embed is not None:
        out.append(Slot("pos_embed", (part(adapter.pos_embed),)))
    for i in range(len(layers)):
        prefix = f"{adapter.layers}.{i}"
        for comp in LAYER_COMPONENTS:
            spec = adapter.components.get(comp)
            if spec is None:
                continue
            axis = adapter.pos_axis.get(comp, 1)
            heads = {"k": n_kv, "v": n_kv}.get(comp, n_heads) if comp in HEAD_COMPONENTS else 0
            side = HEAD_COMPONENTS.get(comp)
            n_side = NEURON_COMPONENTS.get(comp)
            if isinstance(spec, Fused):
                path = f"{prefix}.{spec.module}"
                module = model.get_submodule(path)
                cols = fused_columns(spec, config, _out_features(module))
                neurons = cols.numel() if n_side else 0
                out.append(Slot(f"layers.{i}.{comp}", (part(path, axis, cols),), heads, side, neurons, n_side))
            else:
                path = f"{prefix}.{spec}"
                bound = part(path, axis)
                module = model.get_submodule(path)
                if _has_parameters(module):
                    neurons = 0
                    if n_side is not None:
                        neurons = _in_features(module) if n_side == "in" else _out_features(module)
                    out.append(Slot(f"layers.{i}.{comp}", (bound,), heads, side, neurons, n_side))
    if adapter.final_norm is not None and _has_parameters(model.get_submodule(adapter.final_norm)):
        out.append(Slot("final_norm", (part(adapter.final_norm),)))
    out.append(Slot("unembed", (part(adapter.unembed),)))
    _check_coverage(model, out)
    return out


def _out_features(module: nn.Module) -> int:
    try:
        return projections.out_features(module)
    except projections.UnsupportedProjection as exc:
        raise UnsupportedArchitectureError(f"fused component on a {exc}") from exc


def _in_features(module: nn.Module) -> int:
    try:
        return projections.in_features(module)
    except projections.UnsupportedProjection as exc:
        raise UnsupportedArchitectureError(f"per-head o / per-neuron down on a {exc}") from exc


def _check_coverage(model: nn.Module, slots_: list[Slot]) -> None:
    """Every parameter must belong to a slot, or some weights would silently never graft."""
    covered: set[str] = set()
    for slot in slots_:
        for p in slot.parts:
            covered.update(
                f"{p.path}.{n}" for n, _ in model.get_submodule(p.path).named_parameters(
                    remove_duplicate=False
                )
            )
    for name, _ in model.named_parameters(remove_duplicate=False):
        if name not in covered:
            raise UnsupportedArchitectureError(
                f"{projections.hf_config(model).model_type}: parameter {name!r} belongs to no graftable "
                "component; this model variant (a config option or a custom module) is not "
                "supported by its adapter"
            )
