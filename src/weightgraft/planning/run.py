"""Memory of a sweep of grafted forward passes, from the shapes of its model sets: what each
role holds, the source maps, one batch's activations, KV cache and logits; and the changes to a
config that this arithmetic says would make it fit."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from weightgraft.models.footprint import ModelFootprint
from weightgraft.models.spec import ModelSpec, parse_spec
from weightgraft.planning.budget import budget, cuda_here
from weightgraft.planning.cards import Card
from weightgraft.planning.costs import (
    SCHEME_LAYOUT,
    dtype_bytes,
    holding_bytes,
    inference_bytes,
    param_bytes,
    quantized_parts,
)
from weightgraft.planning.lengths import PromptLengths
from weightgraft.planning.plan import HEADROOM, Plan, RolePlan, choose_batch
from weightgraft.planning.sizes import gib
from weightgraft.planning.timing import card_for, forward_seconds, rate_for, weight_read_seconds

__all__ = ["DEQUANTIZED", "RoleShape", "RunSettings", "SetShape", "SweepChoices", "dequantized_bytes", "held",
           "plan_sweep", "role_notes", "run_advice", "run_memory"]

DEQUANTIZED = "dequantized weight (one at a time)"  # the plan's memory line of a quantized run


@dataclass(frozen=True, kw_only=True)
class RoleShape:
    """One role of a model set: its spec, the footprint of its shapes, the slots it serves as
    a donor (None: the base, held whole) and whether it is a low-rank approximation."""

    role: str
    spec: ModelSpec  # a string given here is parsed
    footprint: ModelFootprint
    served: set[str] | None
    # a donor's banks served expert by expert (bank slot -> experts): a lean donor holds those alone
    experts: Mapping[str, frozenset[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", parse_spec(self.spec))



@dataclass(frozen=True, kw_only=True)
class SetShape:
    """What one model set needs, independent of dtype and batch size."""

    name: str
    base: ModelFootprint
    roles: list[RoleShape]
    rows: list[tuple[int, int]]  # per (example, scheme) row: (tokens, logit positions)
    source_bytes: int


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """The config choices the memory depends on, so advice can vary them one at a time."""

    dtype: str
    lean: bool
    batch_fixed: int | None
    device_map: bool
    held_now: int = 0
    sets: list[SetShape] = field(default_factory=list)

    def memory_at(self, batch: int, dtype: str | None = None, lean: bool | None = None) -> dict[str, int]:
        """The parts of the peak at ``batch``: the model set that needs the most (sets run one
        after another)."""
        dtype = dtype or self.dtype
        lean = self.lean if lean is None else lean
        parts = [run_memory(s, dtype, lean, batch, self.held_now) for s in self.sets]
        return max(parts, key=lambda p: sum(p.values()))


def held(shape: SetShape, dtype: str, lean: bool) -> list[RolePlan]:
    """What each role of the set holds: whole, a lean donor's served slots, a LoRA adapter."""
    out = []
    for i, r in enumerate(shape.roles):
        fp = r.footprint
        read = None
        holding = r.spec.holding(None if i == 0 else r.served, lean)
        if holding.slots is not None and r.experts:
            holding = replace(holding, experts={b: e for b, e in r.experts.items() if b in holding.slots})
        size, holds = holding_bytes(fp, holding, dtype)
        if r.spec.scheme is not None and fp.quantization is not None:
            holds += f", {fp.quantization.scheme}"
            read = param_bytes(fp, dtype, quantized=False)  # read dense, quantized as it loads
        out.append(RolePlan(model_set=shape.name, role=r.role, spec=r.spec.text, config=fp.where, n_params=fp.n_params,
                            held_bytes=size, holds=holds, read_bytes=read))
    return out


