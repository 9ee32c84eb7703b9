"""What of a vision-language checkpoint is not grafted, said rather than hidden.

A text prompt reaches only the language model: the vision tower and the projector are outside
every slot. So (1) a donor whose vision tower differs from the base's is reported (its
difference is not grafted: no text prompt would see it), and (2) a prompt that holds an image
or video placeholder token is refused (the image it stands for never enters a grafted pass).

A checkpoint loaded whole keeps its config and its vision tower: both are read from the model.
A checkpoint whose language model alone was loaded (``weightgraft.models.vision_language``)
carries a :class:`Checkpoint` record instead: the digest of the tensors it left unread and its
placeholder ids.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from weightgraft.engine import lora, projections
from weightgraft.engine.architectures.table import adapter_for, wrapper_of
from weightgraft.errors import GraftArgumentError

CHECKPOINT_ATTR = "weightgraft_checkpoint"  # the attribute a language model loaded alone carries
# The attribute a lean donor of a whole checkpoint carries: the first tensor outside the language
# model where the donor's file differs from the base (it shares the base's tensors there), or None.
OUTSIDE_DIFFERS_ATTR = "weightgraft_outside_differs"


@dataclass(frozen=True)
class Checkpoint:
    """Where a language model loaded alone came from: its checkpoint's ``model_type``, the sha256
    of the checkpoint's tensors outside the language model (None: none were found) and the ids of
    its image / video placeholder tokens."""

    model_type: str
    outside_sha256: str | None
    media_tokens: tuple[int, ...]


class OutsideDifference(UserWarning):
    """A donor differs from the base where no text prompt reaches (a vision tower): not grafted."""


def checkpoint_of(model: nn.Module) -> Checkpoint | None:
    """The record of a language model loaded alone, None for any other model."""
    found = getattr(model, CHECKPOINT_ATTR, None)
    return found if isinstance(found, Checkpoint) else None


def media_tokens(model: nn.Module) -> tuple[int, ...]:
    """The placeholder ids where images or videos enter this model's prompts (none for a text model)."""
    record = checkpoint_of(model)
    if record is not None:
        return record.media_tokens
    config = projections.hf_config(model)
    wrapper = wrapper_of(config)
    if wrapper is None:
        return ()
    return media_token_ids(config, wrapper.media_tokens)


def media_token_ids(config: object, attributes: Sequence[str]) -> tuple[int, ...]:
    """The integer token ids a config names under ``attributes`` (each once)."""
    ids = {getattr(config, a, None) for a in attributes}
    return tuple(sorted(i for i in ids if isinstance(i, int)))


def refuse_media(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
    """One line for a batch that holds an image or video placeholder token at a real position."""
    ids = media_tokens(model)
    if not ids or input_ids.numel() == 0:
        return
    hit = torch.isin(input_ids, torch.tensor(ids, device=input_ids.device))
    if attention_mask is not None:
        hit &= attention_mask[..., -input_ids.shape[-1]:].bool()
    if bool(hit.any()):
        row, pos = (int(v) for v in hit.nonzero()[0])
        raise media_refusal(f"prompt {row}", int(input_ids[row, pos]), pos)


def media_refusal(prompt: str, token_id: int, position: int) -> GraftArgumentError:
    """The one line that refuses a prompt holding an image or video placeholder token."""
    return GraftArgumentError(
        f"{prompt} holds an image/video placeholder token (id {token_id}) at position {position}: "
        "weightgraft grafts a vision-language model's language model on text prompts; images never "
        "reach the grafted pass. Remove the placeholder from the prompt"
    )


_SEEN: weakref.WeakKeyDictionary[nn.Module, tuple[int, int, list[str]]] = weakref.WeakKeyDictionary()


def outside_differences(models: Sequence[nn.Module]) -> list[str]:
    """Per donor that differs from ``models[0]`` outside the language model (a vision tower, a
    projector), one line naming where; empty for text models and for donors that match."""
    base = models[0]
    found = []
    for i, other in enumerate(models[1:], start=1):
        if other is base:
            continue
        where = _outside_difference(base, other)
        if where is not None:
            found.append(f"models[{i}] differs from the base in {where}, which no text prompt reaches: "
                         "not grafted (every graft there serves the base's weights, and a text prompt sees none)")
    return found


def _outside_difference(base: nn.Module, other: nn.Module) -> str | None:
    mine, theirs = checkpoint_of(base), checkpoint_of(other)
    if mine is not None or theirs is not None:
        # a text-only finetune of the language model (no record) has no tower to differ in
        if mine is None or theirs is None or mine.outside_sha256 == theirs.outside_sha256:
            return None
        return "the tensors its checkpoint holds outside the language model (the vision tower, the projector)"
    outside = adapter_for(projections.hf_config(base)).outside
    if not outside:
        return None
    if hasattr(other, OUTSIDE_DIFFERS_ATTR):  # a lean donor: what its file holds, not what it shares
        lean: str | None = getattr(other, OUTSIDE_DIFFERS_ATTR)
        return lean
    params = [(n, p) for n, p in other.named_parameters(remove_duplicate=False)
              if any(n == root or n.startswith(f"{root}.") for root in outside)]
    version = sum(p._version for _, p in params)
    cached = _SEEN.get(other)
    if cached is not None and cached[:2] == (id(base), version):
        return cached[2][0] if cached[2] else None
    mine_params = dict(base.named_parameters(remove_duplicate=False))
    differ = []
    for name, p in params:
        canonical = lora.canonical_name(name)
        q = mine_params.get(canonical or "")
        if canonical != name or q is None or q.shape != p.shape or not torch.equal(q, p):
            differ.append(name.rsplit(".", 1)[0] if canonical != name else name)
    _SEEN[other] = (id(base), version, differ[:1])
    return differ[0] if differ else None
