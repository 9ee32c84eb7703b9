"""Self-check on the user's own models: the fast engine against the per-token definition."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from weightgraft.engine.architectures import model_slots
from weightgraft.engine.forward import graft_forward, slots
from weightgraft.engine.precision import eager_attention, float64_exact
from weightgraft.engine.reference import CompositeModel, per_token_forward
from weightgraft.engine.sharing.depth import depth_forward
from weightgraft.engine.sharing.prefix import GraftItem, prefix_forward
from weightgraft.engine.source_map import SourceMap

DEFAULT_PROMPTS = (
    "Keanu Reeves starred in a movie with",
    "Q: Who starred in a movie alongside Meryl Streep? A: An actor named",
    "The capital of France is",
)


@dataclass(frozen=True)
class CheckCase:
    """One source map checked on all prompts."""

    name: str
    max_abs_diff: float
    logit_scale: float
    top1_agree: float  # fraction of real positions whose top token agrees
    # Maps that take everything from one model only: max |Δ logit| of the engine and of the
    # per-token reference against that model's own HF forward pass (the same batch). In half
    # precision they tell which side a gap comes from: the reference's position-by-position
    # KV-cache pass rounds differently from a whole-sequence forward.
    engine_vs_plain: float | None = None
    reference_vs_plain: float | None = None


@dataclass(frozen=True)
class CheckReport:
    cases: list[CheckCase]
    atol: float
    rtol: float
    # A mixture of experts in half precision: (top-k routing decisions that differ from a float32
    # pass of the same maps, decisions), said rather than hidden in a logit tolerance; else None.
    routing_flips: tuple[int, int] | None = None

    @property
    def max_abs_diff(self) -> float:
        return max(c.max_abs_diff for c in self.cases)

    def passed_case(self, case: CheckCase) -> bool:
        return case.max_abs_diff <= self.atol + self.rtol * case.logit_scale and case.top1_agree == 1.0

    @property
    def passed(self) -> bool:
        return all(self.passed_case(c) for c in self.cases)


def _source_maps(
    n_models: int, mask: torch.Tensor, n_slots: int, n_random: int, gen: torch.Generator
) -> list[tuple[str, torch.Tensor]]:
    batch, seq = mask.shape
    shape = (batch, seq, n_slots)
    maps = [(f"all from model {m}", torch.full(shape, m, dtype=torch.long)) for m in range(n_models)]
    for i in range(n_random):
        maps.append((f"random cells #{i}", torch.randint(0, n_models, shape, generator=gen)))
        # A structured map like the paper's: a few positions, a block of slots, one donor.
        src = torch.zeros(shape, dtype=torch.long)
        lo = int(torch.randint(0, n_slots, (1,), generator=gen))
        hi = int(torch.randint(lo + 1, n_slots + 1, (1,), generator=gen))
        positions = torch.rand(batch, seq, generator=gen) < 0.4
        donor = int(torch.randint(1, max(n_models, 2), (1,), generator=gen)) % n_models
        src[..., lo:hi][positions] = donor
        maps.append((f"positions x slots[{lo}:{hi}] #{i}", src))
    return maps


# (atol, rtol) of the engine against the per-token definition in the same dtype. Both run the
# same operations, batched and ordered differently, so they differ by rounding only, and a
# deep model amplifies rounding, most of all under random per-cell source maps (a chimera of
# two models). Seen: float64 6.4e-14 on SmolLM2-135M (30 layers) under random maps; float32
# <= 1.6e-5 on the tiny models, 1.1e-2 at logit scale 33 (3.3e-4 relative) on SmolLM2 under
# random maps (plain HF forward passes of one prompt alone vs in a padded batch already differ
# by 1e-3 there); bfloat16 bit-identical and float16 <= 7.3e-4 relative on CPU (tiny models).
ORACLE_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-4, 1e-3),
    torch.bfloat16: (0.0, 3e-2),
    torch.float16: (0.0, 5e-3),
}


def tolerance(model: nn.Module) -> tuple[float, float]:
    """``(atol, rtol)`` for a model's parameter dtype (float32's for anything else)."""
    dtype = next(model.parameters()).dtype
    return ORACLE_TOLERANCE.get(dtype, ORACLE_TOLERANCE[torch.float32])


@torch.no_grad()
def check_engine(
    models: Sequence[nn.Module],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    n_random: int = 2,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
) -> CheckReport:
    """Compare ``graft_forward`` with ``per_token_forward`` on uniform and random source maps.

    A case passes when ``max|Δ logit| <= atol + rtol * max|logit|`` and the top-1 token agrees
    at every real position. Tolerances default to ``ORACLE_TOLERANCE`` for the models' dtype.
    Differences are taken in float64; float64 models compute in float64 throughout
    (:func:`~weightgraft.engine.precision.float64_exact`), so their differences are rounding.
    """
    with float64_exact(models), eager_attention(models):  # like with like: the reference runs eager too
        return _check(models, input_ids, attention_mask, n_random, seed, atol, rtol)


def _check(
    models: Sequence[nn.Module], input_ids: torch.Tensor, attention_mask: torch.Tensor,
    n_random: int, seed: int, atol: float | None, rtol: float | None,
) -> CheckReport:
    default_atol, default_rtol = tolerance(models[0])
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    gen = torch.Generator().manual_seed(seed)
    composite = CompositeModel(models)
    n_slots = len(slots(models[0]))
    real = attention_mask.bool()
    cases = []
    maps = _source_maps(len(models), attention_mask, n_slots, n_random, gen)
    for name, source in maps:
        fast = graft_forward(models, input_ids, source, attention_mask=attention_mask)
        ref = per_token_forward(models, input_ids, source, attention_mask=attention_mask, composite=composite)
        fast, ref = fast[real].double(), ref[real].double()
        engine_vs_plain = reference_vs_plain = None
        only = torch.unique(source)
        if only.numel() == 1:
            plain = models[int(only)](input_ids=input_ids, attention_mask=attention_mask).logits
            plain = plain[real].double()
            engine_vs_plain = (fast - plain).abs().max().item()
            reference_vs_plain = (ref - plain).abs().max().item()
        cases.append(
            CheckCase(
                name=name,
                max_abs_diff=(fast - ref).abs().max().item(),
                logit_scale=ref.abs().max().item(),
                top1_agree=(fast.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                engine_vs_plain=engine_vs_plain,
                reference_vs_plain=reference_vs_plain,
            )
        )
    cases.append(_prefix_case(models, input_ids, attention_mask, maps, gen))
    cases.append(_depth_case(models, input_ids, attention_mask, gen))
    flips = None
    if next(models[0].parameters()).dtype in (torch.bfloat16, torch.float16):
        flips = routing_flips(models, input_ids, attention_mask, [source for _, source in maps])
    return CheckReport(cases=cases, atol=atol, rtol=rtol, routing_flips=flips)


@torch.no_grad()
def routing_flips(
    models: Sequence[nn.Module], input_ids: torch.Tensor, attention_mask: torch.Tensor,
    sources: Sequence[torch.Tensor], against: Sequence[nn.Module] | None = None,
) -> tuple[int, int] | None:
    """``(differing, decisions)``: at each real position and router, whether the experts the
    grafted pass picks (as a set) differ from those of the same pass ``against`` other models
    (default: float32 copies of ``models``), over every map of ``sources``; None without routers.
    In half precision a router's top-k can flip where two scores are near: the logits there move
    far more than rounding elsewhere, so the count is reported, not folded into a tolerance."""
    routers = [slot.parts[0].path for slot in model_slots(models[0]) if slot.router]
    if not routers:
        return None
    wide = list(against) if against is not None else [copy.deepcopy(m).float() for m in models]
    real = attention_mask.reshape(-1).bool()
    differing = decisions = 0
    for source in sources:
        picks = [_picks(ms, routers, input_ids, attention_mask, source) for ms in (models, wide)]
        for path in routers:
            mine, theirs = (p[path].sort(dim=-1).values[real.to(p[path].device)] for p in picks)
            differing += int((mine != theirs.to(mine.device)).any(dim=-1).sum())
            decisions += int(real.sum())
    return differing, decisions


def _picks(models: Sequence[nn.Module], routers: list[str], input_ids: torch.Tensor, attention_mask: torch.Tensor,
           source: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per router of ``models[0]``, the experts it picks at each ``[batch * seq]`` row of one grafted pass."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [models[0].get_submodule(path).register_forward_hook(
        lambda _m, _args, out, path=path: seen.__setitem__(path, out[2].detach())) for path in routers]
    try:
        graft_forward(models, input_ids, source, attention_mask=attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _prefix_case(
    models: Sequence[nn.Module], input_ids: torch.Tensor, attention_mask: torch.Tensor,
    maps: list[tuple[str, torch.Tensor]], gen: torch.Generator,
) -> CheckCase:
    """The runner's path, ``prefix_forward``: every map's rows, each beside a twin that
    differs at its last position only (so the two share a prefix through the KV cache),
    against ``graft_forward`` on each row alone (which the cases above held to the
    definition)."""
    items: list[GraftItem] = []
    for _, source in maps:
        for b in range(input_ids.shape[0]):
            n = int(attention_mask[b].sum())
            ids = input_ids[b][attention_mask[b].bool()].tolist()
            src = source[b][attention_mask[b].bool().to(source.device)]  # maps live on the CPU
            twin = src.clone()
            twin[-1] = torch.randint(0, len(models), twin[-1].shape, generator=gen)
            items += [GraftItem(ids, SourceMap(row), logit_start=n - 1) for row in (src, twin)]
    shared = prefix_forward(models, items, pad_id=0)[:, 0].double()  # padding is masked out
    alone = _alone(models, items, input_ids.device)
    return CheckCase(
        name="prefix sharing (runner)",
        max_abs_diff=(shared - alone).abs().max().item(),
        logit_scale=alone.abs().max().item(),
        top1_agree=(shared.argmax(-1) == alone.argmax(-1)).float().mean().item(),
    )


def _alone(models: Sequence[nn.Module], items: Sequence[GraftItem], device: torch.device) -> torch.Tensor:
    """Each item's last logits from ``graft_forward`` on its row alone."""
    return torch.stack([
        graft_forward(models, torch.tensor([it.input_ids], device=device), it.maps.batch_of_one())[0, -1]
        for it in items
    ]).double()


