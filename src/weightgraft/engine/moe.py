"""A mixture-of-experts layer in the one batched pass: its router and its expert bank, each
position served by the model the source map names, expert by expert where asked.

The per-token definition: at position p the router (its weights and buffers) is the model's that
serves ``router`` at p, and each expert the router picks at p computes with the weights of the
model that serves that expert at p (``expert_source``; the ``experts`` slot's map where none is
given); an expert the router does not pick contributes nothing, whoever would serve it. Routing
has no coupling across tokens at inference (no capacity limit in the families admitted), so each
row of the flattened ``[batch * seq]`` rows the router and the bank see is computed on its own:
rows are split by the model that serves them, and a row whose picked experts come from several
models is the sum of each model's bank over its own picks (the others' routing weight zero,
never a sentinel index).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from weightgraft.engine.architectures import Slot
from weightgraft.engine.architectures.units import FLAT
from weightgraft.engine.swaps import Swaps, own_forward
from weightgraft.errors import GraftArgumentError

__all__ = ["HELD_ATTR", "held_experts", "hold_experts", "by_position", "experts_forward", "from_positions", "router_forward",
           "swap_banks"]


def _callers(targets: list[nn.Module]) -> list[Callable[..., Any]]:
    """Per model, what computes its rows: the base module's own (about to be swapped) forward."""
    return [own_forward(t) if i == 0 else t for i, t in enumerate(targets)]


