"""``weightgraft.grafted``: the base HF model, grafted, for whatever input it is given.

Within ``with wg.grafted(models, tok, rules) as model:`` every call of ``model`` (its forward,
``model.generate``, forward hooks on its modules, tools that trace it) runs the grafted
computation. Positions are resolved per input: the rules' selectors are applied to the
tokens of each row, whose text is recovered from the token ids. A call that continues a KV
cache (generation) adds positions after the text so far: as in the per-token definition, a
new token takes the weights the rules give the last position, and spans stay in the prompt.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from weightgraft.data.spans import SpanError, SpanSpec, resolve_spans
from weightgraft.engine.forward import graft_call
from weightgraft.engine.source_map import SourceMap
from weightgraft.engine.swaps import own_forward, swaps
from weightgraft.schemes.binding import GraftInputError, Rules, prepare_graft
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL
from weightgraft.schemes.scheme import CompiledScheme
from weightgraft.schemes.selectors import SpanNotFound

if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from torch import nn
    from transformers import PreTrainedTokenizerBase

@dataclass
class _Row:
    """One row's text so far: its token offsets and the prompt's named spans."""

    offsets: list[tuple[int, int]]
    spans: dict[str, tuple[int, int]]
    text_len: int
    added: int = 0  # positions added after the prompt (generated tokens)


@dataclass
class _State:
    inside: bool = False
    ids: torch.Tensor | None = None  # every position of the current sequence so far
    rows: list[_Row | None] = field(default_factory=list)


def _offsets(tokenizer: Any, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of ``ids`` and each token's character span in it: the tokenizer's own offsets
    for the first text that encodes back to these ids (the decoded sequence, or its tokens'
    decodings joined), else the joined decodings' lengths."""
    pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in ids]
    for text in (tokenizer.decode(ids, skip_special_tokens=True), "".join(pieces)):
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True)
        if list(enc["input_ids"]) == ids:
            return text, [tuple(o) for o in enc["offset_mapping"]]
    ends = list(itertools.accumulate(len(p) for p in pieces))
    return "".join(pieces), [(ends[i - 1] if i else 0, e) for i, e in enumerate(ends)]


def _sources(compiled: CompiledScheme, row: _Row) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    try:
        return compiled.sources(row.offsets, row.spans)
    except SpanNotFound as exc:
        raise GraftInputError(f"grafted model: {exc} (pass spans={{name: substring}} to wg.grafted)") from exc


def _start_rows(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor, spans: Mapping[str, SpanSpec] | None) -> list[_Row | None]:
    rows: list[_Row | None] = []
    for b in range(ids.shape[0]):
        real = ids[b][mask[b].bool()].tolist()
        if not real:
            rows.append(None)
            continue
        text, offsets = _offsets(tokenizer, real)
        try:
            char_spans = resolve_spans(text, spans)
        except SpanError as exc:
            raise GraftInputError(f"grafted model, row {b} ({text!r}): {exc}") from exc
        rows.append(_Row(offsets, char_spans, len(text)))
    return rows


def _extend(row: _Row, n_new: int) -> None:
    """New tokens sit after the prompt's text: no prompt span reaches them."""
    start = row.text_len + row.added
    row.offsets = row.offsets + [(start + i, start + i + 1) for i in range(n_new)]
    row.added += n_new


def _left_padded(input_ids: torch.Tensor, mask: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch with each row's tokens moved to the right end: generation appends after the
    last column, so a right-padded row would continue from its padding."""
    n_real = mask.sum(1)
    n = mask.shape[1]
    ids = torch.full_like(input_ids, pad_id)
    new_mask = torch.zeros_like(mask)
    for b in range(input_ids.shape[0]):
        real = input_ids[b][mask[b].bool()]
        ids[b, n - int(n_real[b]):] = real
        new_mask[b, n - int(n_real[b]):] = 1
    return ids, new_mask


@contextmanager
def grafted(
    models: Mapping[str, nn.Module], tokenizer: PreTrainedTokenizerBase, rules: Rules, *, base: str | None = None,
    spans: Mapping[str, SpanSpec] | None = None, protocol: str = DEFAULT_PROTOCOL,
) -> Iterator[Any]:
    """The base model (the first role, or ``base``), running grafted inside the block.

    ``rules`` as in :func:`weightgraft.graft` (one Rule, a list, or a Scheme); ``spans`` names
    spans of the prompts by substring (``{"actor": "Keanu Reeves"}``), found in each row's
    text. ``model(input_ids, attention_mask=...)``, ``model.generate(...)``, hooks and
    tracers see the grafted pass; the model is itself again on exit. ``model.generate`` runs a
    right-padded batch left-padded (rows keep their width; the continuation of every row
    starts at the batch's prompt width), so each row generates what it would alone."""
    prepared = prepare_graft(models, rules, base=base, tokenizer=tokenizer, protocol=protocol)
    ordered, (compiled,) = prepared.models, prepared.compiled
    model = ordered[0]
    plain = own_forward(model)
    state = _State()

    @functools.wraps(plain)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if state.inside:  # the engine's own call of the base model
            return plain(*args, **kwargs)
        input_ids = kwargs.pop("input_ids", args[0] if args else None)
        if input_ids is None:
            raise GraftInputError("a grafted model takes input_ids (inputs_embeds have no tokens to place rules on)")
        mask = kwargs.pop("attention_mask", None)
        cache = kwargs.pop("past_key_values", None)
        use_cache = kwargs.pop("use_cache", None)
        cached = cache.get_seq_length() if cache is not None else 0
        batch, n_new = input_ids.shape
        if mask is None:
            mask = torch.ones(batch, cached + n_new, dtype=torch.long, device=input_ids.device)
        if cached == 0:
            state.ids = input_ids
            state.rows = _start_rows(tokenizer, input_ids.cpu(), mask.cpu(), spans)
        else:
            if state.ids is None or state.ids.shape[1] != cached:
                raise GraftInputError("a grafted model continued a KV cache it did not fill; start from the prompt")
            state.ids = torch.cat([state.ids, input_ids], dim=1)
            for b, row in enumerate(state.rows):
                if row is not None:
                    _extend(row, int(mask[b, cached:].sum()))
        source = torch.zeros(batch, n_new, compiled.n_slots, dtype=torch.long)
        head_source: dict[str, torch.Tensor] = {}
        new_mask = mask[:, cached:].bool().cpu()
        for b, row in enumerate(state.rows):
            if row is None or not new_mask[b].any():
                continue
            src, heads = _sources(compiled, row)
            n_real_new = int(new_mask[b].sum())
            source[b, new_mask[b]] = src[-n_real_new:]
            for name, h in heads.items():
                head_source.setdefault(name, torch.zeros(batch, n_new, h.shape[1], dtype=torch.long))
                head_source[name][b, new_mask[b]] = h[-n_real_new:]
        state.inside = True
        try:
            return graft_call(ordered, input_ids, SourceMap(source, head_source), attention_mask=mask,
                              past_key_values=cache, use_cache=use_cache)
        finally:
            state.inside = False

    plain_generate = model.__dict__.get("generate") or type(model).generate.__get__(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @functools.wraps(plain_generate)
    def generate(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if isinstance(ids, torch.Tensor) and mask is not None and ids.dim() == 2 and not mask[:, -1].all():
            ids, kwargs["attention_mask"] = _left_padded(ids, mask, pad_id)
            if args:
                args = (ids, *args[1:])
            else:
                kwargs["input_ids"] = ids
        return plain_generate(*args, **kwargs)

    with swaps() as swap:
        swap.forward(model, forward)
        swap.method(model, "generate", generate)
        yield model