def role_notes(roles: list[tuple[str, str, ModelFootprint]], dtype: str) -> list[str]:
    """Per role ``(role, spec, footprint)``: what of a vision-language checkpoint it holds, and
    the arithmetic of a quantized role's bytes."""
    out = []
    for role, spec, fp in roles:
        if fp.form.note is not None:
            left = fp.form.unloaded_parameters() if fp.form.language_model_only else 0
            out.append(f"{role} {spec}: {fp.form.note}" + (f": {left / 1e9:.2f}B parameters left unread" if left else ""))
        q = fp.quantization
        if q is None:
            continue
        n_q, q_bytes, n_rest, rest = quantized_parts(fp, dtype)
        layout = SCHEME_LAYOUT[q.scheme] + (" (double-quantized scales)" if q.double_quant else "")
        out.append(f"{role} {spec}: {n_q / 1e9:.2f}B weights in {layout} = {gib(q_bytes)}, + {n_rest / 1e9:.2f}B "
                   f"other parameters (embeddings, unquantized modules, norms) in {dtype} = {gib(rest)}: "
                   f"{gib(q_bytes + rest)} held; read dense ({gib(param_bytes(fp, dtype, quantized=False))} "
                   "in the run's dtype) and quantized as it loads")
    return out


def run_memory(shape: SetShape, dtype: str, lean: bool, batch: int, held_now: int) -> dict[str, int]:
    """The parts of one model set's peak at ``batch`` rows."""
    seq = max(t for t, _ in shape.rows)
    logits = max(n for _, n in shape.rows)
    act = inference_bytes(shape.base, min(batch, len(shape.rows)), seq, logits, dtype)
    parts = {"process before loading": held_now,
             "parameters": sum(r.held_bytes for r in held(shape, dtype, lean)),
             "source maps": shape.source_bytes, **act}
    scratch = dequantized_bytes([r.footprint for r in shape.roles], dtype)
    if scratch:
        parts[DEQUANTIZED] = scratch
    return parts


def dequantized_bytes(footprints: list[ModelFootprint], dtype: str) -> int:
    """The largest quantized weight in ``dtype``: bitsandbytes' 4-bit and 8-bit matmuls dequantize
    the whole weight of each call before multiplying, one at a time (counted for torchao too: an
    upper bound where its kernel multiplies int8 directly)."""
    return max((o * i for fp in footprints for o, i in fp.quantized_shapes.values()), default=0) * dtype_bytes(dtype)


def run_advice(settings: RunSettings, limit: int, spread: tuple[int, int] | None = None,
               card: str | None = None) -> tuple[list[str], str]:
    """The changes that fit ``limit`` by this arithmetic (bfloat16, lean donors, both, a smaller
    fixed batch, and ``device_map=auto`` where ``spread`` = (GPUs, their memory in all) of this
    machine holds the run), and what the least of them needs: said when none fits. With a named
    ``card`` (whose memory is ``limit``), also how many such cards ``device_map=auto`` needs."""
    batch = settings.batch_fixed or 1  # a fixed batch stays what the config says

    def peak(b: int = batch, dtype: str | None = None, lean: bool | None = None) -> int:
        return sum(settings.memory_at(b, dtype, lean).values())

    lean_ok = not settings.device_map  # a device_map loads donors whole
    changes: list[tuple[str, dict]] = []
    if settings.dtype == "float32":
        changes.append(("dtype=bfloat16", {"dtype": "bfloat16"}))
    if lean_ok and not settings.lean:
        changes.append(("lean_donors=true", {"lean": True}))
        if settings.dtype == "float32":
            changes.append(("dtype=bfloat16 and lean_donors=true", {"dtype": "bfloat16", "lean": True}))
    out = [f"{what} ({gib(peak(**kw))} at batch {batch})" for what, kw in changes if peak(**kw) <= limit]
    if settings.batch_fixed is not None and settings.batch_fixed > 1:
        b = choose_batch(None, settings.batch_fixed, settings.batch_fixed, settings.memory_at, limit)
        if b < settings.batch_fixed and peak(b) <= limit:
            out.insert(0, f"fewer schemes per batch: batch_size={b}")
    if spread is not None and not settings.device_map and peak(lean=False) <= spread[1]:
        out.append(f"device_map=auto over this machine's {spread[0]} GPUs ({gib(peak(lean=False))} at batch {batch} "
                   f"of {gib(spread[1])})")
    candidates = [("batch 1", peak(1))] + [(what, peak(1, **kw)) for what, kw in changes]
    least_what, least = min(candidates, key=lambda c: c[1])
    said = f"the least it needs is {gib(least)} ({least_what}{', batch 1' if least_what != 'batch 1' else ''})"
    if card is not None and not out:
        whole = min(peak(1, lean=False), peak(1, "bfloat16", False))  # a device_map loads every role whole
        n = math.ceil(whole / limit)
        said += (f"; across GPUs, device_map=auto needs at least {n} {card} cards ({gib(whole)} in "
                 f"{'bfloat16' if whole < peak(1, lean=False) else settings.dtype}, batch 1, at {gib(limit)} a card)")
    return out, said


