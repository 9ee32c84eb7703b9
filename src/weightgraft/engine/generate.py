"""Grafted generation: a continuation written by a grafted model, token by token.

Dynamic grafting decides a position's weights when that position is processed. During
generation each new token is the last token when it is processed, so it takes the weights the
scheme gives the last position of the text so far; spans refer to the prompt. The prompt runs
once (one ``graft_forward`` call filling a KV cache), then every new token is one cached call,
so a continuation costs what HF ``generate`` costs. ``tests/api/test_generate.py`` holds it to
``per_token_forward`` on the same tokens and source map.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import nn
from transformers import DynamicCache

from weightgraft.data.spans import SpanSpec, resolve_spans
from weightgraft.engine.forward import graft_forward
from weightgraft.engine.projections import hf_config, input_embedding_weight
from weightgraft.engine.source_map import SourceMap
from weightgraft.errors import GraftArgumentError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class SourcePlan(Protocol):
    """What generation needs of a compiled scheme: the slot names and, for a text's token
    offsets, the source rows (``[tokens, slots]``) and per-head sources."""

    @property
    def slot_names(self) -> Sequence[str]: ...

    def sources(
        self, offsets: Sequence[tuple[int, int]], char_spans: Mapping[str, tuple[int, int]],
        answer_field: str | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


@dataclass
class Continuation:
    """One grafted continuation: the new token ids, their text, the logits that chose each
    token (``[n_new, vocab]``) and the source row (``[n_new, n_slots]``) each was run with."""

    prompt: str
    token_ids: list[int]
    text: str
    logits: torch.Tensor
    prompt_source: torch.Tensor
    new_source: torch.Tensor
    prompt_heads: dict[str, torch.Tensor]
    new_heads: dict[str, torch.Tensor]


def _offsets_with(offsets: list[tuple[int, int]], n_new: int, text_len: int) -> list[tuple[int, int]]:
    """Generated tokens sit after the prompt's text: no prompt span reaches them."""
    return offsets + [(text_len + i, text_len + i + 1) for i in range(n_new)]


def _check_held(row: torch.Tensor, heads: Mapping[str, torch.Tensor], names: Sequence[str],
                held: Mapping[int, set[int]]) -> None:
    index = {n: i for i, n in enumerate(names)}
    pairs = {(int(m), s) for s, m in enumerate(row.tolist())}
    pairs |= {(int(m), index[k]) for k, h in heads.items() for m in h.flatten().tolist()}
    missing = sorted(names[s] for m, s in pairs if m != 0 and s not in held.get(m, set()))
    if missing:
        raise GraftArgumentError(f"a continuation step needs slots {missing[:4]} that a lean donor does not hold")


def _sample(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
            gen: torch.Generator | None) -> int:
    if not do_sample:
        return int(logits.argmax())
    scores = logits.double() / temperature
    if top_k is not None:
        kth = torch.topk(scores, min(top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(scores, -1).cpu(), 1, generator=gen))


@torch.no_grad()
def generate_one(
    models: Sequence[nn.Module], tokenizer: PreTrainedTokenizerBase, prompt: str, *, compiled: SourcePlan,
    spans: Mapping[str, SpanSpec] | None = None, max_new_tokens: int = 20,
    do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
    seed: int = 0, stop_at_eos: bool = True, held: Mapping[int, set[int]] | None = None,
    answer_field: str | None = None,
) -> Continuation:
    """One prompt, one compiled scheme: the grafted continuation with its logits and sources.

    ``held`` (model index -> slot indices it holds, for lean donors) refuses a step that would
    read a slot a donor does not hold, instead of silently using the base's tensor there."""
    if max_new_tokens < 1:
        raise GraftArgumentError("max_new_tokens must be at least 1")
    if do_sample and temperature <= 0:
        raise GraftArgumentError("temperature must be positive when sampling")
    enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    char_spans = resolve_spans(prompt, spans)
    src, heads = compiled.sources(offsets, char_spans, answer_field)
    if held is not None:
        for t in range(len(src)):
            _check_held(src[t], {k: v[t : t + 1] for k, v in heads.items()}, compiled.slot_names, held)
    base = models[0]
    device = input_embedding_weight(base).device
    eos = tokenizer.eos_token_id if stop_at_eos else None
    gen = torch.Generator().manual_seed(seed) if do_sample else None
    cache = DynamicCache(config=hf_config(base))
    n = len(ids)
    logits = graft_forward(
        models, torch.tensor([ids], device=device), SourceMap(src, heads).batch_of_one(),
        logit_positions=torch.tensor([[n - 1]]),
        past_key_values=cache,
    )[0, -1]
    new_ids, steps, rows, head_rows = [], [], [], []
    while True:
        steps.append(logits.float().cpu() if logits.dtype != torch.float64 else logits.cpu())
        token = _sample(logits, do_sample, temperature, top_k, gen)
        new_ids.append(token)
        if len(new_ids) >= max_new_tokens or (eos is not None and token == eos):
            break
        # the new token is now the last position: the scheme's weights for it
        full, full_heads = compiled.sources(
            _offsets_with(offsets, len(new_ids), len(prompt)), char_spans, answer_field)
        row = full[-1:]
        step_heads = {k: v[-1:] for k, v in full_heads.items()}
        if held is not None:
            _check_held(row[0], step_heads, compiled.slot_names, held)
        rows.append(row)
        head_rows.append(step_heads)
        logits = graft_forward(
            models, torch.tensor([[token]], device=device), SourceMap(row, step_heads).batch_of_one(),
            attention_mask=torch.ones(1, n + len(new_ids), dtype=torch.long, device=device), past_key_values=cache,
        )[0, -1]
    n_slots = src.shape[1]
    new_source = torch.cat(rows) if rows else torch.empty(0, n_slots, dtype=torch.long)
    new_heads = {k: torch.cat([h[k] for h in head_rows]) for k in heads} if head_rows else {}
    return Continuation(
        # one sequence of ids decodes to one str (transformers types decode ``str | list[str]``)
        prompt=prompt, token_ids=new_ids, text=cast(str, tokenizer.decode(new_ids, skip_special_tokens=True)),
        logits=torch.stack(steps), prompt_source=src, new_source=new_source,
        prompt_heads=heads, new_heads=new_heads,
    )
