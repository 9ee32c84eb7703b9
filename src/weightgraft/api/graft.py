"""``weightgraft.graft``: grafted next-token logits for a list of prompts in one call."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TYPE_CHECKING

import torch

from weightgraft.schemes.protocol import DEFAULT_PROTOCOL
from weightgraft.api.batch import pad
from weightgraft.api.outputs import GraftOutput
from weightgraft.api.activations import activation_names, record, stacked
from weightgraft.engine.forward import graft_forward
from weightgraft.schemes.binding import GraftInputError, Rules, Spans, one_or_many, prepare_graft



if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from torch import nn
    from transformers import PreTrainedTokenizerBase

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
            ordered, batch.input_ids, batch.source, attention_mask=batch.attention_mask,
            logit_positions=None if full_logits else batch.last[:, None],
            head_source=batch.head_source or None,
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
