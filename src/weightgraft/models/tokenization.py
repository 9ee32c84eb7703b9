"""Tokenizing prompts for grafting: padded batches, and tokenizer agreement between models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from weightgraft.data.prompts import DatasetError
from weightgraft.errors import WeightgraftError


class TokenizerMismatchError(WeightgraftError, ValueError):
    """Two models of a graft set do not share a tokenizer."""


def check_same_tokenizer(base: Any, other: Any, where: str = "donor") -> None:
    """Grafting compares token ids across models: their vocabularies must be identical."""
    a, b = base.get_vocab(), other.get_vocab()
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()), key=str)[:3]
        raise TokenizerMismatchError(
            f"the tokenizer of {where} differs from the base's ({len(b)} vs {len(a)} entries; "
            f"first differences: {diff}); graft only models that share a tokenizer"
        )


def batch_encode(
    tokenizer: Any, texts: Sequence[str], device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` for ``texts``.

    A tokenizer without a pad token is padded with id 0: padded positions are masked out, so
    the id never matters.
    """
    encoded = [tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
    if any(len(e) == 0 for e in encoded):
        empty = next(t for t, e in zip(texts, encoded) if len(e) == 0)
        raise DatasetError(f"prompt {empty!r} tokenizes to nothing")
    seq = max(len(e) for e in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(texts), seq), pad, dtype=torch.long)
    mask = torch.zeros((len(texts), seq), dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, : len(e)] = torch.tensor(e)
        mask[i, : len(e)] = 1
    return ids.to(device), mask.to(device)
