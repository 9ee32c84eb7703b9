"""Tokenizing prompts for grafting: padded batches, and tokenizer agreement between models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from weightgraft.data.prompts import DatasetError
from weightgraft.engine.architectures import text_config
from weightgraft.engine.projections import hf_config
from weightgraft.models.embedded import ensure_converted
from weightgraft.models.errors import ModelLoadError
from weightgraft.models.errors import TokenizerMismatchError as TokenizerMismatchError
from weightgraft.models.spec import embedded_name, parse_spec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from weightgraft.models.loaded import LoadedModel
    from weightgraft.models.spec import ModelSpec


def check_same_tokenizer(base: PreTrainedTokenizerBase | None, other: PreTrainedTokenizerBase | None,
                         where: str = "donor") -> None:
    """Grafting compares token ids across models: their vocabularies must be identical (two
    models without a tokenizer, ``random:`` ones, share none to compare)."""
    if base is None or other is None:
        if base is not other:
            raise TokenizerMismatchError(f"{where} and the base do not both have a tokenizer; give one to both "
                                         "(a config's tokenizer) or to neither")
        return
    a, b = base.get_vocab(), other.get_vocab()
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()), key=str)[:3]
        raise TokenizerMismatchError(
            f"the tokenizer of {where} differs from the base's ({len(b)} vs {len(a)} entries; "
            f"first differences: {diff}); graft only models that share a tokenizer"
        )


def batch_encode(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], device: str | torch.device = "cpu"
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


BYTES = "bytes"  # the byte-level fallback: one token per byte, for any model of 259+ entries


def _byte_tokenizer() -> Any:
    """One token per UTF-8 byte plus ``<pad> <s> </s>``: a fast tokenizer (offsets included)
    that fits every vocabulary, for models that ship none."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<pad>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate([*specials, *sorted(alphabet)])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer a config gives for models without one (``random:NAME``): ``bytes``, an
    embedded model's name (its tokenizer), or a local directory holding a tokenizer."""
    from transformers import AutoTokenizer

    text = str(spec).strip()
    if text == BYTES:
        return _byte_tokenizer()
    where = ensure_converted(text) if embedded_name(text) else Path(text).expanduser()
    try:
        if not where.is_dir():  # never a hub id: transformers would ask the hub for it
            raise FileNotFoundError(where)
        tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # no tokenizer files, or unreadable ones
        raise ModelLoadError(f"tokenizer {text!r}: no tokenizer there ({type(exc).__name__}); give a directory "
                             f"saved with tokenizer.save_pretrained, an embedded model's name or {BYTES!r}") from None
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"tokenizer {text!r} is a slow tokenizer; spans need a fast one (offset mapping)")
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def check_tokenizer_fits(tokenizer: PreTrainedTokenizerBase, name: str, vocab_sizes: dict[str, int]) -> None:
    """Every token id must be a row of each model's embedding: one line otherwise, before any
    model loads."""
    for role, size in vocab_sizes.items():
        if len(tokenizer) > size:
            raise TokenizerMismatchError(
                f"tokenizer {name!r} has {len(tokenizer)} tokens but model {role!r} has a vocabulary of "
                f"{size}: its ids would index past the embedding; give a tokenizer of at most {size} "
                f"tokens (e.g. {BYTES!r})")


def give_tokenizer(loaded: LoadedModel, tokenizer: PreTrainedTokenizerBase | None, role: str) -> None:
    """A loaded model without a tokenizer (``random:NAME``) takes the config's, if it fits."""
    if tokenizer is None or loaded.tokenizer is not None:
        return
    check_tokenizer_fits(tokenizer, "tokenizer", {role: text_config(hf_config(loaded.model)).vocab_size})
    loaded.tokenizer = tokenizer


def config_tokenizer(name: str | None, specs: Mapping[str, str | ModelSpec] | None) -> PreTrainedTokenizerBase | None:
    """A config's ``tokenizer:`` (None without one), checked against the vocabulary of every
    model in ``specs`` from their configs alone (derived ``lowrank(...)``/``peft(...)`` roles
    share their bases' vocabulary)."""
    if name is None:
        return None

    tokenizer = load_tokenizer(name)
    parsed = {role: parse_spec(spec) for role, spec in (specs or {}).items()}
    sizes = {role: spec.footprint().vocab for role, spec in parsed.items() if not spec.derived}
    check_tokenizer_fits(tokenizer, name, sizes)
    return tokenizer
