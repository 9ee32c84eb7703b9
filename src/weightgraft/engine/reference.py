"""The definition of dynamic weight grafting, run literally (the paper's Appendix B).

Token by token with the model's own cache (keys and values; a hybrid's conv and recurrent
states): position t is processed by a model whose weights, slot by slot, are copied from the
model that ``source`` names for t, so every state carries earlier positions as their own models
computed them (multi-head latent attention's cache holds each position's keys and values as that
position's ``kv_b`` decompressed them: ``weightgraft.engine.attention.latent``). It is slow on purpose and
shares no code path with ``weightgraft.engine.forward`` beyond the slot table and the source map's
one check (``SourceMap.checked``), so that it can serve as the oracle the engine is tested (and
``weightgraft check``-ed) against.

A quantized module (bitsandbytes nf4/fp4/int8, torchao) cannot be copied entry by entry (its
scales live beside the packed weight): in the private copy it becomes a ``_Routed`` module that
calls the quantized module of the model serving it (per output column, for a fused projection's
q/k/v or a head's columns), so each token still runs on its own model's weights, never dequantized.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn
from transformers import DynamicCache

from weightgraft.engine import lora, projections
from weightgraft.engine.architectures import Slot, model_slots
from weightgraft.engine.architectures.slots import graftable_state, part_state
from weightgraft.engine.attention.latent import decompressed_forward, latent_attention_paths
from weightgraft.engine.compat import check_compatible
from weightgraft.engine.mixers.mamba2 import decode_step_floor
from weightgraft.engine.moe import HELD_ATTR
from weightgraft.engine.precision import batch_invariant_attention, one_cpu_path
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError, GraftArgumentTypeError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["per_token_forward", "per_token_mixed_forward", "CompositeModel"]


class _Weighted(Protocol):
    weight: torch.Tensor


class _LM(Protocol):
    """What is read here of a transformers causal LM (see :func:`_lm`)."""

    config: PretrainedConfig
    dtype: torch.dtype

    def get_output_embeddings(self) -> _Weighted: ...


def _lm(model: nn.Module) -> _LM:
    # nn.Module's stubs type a model's attributes as ``Tensor | Module``, and transformers
    # leaves ``get_output_embeddings`` unannotated
    return cast(_LM, model)


def _weight(module: nn.Module) -> torch.Tensor:
    return cast(torch.Tensor, module.weight)  # nn.Module's stubs type a parameter as ``Tensor | Module``


def _bias(module: nn.Module) -> torch.Tensor | None:
    return cast("torch.Tensor | None", module.bias)  # as ``_weight``


class CompositeModel:
    """A private copy of the base model whose slots can be reloaded from any model."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        check_compatible(models)
        one_cpu_path(models)
        quantized = {part.path for slot in model_slots(models[0]) for part in slot.parts
                     if any(projections.is_quantized(m.get_submodule(part.path)) for m in models)}
        for i, m in enumerate(models):
            # a LoRA module's .weight is the base's: copying it drops the adapter. Over a quantized
            # layer (QLoRA) the module is routed whole, adapter included, so it stays as it is
            plain_lora = [n for n, mod in m.named_modules() if lora.is_lora(mod) and n not in quantized]
            if plain_lora:
                raise lora.UnsupportedLora(
                    f"models[{i}] carries LoRA adapters ({plain_lora[0]}); the per-token definition copies plain "
                    "weights: give it a merged copy (weightgraft.models.peft_donor.merged_copy)"
                )
        self.models = list(models)
        shared = {id(models[0].get_submodule(path)): nn.Identity() for path in quantized}
        self.model = copy.deepcopy(models[0], memo=shared)  # quantized modules are not copied
        for path in quantized:
            self.model.set_submodule(path, _Routed([m.get_submodule(path) for m in models]))
        for mod in self.model.modules():  # deepcopy copies forward hooks too: drop them
            mod._forward_hooks.clear()
            mod._forward_pre_hooks.clear()
        self.model.eval()
        self.slots: list[Slot] = model_slots(models[0])  # paths only; a _Routed module has no parameters
        for path in latent_attention_paths(self.slots):  # MLA: each step caches its own position's keys and
            attn = self.model.get_submodule(path)  # values as its kv_b made them, not a latent for later kv_b's
            attn.forward = decompressed_forward(attn)  # type: ignore[method-assign]
        self._untie()
        self.current = [0] * len(self.slots)  # the copy holds the base's weights

    def _untie(self) -> None:
        """Give every slot its own tensors: with tied embeddings, loading ``embed`` from a donor
        must not move ``unembed``."""
        owner: dict[int, str] = {}  # parameter -> the module path that first held it
        for slot in self.slots:
            for part in slot.parts:
                module = self.model.get_submodule(part.path)
                for pname, param in list(module.named_parameters(recurse=False)):
                    if owner.setdefault(id(param), part.path) != part.path:
                        setattr(module, pname, nn.Parameter(param.detach().clone()))

    @torch.no_grad()
    def load(self, sources: Sequence[int], heads: Mapping[int, Sequence[int]] | None = None) -> None:
        """Copy every slot's weights from ``models[sources[s]]`` (only slots that change);
        ``heads[s]`` (per unit model indices: heads of q/k/v/o, neurons of gate/up/down) then
        overrides slot ``s`` unit by unit."""
        heads = heads or {}
        for s, (slot, m) in enumerate(zip(self.slots, sources)):
            if s in heads:
                self._load_heads(slot, m, list(heads[s]))
                self.current[s] = -1  # mixed: reload next time
                continue
            if self.current[s] == m:
                continue
            for part in slot.parts:
                dst = self.model.get_submodule(part.path)
                src = self.models[m].get_submodule(part.path)
                if isinstance(dst, _Routed):
                    dst.serve(m, part.columns)
                elif part.columns is None:  # parameters and persistent buffers (a router's bias), or
                    src_state = dict(part_state(self.models[m], part))  # the tensors it names (A_log)
                    for name, p in part_state(self.model, part):
                        p.copy_(src_state[name])
                else:
                    _copy_columns(dst, src, part.columns)
            self.current[s] = m


    def _load_heads(self, slot: Slot, whole: int, head_models: list[int]) -> None:
        """q/k/v (gate/up): each head's (neuron's) output columns, bias included, from its
        model; o (down): each head's (neuron's) input columns from its model, the bias from
        ``whole``. The columns of all units served by one model are copied at once."""
        (part,) = slot.parts
        dst = self.model.get_submodule(part.path)
        if slot.experts:  # expert e is index e of every tensor of the bank
            for e, m in enumerate(head_models):
                src_state = dict(graftable_state(self.models[m].get_submodule(part.path)))
                for name, p in graftable_state(dst):
                    p[e] = src_state[name][e]
            return
        kind = slot.unit_kind()
        assert kind is not None  # only unit slots are loaded unit by unit
        cols = torch.stack(slot.unit_columns(self.models[0].get_submodule(part.path), kind))  # [units, width]
        chosen = torch.tensor(head_models)
        for m in torch.unique(chosen).tolist():
            src = self.models[m].get_submodule(part.path)
            mine = cols[chosen == m].reshape(-1)
            if isinstance(dst, _Routed):  # input columns of a packed weight: in_index refuses
                dst.serve(m, mine) if slot.unit_side(kind) == "out" else projections.in_index(src, mine)
            elif slot.unit_side(kind) == "out":
                _copy_columns(dst, src, mine)
            else:
                index = projections.in_index(dst, mine)
                _weight(dst)[index] = _weight(src)[index]
        if slot.unit_side(kind) == "in" and (bias := _bias(dst)) is not None:  # compatible models: the donor has one
            bias.copy_(cast(torch.Tensor, _bias(self.models[whole].get_submodule(part.path))))


