"""What a notebook call hands in, checked before any model runs: the model set (roles, base),
the rules as one scheme, the prompts and their spans, the grafting protocol. Each problem is
one line that names the bad input."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from weightgraft.data.spans import SpanError, SpanSpec, resolve_spans
from weightgraft.schemes.protocol import PROTOCOLS, embeddings_tied
from weightgraft.schemes.scheme import CompiledScheme, Rule, Scheme, compile_scheme
from weightgraft.engine.activations import activation_names
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.forward import slots
from weightgraft.engine.precision import batch_invariant_attention

Rules = Rule | Sequence[Rule] | Scheme
Spans = Sequence[Mapping[str, SpanSpec] | None] | None


class GraftInputError(ValueError):
    """A notebook call whose inputs cannot be grafted as given (raised before any compute)."""


def check_protocol(protocol: str) -> str:
    """The grafting protocol: ``"paper"`` (embeddings and unembedding are separate slots, so
    grafting ``embed`` never moves ``unembed``) or ``"authors"`` (the authors' code)."""
    if protocol not in PROTOCOLS:
        raise GraftInputError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    return protocol


def ordered_models(models: Mapping[str, Any], base: str | None) -> tuple[list[str], list[Any]]:
    """Roles and models with the base first (the engine runs the base's modules); models in
    half precision are switched to eager attention, so that a prompt's logits do not depend
    on the other prompts of its batch (see ``weightgraft.engine.precision``)."""
    if not isinstance(models, Mapping) or not models:
        raise GraftInputError("models must be a non-empty mapping role -> model, e.g. {'pre': pre, 'sft': sft}")
    roles = list(models)
    for role, model in models.items():
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            hint = " (load it first: model, tok = wg.load(SPEC))" if isinstance(model, (str, os.PathLike)) else ""
            raise GraftInputError(f"model {role!r} is a {type(model).__name__}, not a Hugging Face model{hint}")
    if base is not None and base not in models:
        raise GraftInputError(f"base {base!r} is not one of the models' roles ({', '.join(roles)})")
    first = base if base is not None else roles[0]
    ordered = [first, *(r for r in roles if r != first)]
    batch_invariant_attention(models.values())
    return ordered, [models[r] for r in ordered]


def as_schemes(rules: Rules | Sequence[Scheme], base_role: str, base: str | None) -> list[Scheme]:
    """A list of Schemes as given; anything else :func:`as_scheme` takes, as one Scheme."""
    if isinstance(rules, Sequence) and not isinstance(rules, (str, bytes)) and not rules:
        raise GraftInputError("no schemes given: pass a weightgraft.Scheme, a list of them, or Rules")
    if isinstance(rules, Sequence) and not isinstance(rules, (str, bytes)) and rules \
            and all(isinstance(r, Scheme) for r in rules):
        return list(rules)
    return [as_scheme(rules, base_role, base)]


def as_scheme(rules: Rules, base_role: str, base: str | None) -> Scheme:
    """One Rule, a list of them, or a Scheme, as a Scheme over ``base_role`` (``base`` when
    given): the one conversion every front-door function uses."""
    if isinstance(rules, Scheme):
        if base is not None and base != rules.base:
            raise GraftInputError(f"base={base!r} differs from the scheme's base {rules.base!r}")
        return rules
    if isinstance(rules, Rule):
        rules = [rules]
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence) or not all(isinstance(r, Rule) for r in rules):
        raise GraftInputError("rules must be a weightgraft.Rule, a list of Rules, or a weightgraft.Scheme")
    return Scheme(name="graft", base=base if base is not None else base_role, rules=list(rules))


def check_roles(schemes: Sequence[Scheme], roles: Sequence[str]) -> None:
    """Every role a scheme uses is one of the models' roles."""
    for scheme in schemes:
        missing = sorted(scheme.roles() - set(roles))
        if missing:
            raise GraftInputError(
                f"scheme {scheme.name!r} uses model role {missing[0]!r}; the models are "
                f"{', '.join(roles)}"
            )


def check_prompts(prompts: Sequence[str], spans: Spans) -> list[dict[str, tuple[int, int]]]:
    """The prompts are non-empty strings; each prompt's spans as character offsets."""
    if isinstance(prompts, str):
        raise GraftInputError("prompts must be a list of strings, not one string (wrap it: [prompt])")
    prompts = list(prompts)
    if not prompts:
        raise GraftInputError("prompts is empty: give at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p:
            raise GraftInputError(f"prompt {i} must be a non-empty string, got {p!r}")
    if spans is None:
        return [{} for _ in prompts]
    spans = list(spans)
    if len(spans) != len(prompts):
        raise GraftInputError(f"spans has {len(spans)} entries for {len(prompts)} prompts (one mapping per prompt)")
    out = []
    for i, (p, s) in enumerate(zip(prompts, spans, strict=True)):
        try:
            out.append(resolve_spans(p, s))
        except SpanError as exc:
            raise GraftInputError(f"prompt {i}: {exc}") from exc
    return out


def check_tokenizer(tokenizer: Any) -> None:
    """Positions are located through the offset mapping, which only fast tokenizers give."""
    if not getattr(tokenizer, "is_fast", False):
        raise GraftInputError("weightgraft needs a fast tokenizer (offset mapping); this one is slow")


def compile_for(schemes: Sequence[Scheme], model: Any, roles: Sequence[str], protocol: str) -> list[CompiledScheme]:
    """Schemes bound to the base model's slots and the role order; selector errors (a bad layer
    or component) become one line naming the scheme."""
    check_protocol(protocol)
    names = slots(model)
    slot_heads = {s.name: s.heads for s in model_slots(model) if s.heads}
    index = {r: i for i, r in enumerate(roles)}
    try:
        return [compile_scheme(s, names, index, slot_heads, protocol=protocol,
                               tied_embeddings=embeddings_tied(model)) for s in schemes]
    except ValueError as exc:
        raise GraftInputError(str(exc)) from exc


def check_cache(cache: bool | Sequence[str], model: Any) -> list[str]:
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
            f"{', '.join(known[:3])}, ..., {known[-2]} (weightgraft.engine.activations.activation_names)"
        )
    return list(dict.fromkeys(cache))
