"""``weightgraft.generate``: the continuation a grafted model writes after a prompt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from weightgraft.data.spans import SpanSpec
from weightgraft.engine.generate import generate_one
from weightgraft.schemes.binding import GraftInputError, Rules, prepare_graft
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL
from weightgraft.schemes.selectors import SpanNotFound

DEFAULT_ROLES = ("pre", "sft")



if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from torch import nn
    from transformers import PreTrainedTokenizerBase

def _as_mapping(models: Mapping[str, Any] | Sequence[Any]) -> Mapping[str, Any]:
    """A plain sequence of models is read as (pre, sft)."""
    if isinstance(models, Mapping):
        return models
    models = list(models)
    if len(models) > len(DEFAULT_ROLES):
        raise GraftInputError(
            f"{len(models)} models given as a sequence; pass a mapping role -> model "
            f"(roles of a sequence are {', '.join(DEFAULT_ROLES)})"
        )
    return dict(zip(DEFAULT_ROLES, models))


def generate(
    models: Mapping[str, nn.Module] | Sequence[nn.Module],
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | Sequence[str],
    rules: Rules | None = None,
    *,
    max_new_tokens: int = 20,
    do_sample: bool = False,
    spans: Mapping[str, SpanSpec] | Sequence[Mapping[str, SpanSpec] | None] | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    base: str | None = None,
    protocol: str = DEFAULT_PROTOCOL,
) -> str | list[str]:
    """The continuation of ``prompt`` (a str, or a list of them) by the grafted model.

    ``models``: role -> model, or ``[pre, sft]``; slots no rule claims come from ``base``
    (default: the first role). ``rules``: one :class:`~weightgraft.Rule`, a list of them, or a
    :class:`~weightgraft.Scheme`, as in :func:`weightgraft.graft`; None runs the base alone.
    ``spans``: the prompt's named spans (substrings or ``(start, end)`` characters) that
    position selectors refer to; one mapping per prompt for a list. Each new token is the last
    position when it is processed, so it takes the weights the rules give the last token.
    Greedy unless ``do_sample`` (seeded by ``seed``).
    """
    prepared = prepare_graft(_as_mapping(models), [] if rules is None else rules, base=base, protocol=protocol)
    ordered, (compiled,) = prepared.models, prepared.compiled
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    per_prompt: list[Mapping[str, SpanSpec] | None]
    if spans is None or isinstance(spans, Mapping):
        per_prompt = [spans] * len(prompts)
    elif isinstance(prompt, str):  # one prompt, its spans given as a list: a list of one mapping
        if len(spans) != 1:
            raise GraftInputError(f"one prompt takes one mapping of spans; got a list of {len(spans)}")
        per_prompt = [spans[0]]
    else:
        per_prompt = list(spans)
        if len(per_prompt) != len(prompts):
            raise GraftInputError(f"{len(per_prompt)} span mappings for {len(prompts)} prompts")
    texts = []
    for i, (p, s) in enumerate(zip(prompts, per_prompt)):
        try:
            texts.append(generate_one(ordered, tokenizer, p, compiled=compiled, spans=s, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                      temperature=temperature, top_k=top_k, seed=seed).text)
        except SpanNotFound as exc:
            raise GraftInputError(f"prompt {i} ({p!r}): {exc}") from exc
    return texts[0] if isinstance(prompt, str) else texts
