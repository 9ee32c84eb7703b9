"""Binding an adapter to a concrete model: its slots in the canonical order, checked to cover
every parameter that a prompt's tokens reach."""

from __future__ import annotations

import weakref
from typing import Any, cast

import torch
from torch import nn

from weightgraft.engine import projections
from weightgraft.engine.architectures.adapter import (
    ATTENTION_COMPONENTS,
    LAYER_COMPONENTS,
    Adapter,
    Fused,
    Mixer,
    Tensors,
)
from weightgraft.engine.architectures.table import adapter_for, text_config
from weightgraft.engine.architectures.units import (
    FLAT,
    HEAD_COMPONENTS,
    NEURON_COMPONENTS,
    MixerSite,
    Part,
    Slot,
    _in_features,
    _out_features,
)
from weightgraft.errors import UnsupportedArchitectureError


def _head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    return int(config.hidden_size // config.num_attention_heads)


def fused_columns(fused: Fused, config: Any, out_features: int) -> torch.Tensor:
    """The output-column indices of ``fused.part`` inside its fused projection."""
    if fused.layout in ("halves", "thirds"):
        parts = ("first", "second") if fused.layout == "halves" else ("first", "second", "third")
        width = out_features // len(parts)
        start = parts.index(fused.part) * width
        return torch.arange(start, start + width)
    if fused.layout == "linear_qkv_blocks":  # a Gated DeltaNet's [q | k | v], sized by its own heads
        key = int(config.linear_num_key_heads) * int(config.linear_key_head_dim)
        value = int(config.linear_num_value_heads) * int(config.linear_value_head_dim)
        if 2 * key + value != out_features:
            raise UnsupportedArchitectureError(
                f"fused projection {fused.module} has {out_features} outputs, expected {2 * key + value} "
                "from the config's linear-attention heads")
        start, size = {"q": (0, key), "k": (key, key), "v": (2 * key, value)}[fused.part]
        return torch.arange(start, start + size)
    if fused.layout in ("qkvz_per_key_head", "ba_per_key_head"):  # Qwen3-Next: grouped by key head
        return _per_key_head(fused, config, out_features)
    if fused.layout in ("mamba2_blocks", "falcon_mamba2_blocks"):  # Mamba2's [z | x | B | C | dt]
        if fused.layout == "mamba2_blocks":  # sized by its heads, groups and state
            heads = int(config.mamba_num_heads)
            inner, state = heads * int(config.mamba_head_dim), int(config.n_groups) * int(config.ssm_state_size)
        else:  # Falcon-H1's: an inner width of its own (mamba_d_ssm, else mamba_expand times the hidden size)
            heads = int(config.mamba_n_heads)
            inner = int(config.mamba_d_ssm or int(config.mamba_expand) * int(config.hidden_size))
            state = int(config.mamba_n_groups) * int(config.mamba_d_state)
        sizes = {"z": inner, "x": inner, "b": state, "c": state, "dt": heads}
        if sum(sizes.values()) != out_features:
            raise UnsupportedArchitectureError(
                f"fused projection {fused.module} has {out_features} outputs, expected {sum(sizes.values())} "
                "from the config's Mamba2 heads, groups and state size")
        start = sum(list(sizes.values())[:list(sizes).index(fused.part)])
        return torch.arange(start, start + sizes[fused.part])
    n_heads = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    hd = _head_dim(config)
    if fused.layout == "q_gate_per_head":  # per head [q_h | gate_h]
        if 2 * n_heads * hd != out_features:
            raise UnsupportedArchitectureError(
                f"fused projection {fused.module}: per-head q/gate layout needs 2*heads*head_dim="
                f"{2 * n_heads * hd} outputs, found {out_features}")
        return torch.arange(out_features).view(n_heads, 2, hd)[:, ("q", "gate").index(fused.part)].reshape(-1)
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


def _per_key_head(fused: Fused, config: Any, out_features: int) -> torch.Tensor:
    """A part's columns where a projection is grouped by linear-attention key head, each group the
    head's q and k and the v and z (or b and a) of the value heads it serves."""
    n_k, n_v = int(config.linear_num_key_heads), int(config.linear_num_value_heads)
    per = n_v // n_k  # value heads per key head
    if fused.layout == "qkvz_per_key_head":
        head_k, head_v = int(config.linear_key_head_dim), int(config.linear_value_head_dim)
        sizes = {"q": head_k, "k": head_k, "v": per * head_v, "z": per * head_v}
    else:
        sizes = {"b": per, "a": per}
    width = sum(sizes.values())
    if n_k * width != out_features:
        raise UnsupportedArchitectureError(
            f"fused projection {fused.module} has {out_features} outputs, expected {n_k * width} from the config's "
            "linear-attention heads")
    start = sum(list(sizes.values())[:list(sizes).index(fused.part)])
    return torch.arange(out_features).view(n_k, width)[:, start:start + sizes[fused.part]].reshape(-1)


def _has_parameters(module: nn.Module) -> bool:
    return bool(graftable_state(module))


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
    adapter = adapter_for(projections.hf_config(model))
    config = text_config(projections.hf_config(model))  # heads and sizes: the grafted decoder's
    try:
        layers = cast(nn.ModuleList, model.get_submodule(adapter.layers))  # HF's decoder blocks
    except AttributeError as exc:
        raise UnsupportedArchitectureError(
            f"{config.model_type}: expected decoder blocks at {adapter.layers!r}: {exc}"
        ) from exc

    def part(path: str, pos_axis: int = 1, columns: torch.Tensor | None = None,
             tensors: tuple[str, ...] | None = None) -> Part:
        try:
            module = model.get_submodule(path)
        except AttributeError as exc:
            raise UnsupportedArchitectureError(
                f"{config.model_type}: expected module {path!r}: {exc}"
            ) from exc
        missing = [n for n in tensors or () if not isinstance(getattr(module, n, None), torch.Tensor)]
        if missing:
            raise UnsupportedArchitectureError(f"{config.model_type}: expected tensor {path}.{missing[0]}")
        return Part(path=path, columns=columns, pos_axis=pos_axis, tensors=tensors)

    n_heads = int(config.num_attention_heads)
    embeds = [p for p in adapter.embed if p not in adapter.optional or _holds(model, p)]
    out = [Slot("embed", tuple(part(p) for p in embeds))]
    if adapter.pos_embed is not None:
        out.append(Slot("pos_embed", (part(adapter.pos_embed),)))
    for i in range(len(layers)):
        prefix = f"{adapter.layers}.{i}"
        kind = None if adapter.blocks is None else str(getattr(config, adapter.blocks.attribute)[i])
        components, axes = _layer_kind(adapter, layers[i], kind)
        mixer = _mixer_of(adapter, layers[i], kind)
        n_kv = _kv_heads(config, i)
        for comp in LAYER_COMPONENTS:
            spec = components.get(comp)
            if spec is None or _registered_none(layers[i], spec if isinstance(spec, str) else spec.module):
                continue
            if comp in adapter.optional and not _holds(layers[i], spec if isinstance(spec, str) else spec.module):
                continue
            axis = axes.get(comp, 1)
            if mixer is not None and comp in mixer.components:
                if isinstance(spec, str) and not _has_parameters(model.get_submodule(f"{prefix}.{spec}")):
                    continue  # a part the config leaves without weights (Falcon-H1's norm where mamba_rms_norm is off)
                site = MixerSite(f"{prefix}.{mixer.module}", mixer.kind, comp)
                if isinstance(spec, Tensors):
                    bound_part = part(f"{prefix}.{spec.module}", tensors=spec.names)
                elif isinstance(spec, Fused):
                    path = f"{prefix}.{spec.module}"
                    bound_part = part(path, columns=fused_columns(spec, config, _out_features(model.get_submodule(path))))
                else:
                    bound_part = part(f"{prefix}.{spec}")
                out.append(Slot(f"layers.{i}.{comp}", (bound_part,), mixer=site))
                continue
            if isinstance(spec, Tensors):  # outside a mixer: attention sinks, a block's output scale
                if comp not in ("sinks", "layer_scalar"):
                    raise UnsupportedArchitectureError(f"{config.model_type}: no forward computes tensors as {comp!r}")
                path = f"{prefix}.{spec.module}" if spec.module else prefix
                out.append(Slot(f"layers.{i}.{comp}", (part(path, tensors=spec.names),),
                                sinks=comp == "sinks", scalar=comp == "layer_scalar"))
                continue
            if comp == "experts":
                path = f"{prefix}.{spec}"
                n_experts = int(next(model.get_submodule(path).parameters()).shape[0])
                out.append(Slot(f"layers.{i}.{comp}", (part(path, FLAT),), experts=n_experts))
                continue
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
                    args = adapter.experts.router_args if comp == "router" and adapter.experts is not None else None
                    extra = () if args is None else (part(f"{prefix}.{args.module}", tensors=args.names),)
                    out.append(Slot(f"layers.{i}.{comp}", (bound, *extra), heads, side, neurons, n_side,
                                    router=comp == "router"))
    if adapter.final_norm is not None and _has_parameters(model.get_submodule(adapter.final_norm)):
        out.append(Slot("final_norm", (part(adapter.final_norm),)))
    out.append(Slot("unembed", (part(adapter.unembed),)))
    _check_coverage(model, out, adapter.outside)
    return out


def _kv_heads(config: Any, layer: int) -> int:
    """Layer ``layer``'s key / value heads: the config's, or the layer's own where the config
    gives some layers other shapes (Gemma 4's full-attention layers: ``per_layer_config``)."""
    per_layer = getattr(config, "per_layer_config", None)
    own = per_layer[layer] if per_layer is not None else config
    return int(getattr(own, "num_key_value_heads", None) or config.num_attention_heads)


def _mixer_of(adapter: Adapter, block: nn.Module, kind: str | None) -> Mixer | None:
    """The adapter's mixer where this block is a mixer layer: of the mixer kind where the family's
    blocks have kinds (Nemotron-H: every block holds a ``mixer``), else where the block holds it."""
    mixer = adapter.mixer
    if mixer is None:
        return None
    here = kind == adapter.blocks.mixer if adapter.blocks is not None else _holds(block, mixer.module)
    return mixer if here else None


def _layer_kind(adapter: Adapter, block: nn.Module, kind: str | None) -> tuple[dict[str, str | Fused | Tensors], dict[str, int]]:
    """A layer's components and their position axes: a mixer layer's mixer components in place of
    attention where the adapter declares a mixer and this block holds it; a mixture-of-experts
    layer where the adapter declares experts and this block holds the bank (its router, bank and
    shared experts in place of gate / up / down); the adapter's dense components elsewhere. A
    family with block kinds (``kind``) takes that kind's components."""
    base: dict[str, str | Fused | Tensors] = dict(
        adapter.components if adapter.blocks is None or kind is None else adapter.blocks.kinds[kind])
    mixer = _mixer_of(adapter, block, kind)
    if mixer is not None:
        kept = base if mixer.beside_attention else {k: v for k, v in base.items() if k not in ATTENTION_COMPONENTS}
        base = kept | mixer.components
    moe = adapter.experts
    if moe is None or not _holds(block, moe.experts):
        return base, adapter.pos_axis
    components = {k: v for k, v in base.items() if k not in ("gate", "up", "down")}
    components.update({"router": moe.router, "experts": moe.experts, **moe.shared})
    axes = {**adapter.pos_axis, "router": FLAT if moe.router_flat else 1}
    axes.update({k: FLAT if moe.shared_flat else 1 for k in moe.shared})
    return components, axes


def _registered_none(block: nn.Module, path: str) -> bool:
    """Whether the block sets ``path`` (or a module above it) to None: a variant without that
    component (DeepSeek's ``q_proj`` where the query is low-rank, ``q_a_proj`` where it is not,
    Granite's shared MLP where its width is 0). A path never set is still an error."""
    module = block
    for name in path.split("."):
        if name in module._modules:
            child = module._modules[name]
        elif name in module.__dict__ and module.__dict__[name] is None:
            return True
        else:
            return False
        if child is None:
            return True
        module = child
    return False


def _holds(block: nn.Module, path: str) -> bool:
    try:
        block.get_submodule(path)
    except AttributeError:
        return False
    return True


def graftable_state(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A module's parameters and persistent buffers, by name: the state a graft takes from the
    model serving it (a router's routing-score correction bias is a buffer, and changes routing)."""
    params = list(module.named_parameters(remove_duplicate=False))
    buffers = [(f"{path}.{name}" if path else name, buffer)  # read from the modules: state_dict() would
               for path, sub in module.named_modules(remove_duplicate=False)  # run quantized layers' packing
               for name, buffer in sub._buffers.items()
               if buffer is not None and name not in sub._non_persistent_buffers_set]
    return [*params, *buffers]


def part_state(model: nn.Module, part: Part) -> list[tuple[str, torch.Tensor]]:
    """The tensors a part owns, by name inside its module: the module's graftable state, or the
    ``part.tensors`` of it that the part names (a mixer's ``A_log`` / ``dt_bias``)."""
    state = graftable_state(model.get_submodule(part.path))
    return state if part.tensors is None else [(n, t) for n, t in state if n in part.tensors]


def _check_coverage(model: nn.Module, slots_: list[Slot], outside: tuple[str, ...]) -> None:
    """Every parameter and persistent buffer must belong to a slot, or some weights would silently
    never graft; those ``outside`` the language model (a vision tower) are reached by no text prompt."""
    covered: set[str] = set()
    for slot in slots_:
        for p in slot.parts:
            covered.update(f"{p.path}.{n}" for n, _ in part_state(model, p))
    for name, _ in graftable_state(model):
        if name not in covered and not any(name == root or name.startswith(f"{root}.") for root in outside):
            raise UnsupportedArchitectureError(
                f"{projections.hf_config(model).model_type}: parameter or buffer {name!r} belongs to no "
                "graftable component; this model variant (a config option or a custom module) is not "
                "supported by its adapter"
            )
