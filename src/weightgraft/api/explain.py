"""What to read before a graft runs: which slots each rule grafts on a model
(``weightgraft.explain``), a prompt's tokens with the labels positions go by, so that a selector
such as ``first_entity_last-2`` or ``relation_last+1`` can be read off (``weightgraft.tokens``),
and the test prompts of the facts a finetuned model was trained on, read through its training
manifest, so examples and notebooks probe facts it knows (``weightgraft.trained_facts``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from weightgraft.data.prompts import DatasetError, TestPrompt, load_test_prompts
from weightgraft.data.spans import SpanError, SpanSpec, resolve_spans
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.architectures.adapter import ATTENTION_COMPONENTS
from weightgraft.engine.source_map import SlotName
from weightgraft.schemes.binding import GraftInputError, Rules, as_scheme, check_tokenizer, compile_for, input_errors
from weightgraft.schemes.labels import FIRST_ENTITY, first_entity, position_labels, token_span
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, get_protocol
from weightgraft.training.outputs import MANIFEST_NAME

if TYPE_CHECKING:  # annotations only: importing weightgraft does not import transformers
    from torch import nn
    from transformers import PreTrainedTokenizerBase


def explain(rules: Rules, model: nn.Module, *, protocol: str = DEFAULT_PROTOCOL, base: str = "pre") -> pd.DataFrame:
    """One row per rule: the role it takes weights from, its position selector, and the layers,
    per-layer components and global slots (embed, final_norm, unembed) it selects on ``model``
    (later rules win where they overlap). Nothing runs: this is the rule as compiled.

    A layer selector other than ``all`` keeps only the global slots a rule's components name
    one by one, so ``Rule(layers="29", components="body")`` grafts layer 29 alone.
    ``layer_kinds`` says, of each layer the rule's layer selector names, whether it is an
    attention layer or a hybrid's recurrent mixer (:func:`layer_kinds`): ``o`` or ``attn``
    selects nothing in a mixer layer, so a rule may list a layer where it grafts nothing."""
    scheme = as_scheme(rules, base, None)
    roles = [scheme.base, *sorted(scheme.named_roles() - {scheme.base}), *scheme.scaled_roles()]
    with input_errors():
        (compiled,) = compile_for([scheme], model, roles, protocol)
    kinds = layer_kinds(model)
    floor = get_protocol(protocol).floor_quarters
    rows = []
    for k, (rule, done) in enumerate(zip(scheme.rules, compiled.rules, strict=True)):
        names = [compiled.slot_names[i] for i in done.slots.tolist()]
        in_layers = [(slot.layer, slot.component) for slot in map(SlotName.parse, names) if slot.layer is not None]
        heads = {compiled.slot_names[s]: h.tolist() for s, h in (done.heads or {}).items()}
        rows.append({
            "rule": k, "model": rule.model, "scale": rule.scale, "positions": rule.positions,
            "layers": sorted({layer for layer, _ in in_layers}),
            "components": sorted({component for _, component in in_layers}),
            "global_slots": [n for n in names if SlotName.parse(n).layer is None],
            "n_slots": len(names), "heads": heads or None, "slots": names,
            "layer_kinds": {i: kinds[i] for i in rule.layer_selection.resolve(len(kinds), floor_quarters=floor)},
        })
    return pd.DataFrame(rows)


def layer_kinds(model: nn.Module) -> dict[int, str]:
    """Each layer's kind, read from its slots: ``attention``, ``mixer (KIND)`` (a hybrid's
    recurrent token mixer: ``short_conv``, ``gated_delta_net``, ``olmo_gated_delta_net``, ``mamba2``,
    ``falcon_mamba2``), ``attention + mixer (KIND)`` (Falcon-H1: both side by side) or ``mlp`` (a
    Nemotron-H block holding neither). A hybrid's presets graft attention's ``q``/``k``/``v``/``o``
    in its attention layers only; this says which those are."""
    comps: dict[int, set[str]] = {}
    mixers: dict[int, str] = {}
    for slot in model_slots(model):
        name = SlotName.parse(slot.name)
        if name.layer is not None:
            comps.setdefault(name.layer, set()).add(name.component)
            if slot.mixer is not None:
                mixers[name.layer] = f"mixer ({slot.mixer.kind})"
    attention = {i for i, here in comps.items() if here & set(ATTENTION_COMPONENTS)}
    return {i: (f"attention + {mixers[i]}" if i in attention else mixers[i]) if i in mixers  # Falcon-H1: side by side
            else "attention" if i in attention else "mlp" for i in sorted(comps)}


def tokens(tokenizer: PreTrainedTokenizerBase, prompt: str, spans: Mapping[str, SpanSpec] | None = None) -> pd.DataFrame:
    """One row per token of ``prompt`` (as ``wg.graft`` tokenizes it): ``position``, ``id``,
    ``token`` (its text), ``start`` / ``end`` (characters), ``label`` and ``spans``. Both are
    position selectors that pick what the row shows, so a rule can be written from this table:
    ``label`` picks this one token (``first_entity_last`` for the first entity's last token,
    ``first_entity_last-k`` inside it, ``relation_last+k`` after a span, ``tok{i}`` before any
    span, ``last``; the names of ``localize``'s cells); each name in ``spans`` (``actor``,
    ``first_entity``) picks every token listed under it."""
    check_tokenizer(tokenizer)
    try:
        char_spans = resolve_spans(prompt, spans)
    except SpanError as exc:
        raise GraftInputError(f"prompt {prompt!r}: {exc}") from exc
    enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    if not ids:
        raise GraftInputError(f"prompt {prompt!r} tokenizes to nothing")
    owners: dict[int, list[str]] = {}
    fe = first_entity(char_spans, None)
    for name, (start, end) in char_spans.items():
        for i in token_span(offsets, start, end):
            owners.setdefault(i, []).extend([name, FIRST_ENTITY] if name == fe else [name])
    labels = position_labels(offsets, char_spans)
    return pd.DataFrame({
        "position": range(len(ids)), "id": ids,
        "token": [tokenizer.decode([i]) for i in ids],
        "start": [s for s, _ in offsets], "end": [e for _, e in offsets],
        "label": labels, "spans": [", ".join(owners.get(i, [])) for i in range(len(ids))],
    })


SPLIT_DIRECTIONS = {"a2b": {"a2b"}, "b2a": {"b2a"}, "both": {"a2b", "b2a"}}


def trained_facts(model_dir: str | os.PathLike[str], template: str = "headline", n: int = 3) -> list[TestPrompt]:
    """Up to ``n`` test prompts (with answers and spans) of template ``template`` for facts
    ``model_dir`` was finetuned on, in the trained direction(s); ``[]`` when the directory
    holds no training manifest (a model not trained by weightgraft) or its dataset is gone."""
    manifest = Path(model_dir) / MANIFEST_NAME
    if not manifest.is_file():
        return []
    data = json.loads(manifest.read_text(encoding="utf-8")).get("data") or {}
    try:
        prompts = load_test_prompts(Path(data.get("dir", "")))
    except DatasetError:
        return []
    directions = SPLIT_DIRECTIONS.get(data.get("split", ""), {"a2b", "b2a"})
    chosen = [p for p in prompts if p.template == template and (p.direction or "a2b") in directions]
    return chosen[:n]