def _depth_case(
    models: Sequence[nn.Module], input_ids: torch.Tensor, attention_mask: torch.Tensor, gen: torch.Generator,
) -> CheckCase:
    """The exact-effects path, ``depth_forward``: per prompt, single cells and small sets of
    cells anywhere (each row run from its first position and layer on the base's states), and
    a set without each of its cells (run on the whole set's states), against ``graft_forward``
    on each row alone."""
    n_slots = len(slots(models[0]))
    items: list[GraftItem] = []
    references: list[GraftItem] = []
    for b in range(input_ids.shape[0]):
        ids = input_ids[b][attention_mask[b].bool()].tolist()
        n = len(ids)
        for size in (1, 1, 1, 3):
            src = torch.zeros(n, n_slots, dtype=torch.long)
            for _ in range(size):
                t, s = (int(torch.randint(0, m, (1,), generator=gen)) for m in (n, n_slots))
                src[t, s] = int(torch.randint(1, max(len(models), 2), (1,), generator=gen)) % len(models)
            items.append(GraftItem(ids, SourceMap(src), logit_start=n - 1))
        whole = (torch.rand(n, n_slots, generator=gen) < 0.2).long() * min(1, len(models) - 1)
        references.append(GraftItem(ids, SourceMap(whole), logit_start=n - 1))
        for t, s in whole.nonzero().tolist()[:4]:
            without = whole.clone()
            without[t, s] = 0
            items.append(GraftItem(ids, SourceMap(without), logit_start=n - 1))
    shared = depth_forward(models, items, pad_id=0, references=references)[:, 0].double()
    alone = _alone(models, items, input_ids.device)
    return CheckCase(
        name="depth sharing (cells)",
        max_abs_diff=(shared - alone).abs().max().item(),
        logit_scale=alone.abs().max().item(),
        top1_agree=(shared.argmax(-1) == alone.argmax(-1)).float().mean().item(),
    )