class _Routed(nn.Module):
    """A quantized module of the private copy: each call goes through the quantized module of
    the model serving each output column (``chosen``), the whole output of one model when one
    serves them all; attributes it lacks are read from the base's module."""

    def __init__(self, targets: list[nn.Module]) -> None:
        super().__init__()
        self.targets = targets  # a plain list: the models' modules are not submodules of the copy
        self.chosen = torch.zeros(projections.out_features(targets[0]), dtype=torch.long)

    def __getattr__(self, name: str) -> Any:  # ``.weight``, ``.in_features``, ... of the base's module
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["targets"][0], name)

    def serve(self, m: int, columns: torch.Tensor | None) -> None:
        """Model ``m`` serves output ``columns`` (all of them for None)."""
        self.chosen[slice(None) if columns is None else columns.cpu()] = m

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        present = torch.unique(self.chosen).tolist()
        if len(present) == 1:
            whole: torch.Tensor = self.targets[present[0]](x, *args, **kwargs)
            return whole
        out: torch.Tensor | None = None
        for m in present:
            y: torch.Tensor = self.targets[m](x, *args, **kwargs)
            keep = (self.chosen == m).to(y.device)
            out = y if out is None else torch.where(keep, y, out)
        assert out is not None  # several models serve
        return out


def _copy_columns(dst: nn.Module, src: nn.Module, cols: torch.Tensor) -> None:
    index = projections.out_index(dst, cols)
    _weight(dst)[index] = _weight(src)[index]
    bias = _bias(dst)
    if bias is not None:
        bias[cols] = cast(torch.Tensor, _bias(src))[cols]  # compatible models: the donor has one


