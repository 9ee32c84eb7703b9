"""``weightgraft.graft``: grafted next-token logits for a list of prompts in one call, and what
it returns (:class:`GraftOutput`). The prompts become one engine batch: each prompt tokenized and
mapped on its own (``PreparedGraft.encode``, so positions are located on each prompt's own
tokens), then padded on the tokenizer's side with padding served by the base (it is masked out, so
it never matters)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from weightgraft.api.activations import activation_names, record, stacked
from weightgraft.engine.forward import graft_forward
from weightgraft.engine.source_map import SourceMap
from weightgraft.schemes.binding import Encoded, GraftInputError, Rules, Spans, one_or_many, prepare_graft
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL

if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from torch import nn
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class GraftOutput:
    """The grafted forward pass of a list of prompts.

    ``logits`` is ``[len(prompts), vocab]``: the next-token logits at each prompt's last token.
    ``full_logits`` is ``[batch, seq, vocab]`` over the padded batch (``input_ids``,
    ``attention_mask``; padded on the tokenizer's side) when asked for, else ``None``.
    ``source`` (``[batch, seq, n_slots]``, indices into the roles, base first) and
    ``head_source`` are the maps the pass ran: what was grafted where (``weightgraft.slots``
    names the slots), and the inputs of an equivalent ``weightgraft.graft_forward`` call.
    ``cache`` (when asked for) maps activation names to ``[batch, seq, ...]`` tensors over
    the padded batch: each slot's module output as the grafted pass computed it (``embed``,
    ``layers.{i}.q``, ``layers.{i}.o``, ``layers.{i}.down``, ``final_norm``, ...) and the
    residual stream after each layer, ``layers.{i}.resid_post``.
    """

    prompts: list[str]
    logits: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokenizer: Any
    source: torch.Tensor
    roles: list[str]
    head_source: dict[str, torch.Tensor] = field(default_factory=dict)
    full_logits: torch.Tensor | None = None
    cache: dict[str, torch.Tensor] | None = None
    protocol: str = DEFAULT_PROTOCOL  # what the rules were compiled under (README: protocols)

    def top(self, k: int = 5) -> list[list[tuple[str, float]]]:
        """Per prompt, the ``k`` most probable next tokens as (decoded token, probability)."""
        if k < 1:
            raise ValueError("k must be at least 1")
        probs = torch.softmax(self.logits.detach().float(), dim=-1)
        values, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
        return [
            [(self.tokenizer.decode([int(i)]), float(p)) for i, p in zip(row_ids, row_p, strict=True)]
            for row_ids, row_p in zip(ids.tolist(), values.tolist(), strict=True)
        ]

    def top_frame(self, k: int = 5) -> pd.DataFrame:
        """``top(k)`` as a tidy table, one row per (prompt, rank): columns ``prompt_index``,
        ``prompt`` (its text, as in ``wg.compare``'s rows), ``rank`` (0 = likeliest, the
        convention of a run's ``rank`` column), ``token``, ``token_id`` and ``probability``."""
        if k < 1:
            raise ValueError("k must be at least 1")
        probs = torch.softmax(self.logits.detach().float(), dim=-1)
        values, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
        rows = [
            {"prompt_index": b, "prompt": self.prompts[b], "rank": r, "token": self.tokenizer.decode([int(i)]),
             "token_id": int(i), "probability": float(p)}
            for b, (row_ids, row_p) in enumerate(zip(ids.tolist(), values.tolist(), strict=True))
            for r, (i, p) in enumerate(zip(row_ids, row_p, strict=True))
        ]
        return pd.DataFrame(rows, columns=["prompt_index", "prompt", "rank", "token", "token_id", "probability"])

    def __repr__(self) -> str:
        full = "" if self.full_logits is None else f", full_logits={list(self.full_logits.shape)}"
        cache = "" if self.cache is None else f", cache={len(self.cache)} activations"
        n = len(self.prompts)
        return (f"GraftOutput({n} prompt{'' if n == 1 else 's'}, protocol={self.protocol}, "
                f"logits={list(self.logits.shape)}{full}{cache})")


@dataclass(frozen=True)
class Batch:
    """Engine inputs for a list of prompts; ``last`` is each row's last real token."""

    input_ids: torch.Tensor  # [batch, seq]
    attention_mask: torch.Tensor  # [batch, seq]
    source: torch.Tensor  # [batch, seq, n_slots]
    head_source: dict[str, torch.Tensor]  # slot name -> [batch, seq, heads]
    last: torch.Tensor  # [batch]


def pad(encoded: Sequence[Encoded], pad_id: int, left: bool, seq: int | None = None) -> Batch:
    """Stack prompts into one batch, padded on the left or the right to ``seq`` tokens."""
    seq = seq or max(len(e.input_ids) for e in encoded)
    batch, n_slots = len(encoded), encoded[0].source.shape[1]
    ids = torch.full((batch, seq), pad_id, dtype=torch.long)
    mask = torch.zeros(batch, seq, dtype=torch.long)
    source = torch.zeros(batch, seq, n_slots, dtype=torch.long)
    widths = {name: h.shape[1] for e in encoded for name, h in e.heads.items()}
    heads = {name: torch.zeros(batch, seq, w, dtype=torch.long) for name, w in widths.items()}
    last = torch.empty(batch, dtype=torch.long)
    for b, e in enumerate(encoded):
        n = len(e.input_ids)
        span = slice(seq - n, seq) if left else slice(0, n)
        ids[b, span] = torch.tensor(e.input_ids)
        mask[b, span] = 1
        source[b, span] = e.source
        last[b] = seq - 1 if left else n - 1
        for name, h in e.heads.items():  # one scheme: every prompt maps the same slots
            heads[name][b, span] = h
    return Batch(ids, mask, source, heads, last)


def graft(
    models: Mapping[str, nn.Module], tokenizer: PreTrainedTokenizerBase, prompts: str | Sequence[str], rules: Rules,
    *, base: str | None = None, spans: Spans | Mapping[str, Any] = None, protocol: str = DEFAULT_PROTOCOL,
    full_logits: bool = False, cache: bool | Sequence[str] = False,
) -> GraftOutput:
    """Run ``prompts`` once with the weights ``rules`` choose, and return the logits.

    ``models`` maps roles to HF models that share an architecture (``{"pre": pre, "sft":
    sft}``); slots no rule claims come from ``base`` (default: the first role). ``rules`` is one
    :class:`~weightgraft.Rule`, a list of them (later rules win), or a
    :class:`~weightgraft.Scheme`. ``spans`` gives, per prompt, named spans as a substring or
    ``(start, end)`` characters, so that ``positions="subject"`` selects the subject's tokens.
    One prompt may be a string (its spans one mapping): the output then holds one row.
    The last token, padding (either side), tied embeddings and per-head rules are handled here;
    a rule that selects no token of some prompt is an error naming it. Runs without gradients.

    ``cache=True`` (or a list of names) fills ``out.cache`` with the grafted pass's
    activations, ``[batch, seq, ...]`` over the padded batch: every slot's module output
    (``layers.{i}.o``, ``layers.{i}.down``, ...) and ``layers.{i}.resid_post``.
    """
    prompts, spans = one_or_many(prompts, spans)
    prepared = prepare_graft(models, rules, base=base, prompts=prompts, spans=spans, tokenizer=tokenizer,
                             protocol=protocol)
    roles, ordered = prepared.roles, prepared.models
    names = check_cache(cache, ordered[0])
    encoded = prepared.encode(tokenizer, prompts)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = pad(encoded, pad_id, left=getattr(tokenizer, "padding_side", "right") == "left")
    with torch.no_grad(), record(ordered[0], names) as seen:
        logits = graft_forward(
            ordered, batch.input_ids, SourceMap(batch.source, batch.head_source), attention_mask=batch.attention_mask,
            logit_positions=None if full_logits else batch.last[:, None],
        )
    rows = torch.arange(len(encoded), device=logits.device)
    last = logits[rows, batch.last.to(logits.device)] if full_logits else logits[:, 0]
    _flag_non_finite(last, list(prompts))
    return GraftOutput(
        prompts=list(prompts), logits=last, input_ids=batch.input_ids,
        attention_mask=batch.attention_mask, tokenizer=tokenizer, source=batch.source, roles=roles,
        head_source=batch.head_source, full_logits=logits if full_logits else None,
        cache=stacked(seen) if names else None, protocol=protocol,
    )



def _flag_non_finite(logits: torch.Tensor, prompts: list[str]) -> None:
    """A warning naming the prompts whose logits are not all finite (never a silent NaN)."""
    bad = [i for i, ok in enumerate(torch.isfinite(logits).all(dim=-1).tolist()) if not ok]
    if bad:
        warnings.warn(f"{len(bad)} of {len(prompts)} prompts have non-finite logits (prompt {bad[0]}: "
                      f"{prompts[bad[0]]!r}); under padding, a sliding-window model's fully masked padded "
                      "positions can make them NaN in eager attention: run those prompts alone or with less padding",
                      RuntimeWarning, stacklevel=3)


def check_cache(cache: bool | Sequence[str], model: nn.Module) -> list[str]:
    """The activation names ``cache=`` asks for (``True``: all of them), each one the model has."""
    if cache is False or cache is None:
        return []
    known = activation_names(model)
    if cache is True:
        return known
    if isinstance(cache, str) or not isinstance(cache, Sequence):
        raise GraftInputError("cache must be True or a list of activation names, e.g. ['layers.3.resid_post']")
    unknown = [n for n in cache if n not in known]
    if unknown:
        raise GraftInputError(
            f"cache names {unknown[0]!r}, which this model does not have; names look like "
            f"{', '.join(known[:3])}, ..., {known[-2]} (weightgraft.api.activations.activation_names)"
        )
    return list(dict.fromkeys(cache))