@dataclass(frozen=True, kw_only=True)
class SweepChoices:
    """What a sweep's plan depends on besides its shapes: the config's choices (``batch_fixed``:
    the batch size the config fixes, None to let the plan choose up to ``batch_default``) and the
    machine it plans for (this one, or ``memory`` / ``gpu``)."""

    device: str
    dtype: str
    batch_fixed: int | None
    batch_default: int
    lean: bool
    device_map: bool
    prefix_sharing: bool
    memory: str | None = None
    gpu: Card | None = None
    with_time: bool = True


def plan_sweep(shapes: list[SetShape], prompts: PromptLengths, choices: SweepChoices) -> Plan:
    """The plan of a sweep over model sets of these shapes (``prompts``: their lengths): memory
    by part, the batch size that fits, time, and where it does not fit, the changes that would."""
    c = choices
    where = budget(c.device, c.memory, all_gpus=c.device_map, gpu=c.gpu)
    settings = RunSettings(dtype=c.dtype, lean=c.lean and not c.device_map, batch_fixed=c.batch_fixed,
                           device_map=c.device_map, held_now=where.held, sets=shapes)
    n_rows = max(len(s.rows) for s in shapes)
    batch = choose_batch(c.batch_fixed, c.batch_default, n_rows, settings.memory_at, HEADROOM * where.limit)
    notes = ["prefix sharing (on by default) computes shared positions once: the time is an upper bound"
             if c.prefix_sharing and c.dtype == "float32" else "rows run whole"]
    noted = {r.spec.text: (r.role, r.spec.text, r.footprint) for s in shapes for r in s.roles
             if (r.footprint.quantization is not None or r.footprint.form.note is not None) and r.spec.adapter is None}
    notes += role_notes(list(noted.values()), c.dtype)
    roles = [r for s in shapes for r in held(s, c.dtype, settings.lean)]
    seconds, parts = None, {}
    if c.with_time:
        rate, note = rate_for(c.device, c.dtype, c.gpu)
        if note:
            notes.append(note)
        if rate is not None:
            parts = {f"sweep {s.name}": forward_seconds(s.base, s.rows, batch, rate) for s in shapes}
            on_card, _ = card_for(c.device, c.gpu)
            if on_card is not None:
                # a spec held the same way in several sets loads once
                once = list({(r.spec, r.holds): r.loaded_bytes for r in roles}.values())
                reads, read_note = weight_read_seconds(once, on_card)
                parts.update(reads)
                notes.append(read_note)
            seconds = sum(parts.values())
    plan = Plan(kind="run", device=c.device, dtype=c.dtype, roles=roles, prompts=prompts,
                rows=sum(len(s.rows) for s in shapes), batch_size=batch, batch_size_fixed=c.batch_fixed is not None,
                batches=sum(math.ceil(len(s.rows) / batch) for s in shapes), memory=settings.memory_at(batch),
                budget_bytes=where.limit, budget_source=where.source, predicted_seconds=seconds, time_parts=parts,
                notes=notes)
    if plan.fits:
        return plan
    advice, least = run_advice(settings, where.limit, _spread(c), c.gpu.name if c.gpu else None)
    return replace(plan, suggestions=advice, least=least)


def _spread(c: SweepChoices) -> tuple[int, int] | None:
    """(GPUs, their memory in all) of this machine where a ``device_map`` could spread the run."""
    if c.memory or c.gpu is not None or not c.device.startswith("cuda") or not cuda_here():
        return None
    import torch

    n = torch.cuda.device_count()
    return (n, budget(c.device, all_gpus=True).limit) if n > 1 else None
