"""The plan of a run or localize config, before any weight is read: memory per role, of one
batch and in all, the batch size, and a predicted wall time.

Why: a sweep on a 2B or 8B model that cannot fit should be refused in one line, saying what
would make it fit, not die an hour in; and a user should know how long it will take. ``run``
and ``localize`` plan first: they take the batch size from the plan where the config does not
fix one, and refuse a run whose batch of one does not fit.

Everything comes from the configs: each role's ``config.json`` (or the shipped config of
``random:`` / embedded models) built on the meta device (``weightgraft.models.footprint``),
the dataset's prompts, the schemes. Prompt lengths are token counts when a tokenizer is at hand
(a model directory, converted embedded model or cached hub id that holds one); otherwise an
estimate of one token per 4 characters plus one BOS token (``CHARS_PER_TOKEN``), said in the
plan. Memory is predicted as the process's peak: what it holds before loading (its current
resident memory on CPU; 0 on CUDA, where allocated bytes are counted), the parameters each role
holds (whole, or a lean donor's tensors), the source maps of the sweep, and one batch's
activations, KV cache and logits (localize: the partial graft's deltas and what autograd keeps).
The budget is the memory the process could reach: on CPU the available RAM (psutil) plus its
own, on CUDA the free GPU memory, or ``--memory`` / ``WEIGHTGRAFT_MEMORY`` for another machine.
Time: FLOPs of every batch over this device's measured rate (``weightgraft.models.calibration``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from weightgraft.experiments.config import ConfigError

__all__ = ["CHARS_PER_TOKEN", "Plan", "PlanError", "RolePlan", "budget", "parse_size",
           "plan_experiment", "plan_localize", "check_plan"]

CHARS_PER_TOKEN = 4.0  # English BPE average, for prompt lengths without a tokenizer
HEADROOM = 0.9  # a chosen batch size keeps the predicted peak under this share of the budget
DEFAULT_RUN_BATCH = 64  # ExperimentConfig.batch_size's default: the most a plan chooses
DEFAULT_LOCALIZE_BATCH = 16  # LocalizeConfig.batch_size's default


class PlanError(ConfigError):
    """A run whose plan cannot fit: one line, with what would make it fit."""


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """``80GiB``, ``24GB``, ``512MiB``, ``1e9`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"memory size {text!r}: expected a number with a unit, e.g. 80GiB, 24GB, 512MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass
class RolePlan:
    """One model role: where its config came from and what it holds."""

    model_set: str
    role: str
    spec: str
    config: str
    n_params: int
    held_bytes: int
    holds: str  # "whole", "lean (N of M slots)", "low-rank (whole + SVD factors)"


@dataclass
class Plan:
    """What a run will need; ``as_dict`` is ``weightgraft plan --json``."""

    kind: str  # "run" | "localize"
    device: str
    dtype: str
    roles: list[RolePlan]
    prompts: dict[str, Any]  # n, min/max/mean tokens, how they were counted
    rows: int  # (example, scheme) rows (localize: examples)
    batch_size: int
    batch_size_fixed: bool
    batches: int
    memory: dict[str, int]  # the parts of the peak
    peak_bytes: int
    budget_bytes: int
    budget_source: str
    predicted_seconds: float | None
    time_parts: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fits"] = self.fits
        return out

    def refusal(self) -> str:
        """The one-line refusal of a run that does not fit."""
        fix = "; ".join(self.suggestions) if self.suggestions else "a machine with more memory"
        what = f"batch size {self.batch_size}" if self.batch_size_fixed else "a batch of one"
        return (f"this {self.kind} needs {_gib(self.peak_bytes)} at {what} ({self._parts()}) but "
                f"{_gib(self.budget_bytes)} are available ({self.budget_source}); it would fit with: {fix}")

    def _parts(self) -> str:
        return ", ".join(f"{k} {_gib(v)}" for k, v in self.memory.items() if v >= 2**24)


# ------------------------------------------------------------------------------------------
# budget
# ------------------------------------------------------------------------------------------


def _rss() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _available_ram() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        raise


def budget(device: str, memory: str | None = None, all_gpus: bool = False) -> tuple[int, int, str]:
    """``(budget bytes, bytes the process holds now, where the budget comes from)``: a given
    size (``--memory``, ``WEIGHTGRAFT_MEMORY``), else this device's free memory: with
    ``all_gpus`` (a ``device_map``) every visible GPU's; on CPU the available RAM shared by the
    processes of this machine (``LOCAL_WORLD_SIZE`` under torchrun: each holds its own models)."""
    memory = memory or os.environ.get("WEIGHTGRAFT_MEMORY")
    cuda = device.startswith("cuda")
    held = 0 if cuda else _rss()
    if memory:
        return parse_size(memory), held, f"given: {memory}"
    if cuda:
        import torch

        devices = range(torch.cuda.device_count()) if all_gpus else [torch.device(device)]
        free = sum(int(torch.cuda.mem_get_info(d)[0]) + int(torch.cuda.memory_allocated(d)) for d in devices)
        return free, 0, f"free on {'every visible GPU' if all_gpus else device}"
    share = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    where = "available RAM (psutil) + this process" + (f", shared by {share} processes" if share > 1 else "")
    return _available_ram() // share + held, held, where


# ------------------------------------------------------------------------------------------
# prompts without a tokenizer
# ------------------------------------------------------------------------------------------


class CharEstimateTokenizer:
    """Stands in for a tokenizer when none is at hand: one token per ``CHARS_PER_TOKEN``
    characters (offsets included, so spans place), plus a BOS token. Lengths only."""

    is_fast = True
    pad_token_id = 0

    def __call__(self, text: str, return_offsets_mapping: bool = False, add_special_tokens: bool = True) -> dict[str, Any]:
        step = CHARS_PER_TOKEN
        n = max(1, math.ceil(len(text) / step)) if text else 0
        offsets = [(int(i * step), min(len(text), int((i + 1) * step))) for i in range(n)]
        ids = list(range(1, n + 1))
        if add_special_tokens:
            offsets, ids = [(0, 0), *offsets], [0, *ids]
        out: dict[str, Any] = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = offsets
        return out


def _tokenizer(footprint: Any) -> tuple[Any, str]:
    """A real tokenizer when the base model's files hold one (no weights read), else the
    character estimate; and how prompt lengths are counted."""
    if footprint.tokenizer_dir is not None:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(footprint.tokenizer_dir, local_files_only=True)
            if getattr(tok, "is_fast", False):
                return tok, f"token counts (tokenizer of {footprint.tokenizer_dir})"
        except Exception:
            pass
    return CharEstimateTokenizer(), (f"estimated: no tokenizer at hand for {footprint.spec}, "
                                     f"1 token per {CHARS_PER_TOKEN:g} characters + 1 BOS")


def _lengths(lengths: list[int], how: str) -> dict[str, Any]:
    return {"n": len(lengths), "min_tokens": min(lengths), "max_tokens": max(lengths),
            "mean_tokens": round(sum(lengths) / len(lengths), 2), "counted": how}


# ------------------------------------------------------------------------------------------
# run
# ------------------------------------------------------------------------------------------


def _role_footprint(spec: str, roles_spec: dict[str, str], cache: dict[str, Any]) -> Any:
    from weightgraft.models.footprint import resolve_footprint
    from weightgraft.models.lowrank import parse_lowrank
    from weightgraft.models.peft_donor import parse_peft

    low, lora = parse_lowrank(spec), parse_peft(spec)
    if low is not None:  # a low-rank role has the shapes of the role it approximates
        spec = roles_spec[low.donor]
    if lora is not None:  # a LoRA role has the shapes of its base
        spec = roles_spec[lora.base]
    if spec not in cache:
        cache[spec] = resolve_footprint(spec)
    return cache[spec]


@dataclass
class _SetShape:
    """What one model set needs, independent of dtype and batch size."""

    name: str
    base: Any  # ModelFootprint
    roles: list[tuple[str, str, Any, set[str] | None, bool]]  # role, spec, footprint, served, lowrank
    rows: list[tuple[int, int]]  # per row: (tokens, logits)
    source_bytes: int


def _experiment_shapes(config: Any, prompts: list[Any]) -> tuple[list[_SetShape], dict[str, Any]]:
    from weightgraft.experiments.examples import Exclusions, prepare, served_slots
    from weightgraft.models.lowrank import parse_lowrank
    from weightgraft.schemes.protocol import embeddings_tied
    from weightgraft.schemes.scheme import compile_scheme

    from weightgraft.engine.architectures import model_slots

    schemes = config.resolved_schemes()
    footprints: dict[str, Any] = {}
    shapes, lengths_info = [], {}
    for set_name, roles_spec in config.sets().items():
        used = sorted(set().union(*(s.roles() for s in schemes)), key=list(roles_spec).index)
        base = _role_footprint(roles_spec[used[0]], roles_spec, footprints)
        names = base.slot_names
        slot_heads = {s.name: s.heads for s in model_slots(base.meta) if s.heads}
        roles = {r: i for i, r in enumerate(used)}
        compiled = [compile_scheme(s, names, roles, slot_heads, protocol=config.protocol,
                                   tied_embeddings=embeddings_tied(base.meta)) for s in schemes]
        tok, how = _tokenizer(base)
        prepared = prepare(prompts, tok, compiled, set_name, Exclusions())
        if not prepared:
            raise ConfigError(f"model set {set_name!r}: every example is excluded (spans not found); nothing to plan")
        served = served_slots(prepared, names)
        rows, source_bytes = [], 0
        for ex in prepared:
            extra = len(ex.answer_ids) - 1 if config.score_answer else 0
            for s in schemes:
                if s.name in ex.sources:
                    rows.append((len(ex.input_ids) + extra, 1 + extra))
                    source_bytes += ex.sources[s.name].numel() * 8
            source_bytes += sum(h.numel() * 8 for maps in ex.heads.values() for h in maps.values())
        lengths_info = _lengths([len(ex.input_ids) for ex in prepared], how)
        role_list = []
        for i, role in enumerate(used):
            spec = roles_spec[role]
            fp = _role_footprint(spec, roles_spec, footprints)
            role_list.append((role, spec, fp, served.get(i, set()) if i else None, parse_lowrank(spec) is not None))
        shapes.append(_SetShape(set_name, base, role_list, rows, source_bytes))
    return shapes, lengths_info


def _held(shape: _SetShape, dtype: str, lean: bool) -> list[RolePlan]:
    out = []
    n_slots = len(shape.base.slot_names)
    from weightgraft.models.peft_donor import adapter_bytes, parse_peft

    for i, (role, spec, fp, served, lowrank) in enumerate(shape.roles):
        lora = parse_peft(spec)
        if lora is not None:
            held, holds = adapter_bytes(lora.directory, dtype), "LoRA adapter (the base's tensors shared)"
        elif lowrank:
            held, holds = fp.param_bytes(dtype), "low-rank (whole model; SVD factors not counted)"
        elif i == 0 or not lean:
            held, holds = fp.param_bytes(dtype), "whole"
        else:
            held, holds = fp.held_bytes(served or set(), dtype), f"lean ({len(served or ())} of {n_slots} slots)"
        out.append(RolePlan(shape.name, role, spec, fp.where, fp.n_params, held, holds))
    return out


def _run_memory(shape: _SetShape, dtype: str, lean: bool, batch: int, held_now: int) -> dict[str, int]:
    seq = max(t for t, _ in shape.rows)
    logits = max(n for _, n in shape.rows)
    rows = min(batch, len(shape.rows))
    act = shape.base.inference_bytes(rows, seq, logits, dtype)
    return {"process before loading": held_now,
            "parameters": sum(r.held_bytes for r in _held(shape, dtype, lean)),
            "source maps": shape.source_bytes, **act}


def _run_seconds(shape: _SetShape, batch: int, rate: Any) -> float:
    from weightgraft.models.calibration import module_calls

    calls = module_calls(shape.base)
    total = 0.0
    for i in range(0, len(shape.rows), batch):
        chunk = shape.rows[i : i + batch]
        seq = max(t for t, _ in chunk)
        flops = shape.base.forward_flops(len(chunk) * seq, seq, sum(n for _, n in chunk))
        total += rate.batch_seconds(flops, calls)
    return total


def _choose_batch(fixed: int | None, default: int, n_rows: int, memory_at: Any, limit: float) -> int:
    """The config's batch size, else the largest (up to ``default``) whose peak fits ``limit``."""
    if fixed is not None:
        return fixed
    best = 1
    limit = max(limit, sum(memory_at(1).values()))  # a larger batch that costs nothing more is taken
    for b in range(1, min(default, max(1, n_rows)) + 1):
        if sum(memory_at(b).values()) <= limit:
            best = b
        else:
            break
    return best


def plan_experiment(config: Any, prompts: list[Any] | None = None, *, memory: str | None = None,
                    with_time: bool = True) -> Plan:
    """The plan of a ``run`` config (an ``ExperimentConfig``); reads configs and prompts only."""
    if prompts is None:
        from weightgraft.data.freeform import load_prompts
        from weightgraft.experiments.examples import select_prompts

        prompts = select_prompts(load_prompts(config.data), config)
    shapes, lengths = _experiment_shapes(config, prompts)
    limit, held_now, source = budget(config.device, memory, all_gpus=config.device_map is not None)
    fixed = config.batch_size if "batch_size" in config.model_fields_set else None
    lean = config.lean_donors and config.device_map is None

    def memory_at(b: int, dtype: str = config.dtype, lean: bool = lean) -> dict[str, int]:
        parts = [_run_memory(s, dtype, lean, b, held_now) for s in shapes]
        return max(parts, key=lambda p: sum(p.values()))  # model sets run one after another

    n_rows = max(len(s.rows) for s in shapes)
    batch = _choose_batch(fixed, DEFAULT_RUN_BATCH, n_rows, memory_at, HEADROOM * limit)
    mem = memory_at(batch)
    roles = [r for s in shapes for r in _held(s, config.dtype, lean)]
    seconds, parts = None, {}
    if with_time:
        from weightgraft.models.calibration import throughput

        rate = throughput(config.device, config.dtype)
        parts = {f"sweep {s.name}": _run_seconds(s, batch, rate) for s in shapes}
        seconds = sum(parts.values())
    notes = ["prefix sharing (on by default) computes shared positions once: the time is an upper bound"
             if config.prefix_sharing and config.dtype == "float32" else "rows run whole"]
    plan = Plan("run", config.device, config.dtype, roles, lengths, sum(len(s.rows) for s in shapes), batch,
                fixed is not None, sum(math.ceil(len(s.rows) / batch) for s in shapes), mem, sum(mem.values()),
                limit, source, seconds, parts, notes)
    if not plan.fits:
        plan.suggestions = _run_suggestions(config, memory_at, limit, fixed is not None)
    return plan


def _run_suggestions(config: Any, memory_at: Any, limit: int, fixed: bool) -> list[str]:
    out = []
    if config.dtype == "float32":
        peak = sum(memory_at(1, "bfloat16").values())
        out.append(f"dtype=bfloat16 ({_gib(peak)} at batch 1)")
    if not config.lean_donors and config.device_map is None:
        peak = sum(memory_at(1, config.dtype, True).values())
        out.append(f"lean_donors=true ({_gib(peak)} at batch 1)")
    if fixed:
        b = _choose_batch(None, config.batch_size, config.batch_size, memory_at, limit)
        if sum(memory_at(b).values()) <= limit:
            out.append(f"fewer schemes per batch: batch_size={b}")
    if config.device_map is None:
        out.append("device_map=auto on several GPUs (spreads each model's layers)")
    return out


# ------------------------------------------------------------------------------------------
# localize
# ------------------------------------------------------------------------------------------


def plan_localize(config: Any, *, memory: str | None = None, with_time: bool = True) -> Plan:
    """The plan of a ``localize`` config: both models whole, the partial graft's deltas,
    attribution (forward + backward) of one batch, and the exact-cell batches."""
    from weightgraft.localize.examples import select_prompts
    from weightgraft.models.footprint import resolve_footprint

    prompts = select_prompts(config)
    from weightgraft.models.peft_donor import adapter_bytes, parse_peft

    pre = resolve_footprint(config.models["pre"])
    sfts = []  # (label, spec, footprint, bytes(dtype), holds): loaded one at a time, after each other
    several = len(config.sft_models()) > 1
    for label, spec in config.sft_models():
        lora = parse_peft(spec)  # a LoRA donor holds its adapter, on pre's tensors
        fp = pre if lora is not None else resolve_footprint(spec)
        size = (lambda dtype, d=lora.directory: adapter_bytes(d, dtype)) if lora is not None else fp.param_bytes
        holds = "LoRA adapter" if lora is not None else "whole"
        sfts.append((label, spec, fp, size, holds + (", one SFT model at a time" if several else "")))

    def sft_bytes(dtype: str) -> int:  # the largest SFT model: the one held beside pre at the peak
        return max(size(dtype) for _, _, _, size, _ in sfts)

    tok, how = _tokenizer(pre)
    lengths = [len(tok(p.prompt, return_offsets_mapping=True, add_special_tokens=True)["input_ids"]) for p in prompts]
    info = _lengths(lengths, how)
    limit, held_now, source = budget(config.device, memory)
    fixed = config.batch_size if "batch_size" in config.model_fields_set else None
    seq = max(lengths)
    exact_examples = _exact_count(config, prompts)

    def memory_at(b: int, dtype: str = config.dtype) -> dict[str, int]:
        attr = pre.attribution_bytes(min(b, len(lengths)), seq, dtype)
        exact = pre.inference_bytes(config.exact_chunk, seq, 1, dtype) if exact_examples else {}
        batch_part = max(sum(attr.values()), sum(exact.values()) if exact else 0)
        cells = 2 * len(config.graft_directions) * len(sfts) * sum(lengths) * len(pre.slot_names) * 120  # cell tables
        return {"process before loading": held_now,
                "parameters": pre.param_bytes(dtype) + sft_bytes(dtype),
                "graft deltas": pre.delta_bytes(dtype), "batch (attribution or exact cells)": batch_part,
                "cell tables": cells}

    batch = _choose_batch(fixed, DEFAULT_LOCALIZE_BATCH, len(lengths), memory_at, HEADROOM * limit)
    mem = memory_at(batch)
    roles = [RolePlan("default", "pre", config.models["pre"], pre.where, pre.n_params, pre.param_bytes(config.dtype), "whole")]
    roles += [RolePlan("default", label, spec, fp.where, fp.n_params, size(config.dtype), holds)
              for label, spec, fp, size, holds in sfts]
    seconds, parts = None, {}
    notes = ["the minimal graft search is not predicted (its length depends on the effects found)"]
    if several:
        notes.append(f"{len(sfts)} SFT models, held one at a time beside pre (memory: the largest); "
                     "maps and time are per SFT model, the search runs for the first only")
    if with_time:
        from weightgraft.models.calibration import module_calls, throughput

        rate = throughput(config.device, config.dtype)
        calls = module_calls(pre)
        order = sorted(lengths)
        attr = 0.0
        for i in range(0, len(order), batch):
            chunk = order[i : i + batch]
            flops = pre.forward_flops(len(chunk) * max(chunk), max(chunk), len(chunk))
            attr += rate.attribution_ratio * rate.batch_seconds(flops, calls)
        steps = 1 + (config.ig_steps if config.ig_steps > 1 else 0)
        parts["attribution"] = attr * steps * len(config.graft_directions) * len(sfts)
        if exact_examples:
            n_slots = len(pre.slot_names)
            per_example = [sum((t - p) * (n_slots - 2) for p in range(t)) + 2 for t in lengths[:exact_examples]]
            tokens = sum(per_example) * len(config.graft_directions)
            cells = sum(t * (n_slots - 2) + 2 for t in lengths[:exact_examples]) * len(config.graft_directions)
            flops = pre.forward_flops(tokens, seq, cells)
            per_sft = rate.batch_seconds(flops, calls * math.ceil(cells / config.exact_chunk))
            parts["exact cells"] = per_sft * len(sfts)
        seconds = sum(parts.values())
    plan = Plan("localize", config.device, config.dtype, roles, info, len(lengths), batch, fixed is not None,
                math.ceil(len(lengths) / batch), mem, sum(mem.values()), limit, source, seconds, parts, notes)
    if not plan.fits:
        out = []
        if fixed:
            b = _choose_batch(None, fixed, fixed, memory_at, limit)
            if sum(memory_at(b).values()) <= limit:
                out.append(f"a smaller attribution batch: batch_size={b}")
        if exact_examples and config.exact_chunk > 64:
            out.append("a smaller exact_chunk")
        out.append("a machine with more memory (localize holds both models whole and float32 deltas; "
                   "lean donors and bfloat16 do not apply)")
        plan.suggestions = out
    return plan


def _exact_count(config: Any, prompts: list[Any]) -> int:
    if config.exact == "none":
        return 0
    if config.exact == "all":
        return len(prompts)
    per: dict[str, int] = {}
    for p in prompts:
        per[p.template] = min(config.exact, per.get(p.template, 0) + 1)
    return sum(per.values())


def check_plan(plan: Plan) -> Plan:
    """Raise :class:`PlanError` (one line) when the plan does not fit; else return it."""
    if not plan.fits:
        raise PlanError(plan.refusal())
    return plan


def _skipped(exc: Exception) -> None:
    """A config the plan cannot read (a hub id not in the cache, a broken directory): the
    loader then says what is wrong in its own words; other failures of the plan are said in
    one line and do not stop the run."""
    import sys

    from weightgraft.models.errors import ModelLoadError, ModelNotFoundError

    if isinstance(exc, ConfigError):
        raise exc
    if not isinstance(exc, (ModelLoadError, ModelNotFoundError, OSError)):
        print(f"plan skipped ({type(exc).__name__}: {exc})", file=sys.stderr)


def plan_before_run(config: Any, prompts: list[Any]) -> Any:
    """What ``run`` does before loading: refuse random models (no tokenizer) and a plan that
    does not fit, in one line; return the config with the plan's batch size where the config
    does not fix one."""
    from weightgraft.models.random_models import refuse_random

    for roles in config.sets().values():
        if config.tokenizer is None:  # the config's tokenizer serves models that have none
            refuse_random(roles, "weightgraft run")
    try:
        plan = plan_experiment(config, prompts, with_time=False)
    except Exception as exc:  # the plan only refuses what it knows cannot fit
        _skipped(exc)
        return config
    check_plan(plan)
    if plan.batch_size != config.batch_size:
        config = config.model_copy(update={"batch_size": plan.batch_size})
    return config


def plan_before_localize(config: Any) -> Any:
    """``plan_before_run`` for ``localize``."""
    from weightgraft.models.random_models import refuse_random

    if config.tokenizer is None:  # the config's tokenizer serves models that have none
        refuse_random(config.roles(), "weightgraft localize")
    try:
        plan = plan_localize(config, with_time=False)
    except Exception as exc:
        _skipped(exc)
        return config
    check_plan(plan)
    if plan.batch_size != config.batch_size:
        config = config.model_copy(update={"batch_size": plan.batch_size})
    return config


# ------------------------------------------------------------------------------------------
# rows given directly (benchmarks, notebooks): the same arithmetic as run and localize
# ------------------------------------------------------------------------------------------


def plan_rows(base: str, donors: dict[str, set[str] | None], rows: list[tuple[int, int]], dtype: str,
              batch_size: int, *, device: str = "cpu", memory: str | None = None, with_time: bool = True,
              extra_bytes: int = 0) -> Plan:
    """The plan of grafted forward passes over ``rows`` ((tokens, logits) per row), as ``run``
    batches them: ``base`` whole, each donor spec holding its served slots (None: whole);
    ``extra_bytes`` (e.g. the source maps a caller keeps) is added to the peak."""
    from weightgraft.models.footprint import resolve_footprint

    cache: dict[str, Any] = {}
    fp = _role_footprint(base, {}, cache)
    roles = [("base", base, fp, None, False)]
    roles += [(f"donor {i}", spec, resolve_footprint(spec), served, False) for i, (spec, served) in
              enumerate(donors.items(), 1)]
    shape = _SetShape("rows", fp, roles, list(rows), extra_bytes)
    limit, held_now, source = budget(device, memory)
    mem = _run_memory(shape, dtype, True, batch_size, held_now)
    seconds, parts = None, {}
    if with_time:
        from weightgraft.models.calibration import throughput

        parts = {"grafted forward": _run_seconds(shape, batch_size, throughput(device, dtype))}
        seconds = parts["grafted forward"]
    return Plan("run", device, dtype, _held(shape, dtype, True), {}, len(rows), batch_size, True,
                math.ceil(len(rows) / batch_size), mem, sum(mem.values()), limit, source, seconds, parts)


def plan_attribution(pre: str, donor_bytes: int | None, lengths: list[int], dtype: str, batch_size: int, *,
                     device: str = "cpu", memory: str | None = None, with_time: bool = True,
                     donor_slots: set[str] | None = None) -> Plan:
    """The plan of graft attribution (gradient of every cell) over prompts of ``lengths``
    tokens, as ``localize`` runs it (no exact cells): ``pre`` whole, the donor holding
    ``donor_bytes`` (None: a whole model; ``donor_slots``: the slots a lean donor holds), the
    partial graft's deltas, one batch's forward + backward."""
    from weightgraft.models.footprint import resolve_footprint

    fp = resolve_footprint(pre)
    limit, held_now, source = budget(device, memory)
    seq = max(lengths)
    attr = fp.attribution_bytes(min(batch_size, len(lengths)), seq, dtype)
    mem = {"process before loading": held_now,
           "parameters": fp.param_bytes(dtype) + (fp.param_bytes(dtype) if donor_bytes is None else donor_bytes),
           "graft deltas": fp.delta_bytes(dtype, donor_slots), "attribution batch": sum(attr.values())}
    seconds, parts = None, {}
    if with_time:
        from weightgraft.models.calibration import module_calls, throughput

        rate = throughput(device, dtype)
        order = sorted(lengths)
        total = 0.0
        for i in range(0, len(order), batch_size):
            chunk = order[i : i + batch_size]
            flops = fp.forward_flops(len(chunk) * max(chunk), max(chunk), len(chunk))
            total += rate.attribution_ratio * rate.batch_seconds(flops, module_calls(fp))
        parts, seconds = {"attribution": total}, total
    roles = [RolePlan("rows", "pre", pre, fp.where, fp.n_params, fp.param_bytes(dtype), "whole")]
    return Plan("localize", device, dtype, roles, {}, len(lengths), batch_size, True,
                math.ceil(len(lengths) / batch_size), mem, sum(mem.values()), limit, source, seconds, parts)