def router_forward(targets: list[nn.Module], models: torch.Tensor,
                   passed: list[tuple[torch.Tensor, ...]] | None = None) -> Callable[..., Any]:
    """A forward for the base's router: ``models`` ``[batch, seq]`` names the model whose router
    serves each position; the outputs (logits, top-k weights, top-k indices) are ``[batch * seq,
    ...]`` rows, whether the router sees flattened rows or ``[batch, seq, hidden]``. ``passed``:
    per model, the block's tensors the block hands its router after the states (LFM2-MoE's
    ``expert_bias``), so a row's routing takes them from the model serving it, not the base's block."""
    fns = _callers(targets)
    flat = models.reshape(-1)
    present = torch.unique(flat).tolist()
    rows = {m: (flat == m).nonzero().flatten() for m in present}

    def own(m: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return args if passed is None else (*passed[m], *args[len(passed[m]):])

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if len(present) == 1:
            return fns[present[0]](x, *own(present[0], args), **kwargs)
        states = x.reshape(flat.numel(), x.shape[-1])
        outs: list[torch.Tensor] | None = None
        for m in present:
            r = rows[m].to(states.device)
            got = fns[m](states[r], *own(m, args), **kwargs)
            if outs is None:
                outs = [t.new_empty(flat.numel(), *t.shape[1:]) for t in got]
            for out, t in zip(outs, got, strict=True):
                out[r] = t
        assert outs is not None  # some model serves
        return tuple(outs)

    return forward


def experts_forward(targets: list[nn.Module], models: torch.Tensor,
                    expert_models: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    """A forward for the base's expert bank ``(states, top_k_index, top_k_weights)`` on
    ``[batch * seq]`` rows: ``models`` ``[batch, seq]`` serves every expert of a position, or
    ``expert_models`` ``[batch, seq, experts]`` expert by expert."""
    fns = _callers(targets)
    n_rows = models.numel()
    per_expert = None if expert_models is None else expert_models.reshape(n_rows, -1)
    whole = models.reshape(-1)

    def forward(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, *args: Any,
                **kwargs: Any) -> torch.Tensor:
        if per_expert is None:  # each picked expert from the model serving the row
            chosen = whole.to(x.device)[:, None].expand_as(top_k_index)
        else:
            chosen = per_expert.to(x.device).gather(1, top_k_index)
        present = torch.unique(chosen).tolist()
        if len(present) == 1:
            single: torch.Tensor = fns[present[0]](x, top_k_index, top_k_weights, *args, **kwargs)
            return single
        uniform = (chosen == chosen[:, :1]).all(dim=1)
        out: torch.Tensor | None = None
        for m in present:
            r = (uniform & (chosen[:, 0] == m)).nonzero().flatten()
            if r.numel():
                y = fns[m](x[r], top_k_index[r], top_k_weights[r], *args, **kwargs)
                out = y.new_zeros(n_rows, *y.shape[1:]) if out is None else out
                out[r] = y
        mixed = (~uniform).nonzero().flatten()
        if mixed.numel():
            picks = chosen[mixed]
            total: torch.Tensor | None = None
            for m in torch.unique(picks).tolist():
                weights = torch.where(picks == m, top_k_weights[mixed], torch.zeros_like(top_k_weights[mixed]))
                y = fns[m](x[mixed], top_k_index[mixed], weights, *args, **kwargs)
                total = y if total is None else total + y
            assert total is not None  # mixed rows have picks
            out = total.new_zeros(n_rows, *total.shape[1:]) if out is None else out
            out[mixed] = total
        assert out is not None  # every row is uniform or mixed
        return out

    return forward


def swap_banks(swap: Swaps, targets: Callable[[str], list[nn.Module]], base: nn.Module, slot_list: list[Slot],
               columns: list[torch.Tensor], banks: dict[int, torch.Tensor], donors: list[bool]) -> set[str]:
    """Every router and expert bank some donor serves somewhere (``banks``: expert by expert) runs
    its batched forward for the block; returns their module paths."""
    taken: set[str] = set()
    for s, slot in enumerate(slot_list):
        if (slot.router or slot.experts) and (donors[s] or (s in banks and bool(banks[s].ne(0).any()))):
            path = slot.parts[0].path
            forward = (router_forward(targets(path), columns[s], _passed(targets, slot)) if slot.router
                       else experts_forward(targets(path), columns[s], banks.get(s)))
            swap.forward(base.get_submodule(path), forward)
            taken.update(p.path for p in slot.parts)
    return taken


def _passed(targets: Callable[[str], list[nn.Module]], slot: Slot) -> list[tuple[torch.Tensor, ...]] | None:
    """Per model, the router slot's tensors its block passes to the router (``Experts.router_args``)."""
    extra = [p for p in slot.parts[1:] if p.tensors]
    if not extra:
        return None
    (part,) = extra
    assert part.tensors is not None  # filtered above
    return [tuple(getattr(block, n) for n in part.tensors) for block in targets(part.path)]


def by_position(x: torch.Tensor, pos_axis: int, rows: torch.Size) -> torch.Tensor:
    """``x`` with the token position on axis 1 (``[batch, seq, ...]``): moved there, or, for a
    module that sees ``[batch * seq, ...]`` rows (``FLAT``: a shared expert), unflattened."""
    if pos_axis == FLAT:
        return x.view(*rows, *x.shape[1:])
    return x if pos_axis == 1 else x.movedim(pos_axis, 1)


def from_positions(out: torch.Tensor, pos_axis: int) -> torch.Tensor:
    """:func:`by_position` undone on a module's output."""
    if pos_axis == FLAT:
        return out.flatten(0, 1)
    return out if pos_axis == 1 else out.movedim(1, pos_axis)


# A lean donor's expert bank holding some experts only (``hold_experts``): their global indices.
HELD_ATTR = "weightgraft_held_experts"


def held_experts(module: nn.Module) -> tuple[int, ...] | None:
    """The experts a compact bank holds (global indices, ascending), None for a whole bank."""
    return getattr(module, HELD_ATTR, None)


def hold_experts(module: nn.Module, held: tuple[int, ...], tensors: dict[str, torch.Tensor], n_experts: int) -> None:
    """Make ``module`` (a lean donor's own copy of a bank) hold only experts ``held``: its tensors
    become ``tensors`` (name -> ``[len(held), ...]``, expert i of the tensor being ``held[i]``) and
    each call maps the router's global picks to them. A pick of an expert it does not hold with a
    nonzero routing weight is refused in one line (the engine gives a donor's bank nonzero weights
    only for the experts it serves); with weight zero it goes to one zero expert appended after
    the held ones, computed apart from them, so it adds exactly 0 and changes no held expert's
    rows: a compact bank gives the whole bank's output bit for bit."""
    if list(held) != sorted(set(held)) or not held or held[-1] >= n_experts or held[0] < 0:
        raise GraftArgumentError(f"held experts {held} must be distinct, ascending and in 0..{n_experts - 1}")
    for name, tensor in tensors.items():
        if tensor.shape[0] != len(held):
            raise GraftArgumentError(f"{name}: {tensor.shape[0]} experts given for {len(held)} held")
        current = getattr(module, name)
        padded = torch.cat([tensor, tensor.new_zeros(1, *tensor.shape[1:])])  # the zero expert, last
        setattr(module, name, nn.Parameter(padded, requires_grad=False) if isinstance(current, nn.Parameter) else padded)
    local = torch.full((n_experts,), len(held), dtype=torch.long)
    local[list(held)] = torch.arange(len(held))
    mask = torch.zeros(n_experts, dtype=torch.bool)
    mask[list(held)] = True
    if hasattr(module, "num_experts"):
        setattr(module, "num_experts", len(held) + 1)  # noqa: B010 - an int attribute nn.Module's stubs type as Tensor | Module

    def remap(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        positional = list(args)
        index = positional[1] if len(positional) > 1 else kwargs["top_k_index"]
        weights = positional[2] if len(positional) > 2 else kwargs["top_k_weights"]
        ok = mask.to(index.device)[index]
        if bool((~ok & (weights != 0)).any()):
            missing = sorted(set(index[~ok & (weights != 0)].tolist()))
            raise GraftArgumentError(f"this lean donor's bank holds experts {list(held)}, not {missing}: load the "
                                     "donor whole, or graft only the experts it was made for")
        index, weights = local.to(index.device)[index], torch.where(ok, weights, torch.zeros_like(weights))
        if len(positional) > 2:
            positional[1], positional[2] = index, weights
        else:
            kwargs = {**kwargs, "top_k_index": index, "top_k_weights": weights}
        return tuple(positional), kwargs

    module.register_forward_pre_hook(remap, with_kwargs=True)
    setattr(module, HELD_ATTR, tuple(held))

