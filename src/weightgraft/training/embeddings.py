"""Tied embeddings during finetuning: untie them, or freeze either side."""

from __future__ import annotations

from typing import Any

import torch

from weightgraft.training.errors import TrainingError


def _configs(model: Any) -> list[Any]:
    configs = [model.config]
    text = model.config.get_text_config()
    if text is not model.config:
        configs.append(text)
    return configs


def untie_embeddings(model: Any) -> bool:
    """Give the unembedding its own copy of a tied embedding matrix. Returns whether it was tied.

    Afterwards ``config.tie_word_embeddings`` is False, so the model saves and reloads with
    two separate matrices (equal at first), and freezing or grafting one leaves the other alone.
    """
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if out is None or getattr(out, "weight", None) is None:
        return False
    if out.weight is not inp.weight and out.weight.data_ptr() != inp.weight.data_ptr():
        return False
    out.weight = torch.nn.Parameter(
        inp.weight.detach().clone(), requires_grad=inp.weight.requires_grad
    )
    for cfg in _configs(model):
        cfg.tie_word_embeddings = False
    if hasattr(model, "get_expanded_tied_weights_keys"):  # transformers >= 5
        model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)
    return True


def freeze_embeddings(model: Any, *, embed: bool, unembed: bool) -> bool:
    """Freeze the embedding and/or unembedding matrix (``requires_grad=False``).

    If they are tied and only one is to be frozen, they are untied first
    (:func:`untie_embeddings`). Returns whether the model was untied.
    """
    untied = False
    if embed != unembed:
        untied = untie_embeddings(model)
    if embed:
        model.get_input_embeddings().weight.requires_grad_(False)
    if unembed:
        out = model.get_output_embeddings()
        if out is None:
            raise TrainingError("this model has no output embedding (unembedding) to freeze")
        out.weight.requires_grad_(False)
        if getattr(out, "bias", None) is not None:
            out.bias.requires_grad_(False)
    return untied