@torch.no_grad()
def per_token_forward(
    models: Sequence[nn.Module],
    input_ids: torch.Tensor,
    source: SourceMap | torch.Tensor,
    *, attention_mask: torch.Tensor | None = None,
    composite: CompositeModel | None = None,
    copy_per_position: bool = False,
) -> torch.Tensor:
    """Logits ``[batch, seq, vocab]`` by the per-token definition. Each row is run alone
    without its padding; padded positions of the result are zero. ``source`` is the engine's
    one input, a :class:`SourceMap` (a bare tensor: whole slots only), checked as the engine
    checks it (:meth:`SourceMap.checked`); its unit maps load a slot unit by unit (an expert bank
    expert by expert), as ``graft_forward`` reads them.

    ``copy_per_position=True`` is the authors' procedure verbatim: a fresh copy of the base
    model, with the grafted weights swapped in, for every position (slow; for benchmarks).
    By default one private copy is kept and only the slots that change are reloaded.
    """
    for i, m in enumerate(models):  # the reference copies whole banks: a compact one cannot serve it
        if any(getattr(sub, HELD_ATTR, None) is not None for sub in m.modules()):
            raise GraftArgumentError(f"models[{i}] is a lean donor holding some experts of a bank: the per-token "
                                     "reference copies whole banks, so load that donor whole")
    composite = composite or CompositeModel(models)
    model = composite.model
    # the private copy attends as the engine does (eager in half precision), so the comparison
    # measures the graft, not two attention kernels' rounding
    batch_invariant_attention([model])
    batch, seq = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    vocab = _lm(model).get_output_embeddings().weight.shape[0]
    device = input_ids.device
    out = torch.zeros(batch, seq, vocab, dtype=_lm(model).dtype, device=device)
    maps = SourceMap.of(source).checked(composite.slots, batch, seq, n_models=len(models), device=device)
    with decode_step_floor([model]):  # Mamba2: each one-token step floored as the batched scan is
        for b in range(batch):
            real = attention_mask[b].bool().nonzero().flatten()
            cache = DynamicCache(config=_lm(model).config)
            for step, t in enumerate(real.tolist()):
                if copy_per_position:
                    composite = CompositeModel(models)
                    model = composite.model
                composite.load(maps.slots[b, t].tolist(), {s: h[b, t].tolist() for s, h in maps.units.items()})
                logits = model(
                    input_ids=input_ids[b : b + 1, t : t + 1],
                    position_ids=torch.tensor([[step]], device=device),
                    attention_mask=torch.ones(1, step + 1, dtype=torch.long, device=device),
                    past_key_values=cache,
                    use_cache=True,
                ).logits
                out[b, t] = logits[0, -1]
    return out


@torch.no_grad()
def _load_mixed(composite: CompositeModel, alphas: Sequence[float]) -> None:
    """Every slot's weights set to ``(1 - a) * models[0] + a * models[1]`` (its columns only,
    for a column group of a fused projection)."""
    base, donor = composite.models[0], composite.models[1]
    for s, (slot, a) in enumerate(zip(composite.slots, alphas)):
        composite.current[s] = -1  # mixed: a later ``load`` reloads it
        for part in slot.parts:
            dst = composite.model.get_submodule(part.path)
            if isinstance(dst, _Routed):
                raise GraftArgumentTypeError(
                    f"{part.path} is quantized: (1 - a) * W_base + a * W_donor is not defined in its "
                    "packed layout; graft it whole (a = 0 or 1), or load both models unquantized"
                )
            p0 = dict(base.get_submodule(part.path).named_parameters(remove_duplicate=False))
            p1 = dict(donor.get_submodule(part.path).named_parameters(remove_duplicate=False))
            for name, p in dst.named_parameters(remove_duplicate=False):
                mixed = (1 - a) * p0[name] + a * p1[name]
                if part.columns is None:
                    p.copy_(mixed)
                elif name == "weight":
                    index = projections.out_index(dst, part.columns)
                    p[index] = mixed[index]
                else:  # every bias: output columns
                    p[part.columns] = mixed[part.columns]


@torch.no_grad()
def per_token_mixed_forward(
    models: Sequence[nn.Module], input_ids: torch.Tensor, alpha: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits ``[batch, seq, vocab]`` by the per-token definition with mixed weights: position
    t of row b runs on a model whose slot s holds ``(1 - alpha[b, t, s]) * W_base +
    alpha[b, t, s] * W_donor`` (``models = [base, donor]``), copied in before the step."""
    if len(models) != 2:
        raise GraftArgumentError("mixed weights need exactly two models: [base, donor]")
    composite = CompositeModel(models)
    model = composite.model
    batch, seq = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    vocab = _lm(model).get_output_embeddings().weight.shape[0]
    out = torch.zeros(batch, seq, vocab, dtype=_lm(model).dtype, device=input_ids.device)
    for b in range(batch):
        real = attention_mask[b].bool().nonzero().flatten()
        cache = DynamicCache(config=_lm(model).config)
        for step, t in enumerate(real.tolist()):
            _load_mixed(composite, alpha[b, t].tolist())
            logits = model(
                input_ids=input_ids[b : b + 1, t : t + 1],
                position_ids=torch.tensor([[step]], device=input_ids.device),
                attention_mask=torch.ones(1, step + 1, dtype=torch.long, device=input_ids.device),
                past_key_values=cache,
                use_cache=True,
            ).logits
            out[b, t] = logits[0, -1]
    return out
