"""Memory and time of a localize run, from the shapes of its work: both models whole, the
partial graft's deltas, one attribution batch (and, with ``units: head | neuron``, every unit's
share, gradient and running total), the exact-effect passes with the states depth sharing
holds beside them (``weightgraft.planning.depth_states``), and the cell tables it keeps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from torch import nn

from weightgraft.engine.architectures import Units, model_slots
from weightgraft.engine.partial import refuse_non_affine
from weightgraft.errors import GraftArgumentTypeError, WeightgraftError
from weightgraft.models.footprint import ModelFootprint
from weightgraft.models.spec import parse_spec
from weightgraft.planning.budget import budget
from weightgraft.planning.cards import Card
from weightgraft.planning.costs import (
    adapter_bytes,
    attribution_bytes,
    delta_bytes,
    dtype_bytes,
    inference_bytes,
    param_bytes,
)
from weightgraft.planning.depth_states import depth_state_bytes
from weightgraft.planning.graftable import check_graftable
from weightgraft.planning.lengths import length_summary, refuse_media, tokenizer_for
from weightgraft.planning.plan import HEADROOM, Plan, RolePlan, choose_batch, smaller_batch
from weightgraft.planning.run import DEQUANTIZED, dequantized_bytes, role_notes
from weightgraft.planning.sizes import gib
from weightgraft.planning.timing import (
    attribution_seconds,
    card_for,
    exact_cell_seconds,
    forward_seconds,
    rate_for,
    weight_read_seconds,
)

__all__ = ["CELL_ROW_BYTES", "DEFAULT_LOCALIZE_BATCH", "DEPTH_STATES", "EXACT_BATCH", "GRAFT_MAPS", "UNIT_ROW_BYTES",
           "UNIT_SHARE_COPIES", "LocalizeWork", "plan_localize_work", "unit_width"]

DEFAULT_LOCALIZE_BATCH = 16  # LocalizeConfig.batch_size's default
# Bytes one cell row costs while localize holds its tables: the row in the estimate frame
# (ids, template and label strings, layer, slot, unit, estimates: ~60 bytes with pandas' object
# columns), again in the parquet round trip and the join with the exact frame.
CELL_ROW_BYTES = 120
# A unit row kept per prompt before it becomes a frame: a Python tuple of position, slot name,
# unit and estimate(s), then its frame row.
UNIT_ROW_BYTES = 200
# Unit-sized tensors at the peak of one attribution batch: the shares, their gradient, the
# running total and the result (``engine.attribution``), and the backward's per-module scratch
# (measured: 4.8 copies, neuron attribution of 8 x 32 tokens on a 4-layer random Llama with
# 2048 neurons a layer, tests/planning/test_plan.py); integrated gradients keep the plain result too.
UNIT_SHARE_COPIES = 5
# The plan's memory lines of exact effects (``Plan.memory`` keys).
EXACT_BATCH = "batch (attribution or exact cells)"
DEPTH_STATES = "depth-shared states (exact effects)"
GRAFT_MAPS = "graft maps (exact effects)"
EXACT_MAP_GROUP = 8  # prompts per exact_effects call of the exact maps (``localization.exact_parts``)
HALF = ("float16", "bfloat16")  # depth sharing runs these through prefix sharing: no shared states


@dataclass(frozen=True, kw_only=True)
class SftModel:
    """One SFT model of the work: its label and spec; a LoRA donor names its adapter."""

    label: str
    spec: str
    adapter: str | None = None  # a LoRA donor's adapter directory: it holds that, on pre's tensors


@dataclass(frozen=True, kw_only=True)
class LocalizeWork:
    """What a localize config asks for, as the plan needs it (built by
    ``weightgraft.localization.run.plan_input``)."""

    pre: str
    sfts: list[SftModel]
    prompts: list[str]  # every prompt mapped by attribution
    exact_prompts: list[str]  # those also mapped cell by cell, exactly
    # reference rows the largest ``exact_effects`` call shares: its prompts' bases (an exact-map
    # group's), and their sets' unions where sets are searched, refined, controlled or claimed;
    # 0: no stage computes exact effects
    exact_references: int = 0
    # the most (prompt, set) rows one call of the search's stages or the claims grafts
    set_rows: int = 0
    # the prompts the claims graft (per SFT model and direction); their sets per prompt that graft
    # whole positions (recomputed, with prefix sharing, from about the middle of the prompt on) and
    # those at the last token only (one position recomputed), beside the layer blocks (counted
    # from the model's depth)
    claim_prompts: list[str] = field(default_factory=list)
    claim_position_sets: int = 0
    claim_last_sets: int = 0
    # the search's exact set grafts, per SFT searched and direction: each prompt of a template's
    # fit half grafts ``search_fit_sets`` sets (growing prefixes, refinement rounds, controls, the
    # missed sample), each held-out prompt ``search_heldout_sets`` (shares, controls)
    search_fit_prompts: list[str] = field(default_factory=list)
    search_heldout_prompts: list[str] = field(default_factory=list)
    search_fit_sets: int = 0
    search_heldout_sets: int = 0
    search_note: str = ""
    directions: int  # graft directions (sufficiency, necessity)
    ig_steps: int
    units: Units
    unit_rows: int
    exact_units: int = 0  # unit cells mapped exactly per exact prompt (with ``units: head | neuron``)
    exact_chunk: int
    batch_size: int | None  # fixed by the config; None: the plan chooses
    dtype: str
    device: str
    tokenizer: str | None = None  # the config's tokenizer of models that have none (``random:``)
    estimates: bool = True  # False: no attribution (``estimates: false``): no deltas, no attribution batch


ESTIMATES_HINT = ("; set estimates: false (and search: {enabled: false}) to run localize's claims and exact maps, "
                  "which are whole grafts, without the gradient estimates")


def refuse_estimates(model: nn.Module) -> None:
    """localize's gradient estimates are partial grafts: on a model with a slot not affine in its
    weights (a mixture of experts' router and bank) they are refused in one line, which names
    ``estimates: false``, since the claims and exact maps (whole grafts) are exact there."""
    try:
        refuse_non_affine(model)
    except GraftArgumentTypeError as e:
        raise GraftArgumentTypeError(f"{e}{ESTIMATES_HINT}") from None


def partial_grafts_refused(spec: str) -> bool:
    """Whether the model of ``spec`` refuses partial grafts (read from its config, nothing
    loaded); False where the config cannot be read here (the run then says why in its own words)."""
    try:
        meta = parse_spec(spec).footprint().meta
    except (WeightgraftError, OSError, ValueError):  # an unreadable spec: the run reports it, not this question
        return False
    try:
        refuse_non_affine(meta)
    except GraftArgumentTypeError:
        return True
    return False


def unit_width(pre: ModelFootprint, units: Units) -> int:
    """Units per position over every split slot (0 for ``Units.CELL``): heads of q/k/v/o or
    neurons of gate/up/down, summed over layers."""
    return sum(s.units(units) for s in model_slots(pre.meta))


def plan_localize_work(work: LocalizeWork, *, memory: str | None = None, gpu: Card | None = None,
                       with_time: bool = True) -> Plan:
    """The plan of a localize run: memory by part, the attribution batch size, time."""
    pre = parse_spec(work.pre).footprint()
    if work.estimates:  # localize's estimates are partial grafts: refused before loading
        refuse_estimates(pre.meta)
    several = len(work.sfts) > 1
    sizes: list[Callable[[str], int]] = []
    roles = [RolePlan(model_set="default", role="pre", spec=work.pre, config=pre.where, n_params=pre.n_params,
                      held_bytes=param_bytes(pre, work.dtype), holds=_whole(pre),
                      read_bytes=param_bytes(pre, work.dtype, quantized=False))]
    quantized = [("pre", work.pre, pre)]
    for sft in work.sfts:
        fp = pre if sft.adapter is not None else parse_spec(sft.spec).footprint()
        check_graftable("pre", pre, sft.label, fp)
        size = partial(adapter_bytes, sft.adapter) if sft.adapter is not None else partial(param_bytes, fp)
        holds = "LoRA adapter" if sft.adapter is not None else _whole(fp)
        sizes.append(size)
        if sft.adapter is None:
            quantized.append((sft.label, sft.spec, fp))
        roles.append(RolePlan(model_set="default", role=sft.label, spec=sft.spec, config=fp.where, n_params=fp.n_params,
                              held_bytes=size(work.dtype),
                              holds=holds + (", one SFT model at a time" if several else ""),
                              read_bytes=None if sft.adapter is not None else param_bytes(fp, work.dtype, quantized=False)))
    tok, how = tokenizer_for(pre, work.tokenizer)
    count = lambda text: len(tok(text, return_offsets_mapping=True, add_special_tokens=True)["input_ids"])  # noqa: E731
    refuse_media(pre, tok, ((p, tok(p, add_special_tokens=True)["input_ids"]) for p in [*work.prompts, *work.exact_prompts]))
    lengths = [count(p) for p in work.prompts]
    exact_lengths = [count(p) for p in work.exact_prompts]
    held = budget(work.device, memory, gpu=gpu)
    width = unit_width(pre, work.units)

    def memory_at(b: int, chunk: int = work.exact_chunk, unit_rows: int = work.unit_rows) -> dict[str, int]:
        return _memory(replace(work, exact_chunk=chunk, unit_rows=unit_rows), pre, sizes, lengths=lengths, exact_lengths=exact_lengths,
                       width=width, held_now=held.held, b=b)

    batch = choose_batch(work.batch_size, DEFAULT_LOCALIZE_BATCH, len(lengths), memory_at, HEADROOM * held.limit)
    notes: list[str] = role_notes(quantized, work.dtype)
    if width:
        rows = min(batch, len(lengths))
        notes.append(f"units: {work.units}: {width} units per position; one attribution batch holds "
                     f"{gib(_unit_share_bytes(work, rows, max(lengths), width))} of unit shares, gradients and totals")
    states = _depth_states(work, pre, lengths)
    if states:
        notes.append(f"exact effects: depth sharing holds {gib(states)} of shared states beside each pass "
                     f"({work.exact_references} reference rows of up to {max(lengths)} tokens, passes of "
                     f"{work.exact_chunk} rows; {DEPTH_STATES!r} is what they add to the peak)")
    if several:
        notes.append(f"{len(work.sfts)} SFT models, held one at a time beside pre (memory: the largest); "
                     "maps and time are per SFT model, the search runs for the first only")
    seconds, parts = None, {}
    if with_time:
        rate, note = rate_for(work.device, work.dtype, gpu)
        if note:
            notes.append(note)
        if rate is not None:
            if work.estimates:
                steps = 1 + (work.ig_steps if work.ig_steps > 1 else 0)
                per_sft = attribution_seconds(pre, lengths, batch, rate) * steps * work.directions
                parts["attribution"] = per_sft * len(work.sfts)
            if exact_lengths:
                parts["exact cells"] = (exact_cell_seconds(pre, exact_lengths, work.exact_chunk, rate)
                                        * work.directions * len(work.sfts))
            if work.claim_prompts:
                last = work.claim_last_sets + pre.layers  # the layer blocks: at most one per layer
                rows = [row for p in work.claim_prompts for row in
                        [(count(p), 1)] + [(max(1, count(p) // 2), 1)] * work.claim_position_sets + [(1, 1)] * last]
                parts["claims"] = (forward_seconds(pre, sorted(rows), work.exact_chunk, rate)  # passes group like rows
                                   * work.directions * len(work.sfts))
                notes.append(f"claims: {len(work.claim_prompts)} prompts x up to {work.claim_position_sets} position "
                             f"grafts and {last} grafts at the last token, per mapped model and direction")
            if work.search_fit_prompts:
                rows = ([(count(p), 1)] * work.search_fit_sets for p in work.search_fit_prompts)
                held_rows = ([(count(p), 1)] * work.search_heldout_sets for p in work.search_heldout_prompts)
                every = sorted(r for group in (*rows, *held_rows) for r in group)
                parts["search"] = forward_seconds(pre, every, work.exact_chunk, rate) * work.directions
                notes.append(work.search_note)
            on_card, _ = card_for(work.device, gpu)
            if on_card is not None:
                reads, read_note = weight_read_seconds([r.loaded_bytes for r in roles], on_card)
                parts.update(reads)
                notes.append(read_note)
            seconds = sum(parts.values())
    plan = Plan(kind="localize", device=work.device, dtype=work.dtype, roles=roles, prompts=length_summary(lengths, how),
                rows=len(lengths), batch_size=batch, batch_size_fixed=work.batch_size is not None,
                batches=math.ceil(len(lengths) / batch), memory=memory_at(batch), budget_bytes=held.limit,
                budget_source=held.source, predicted_seconds=seconds, time_parts=parts, notes=notes)
    if plan.fits:
        return plan
    return replace(plan, suggestions=_advice(work, memory_at, held.limit), least=_least(work, memory_at))


def _whole(fp: ModelFootprint) -> str:
    return "whole" + (f", {fp.quantization.scheme}" if fp.quantization is not None else "")


def _unit_share_bytes(work: LocalizeWork, rows: int, seq: int, width: int) -> int:
    """Every unit's share, gradient, running total and result over one attribution batch."""
    size = 8 if work.dtype == "float64" else 4  # unit shares run in at least float32
    copies = UNIT_SHARE_COPIES + (1 if work.ig_steps > 1 else 0)
    return copies * rows * seq * width * size


def _depth_states(work: LocalizeWork, pre: ModelFootprint, lengths: list[int]) -> int:
    """The bytes depth sharing holds beside an exact pass (0 where no exact effect runs, and in
    half precision, which runs exact effects through prefix sharing)."""
    if work.dtype in HALF or not work.exact_references:
        return 0
    return depth_state_bytes(pre.config, work.exact_references, max(lengths), work.exact_chunk, dtype_bytes(work.dtype))


def _graft_map_bytes(work: LocalizeWork, pre: ModelFootprint, seq: int, exact_lengths: list[int],
                     width: int) -> int:
    """The source maps one ``exact_effects`` call builds: a ``[tokens, slots]`` one-byte map per
    (prompt, set) row (``engine.cells``), for every cell of a group of exact-map prompts (and
    its ``exact_units`` unit cells, each with its slot's unit map), or for the sets of the
    largest search or claims call."""
    slots = len(pre.slot_names)
    groups = [exact_lengths[i : i + EXACT_MAP_GROUP] for i in range(0, len(exact_lengths), EXACT_MAP_GROUP)]
    unit_cells = work.exact_units if width else 0
    per_unit = width // max(1, pre.layers)  # a unit map holds one slot's units: at most a layer's
    maps = max((sum(t * slots * t * slots + unit_cells * t * (slots + per_unit) for t in g) for g in groups), default=0)
    return max(maps, work.set_rows * seq * slots)


def _memory(work: LocalizeWork, pre: ModelFootprint, sizes: list[Callable[[str], int]], *, lengths: list[int],
            exact_lengths: list[int], width: int, held_now: int, b: int) -> dict[str, int]:
    seq = max(lengths)
    rows = min(b, len(lengths))
    attr = (sum(attribution_bytes(pre, rows, seq, work.dtype).values()) + _unit_share_bytes(work, rows, seq, width)
            if work.estimates else 0)
    states = _depth_states(work, pre, lengths)
    exact = 0
    if work.exact_references:  # with depth sharing a pass's keys and values are among the shared states
        exact = sum(inference_bytes(pre, work.exact_chunk, seq, 1, work.dtype, kv=not states).values())
    cells = work.directions * len(pre.slot_names) * (sum(lengths) + sum(exact_lengths))
    maps = _graft_map_bytes(work, pre, seq, exact_lengths, width)
    batch = max(attr, exact)
    out = {"process before loading": held_now,
           "parameters": param_bytes(pre, work.dtype) + max(size(work.dtype) for size in sizes),
           **({"graft deltas": delta_bytes(pre, work.dtype)} if work.estimates else {}),  # attribution's only
           EXACT_BATCH: batch}
    # held beside an exact pass only: each line is what it adds beyond the larger batch
    if states:
        out[DEPTH_STATES] = max(batch, exact + states) - batch
    if maps:
        out[GRAFT_MAPS] = max(batch, exact + states + maps) - max(batch, exact + states)
    if pre.quantization is not None:
        out[DEQUANTIZED] = dequantized_bytes([pre], work.dtype)
    out["cell tables"] = CELL_ROW_BYTES * cells * len(sizes)
    if width:  # the unit rows kept per prompt and direction: its top ``unit_rows`` of every unit
        kept = work.directions * sum(min(work.unit_rows, t * width) for t in lengths)
        out["unit rows"] = UNIT_ROW_BYTES * kept * len(sizes)
    return out


def _advice(work: LocalizeWork, memory_at: Callable[..., dict[str, int]], limit: int) -> list[str]:
    """Changes to the config that fit ``limit`` by this arithmetic."""
    def peak(**kw: int) -> int:
        return sum(memory_at(kw.pop("b", 1), **kw).values())

    out = []
    if work.batch_size is not None and work.batch_size > 1:
        b = smaller_batch(work.batch_size, memory_at, limit)
        if b is not None and b < work.batch_size:
            out.append(f"a smaller attribution batch: batch_size={b}")
    if work.exact_prompts:
        fits = [c for c in (256, 128, 64, 32) if c < work.exact_chunk and peak(chunk=c) <= limit]
        if fits:
            out.append(f"exact_chunk={fits[0]} ({gib(peak(chunk=fits[0]))} at batch 1)")
    if work.units != Units.CELL:
        fits = [r for r in (10000, 5000, 2000, 1000) if r < work.unit_rows and peak(unit_rows=r) <= limit]
        if fits:
            out.append(f"unit_rows={fits[0]} ({gib(peak(unit_rows=fits[0]))} at batch 1)")
    return out


def _least(work: LocalizeWork, memory_at: Callable[..., dict[str, int]]) -> str:
    """The least this config can need (batch 1, the smallest exact chunk and unit rows tried)."""
    least = sum(memory_at(1, min(work.exact_chunk, 32), min(work.unit_rows, 1000)).values())
    held = "both models whole and float32 deltas" if work.estimates else "both models whole"
    return (f"the least it needs is {gib(least)} (batch 1, exact_chunk<=32, unit_rows<=1000): localize holds "
            f"{held}; lean donors and bfloat16 do not apply")
