"""Preparing a graft: the one place where what a caller hands in (models by role, rules or
schemes, prompts and their spans, a tokenizer, a protocol) is checked and bound to a model,
before anything runs. Every front door (``wg.graft``, ``compare``, ``generate``, ``grafted``,
``explain``), the runner and explore come through here, so a check or an error message is
written once. Each problem is one line that names the bad input (:class:`GraftInputError`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from weightgraft.data.spans import SpanError, SpanSpec, resolve_spans
from weightgraft.engine.architectures import model_slots
from weightgraft.engine.forward import slots
from weightgraft.schemes.errors import GraftInputError as GraftInputError
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, PROTOCOLS, embeddings_tied
from weightgraft.schemes.scheme import CompiledScheme, Rule, Scheme, compile_scheme, with_scaled_roles
from weightgraft.schemes.selectors import SpanNotFound

Rules = Rule | Sequence[Rule] | Scheme
Spans = Sequence[Mapping[str, SpanSpec] | None] | None


def check_protocol(protocol: str) -> str:
    """The grafting protocol: ``"paper"`` (embeddings and unembedding are separate slots, so
    grafting ``embed`` never moves ``unembed``) or ``"authors"`` (the authors' code)."""
    if protocol not in PROTOCOLS:
        raise GraftInputError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    return protocol


def ordered_models(models: Mapping[str, Any], base: str | None) -> tuple[list[str], list[Any]]:
    """Roles and models with the base first (the engine runs the base's modules). The models
    are not changed: the engine runs half-precision models with eager attention for the
    duration of each pass only (``weightgraft.engine.precision.eager_attention``)."""
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
    return ordered, [models[r] for r in ordered]


def as_schemes(rules: Rules | Sequence[Scheme], base_role: str, base: str | None) -> list[Scheme]:
    """A list of Schemes as given; anything else :func:`as_scheme` takes, as one Scheme."""
    if isinstance(rules, Sequence) and not isinstance(rules, (str, bytes)) and not rules:
        raise GraftInputError("no schemes given: pass a weightgraft.Scheme, a list of them, or Rules")
    if isinstance(rules, Sequence) and not isinstance(rules, (str, bytes)) and rules:
        schemes = [r for r in rules if isinstance(r, Scheme)]
        if len(schemes) == len(rules):
            return schemes
    return [as_scheme(rules, base_role, base)]


def as_scheme(rules: Rules | Sequence[Scheme], base_role: str, base: str | None) -> Scheme:
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
    return Scheme(name="graft", base=base if base is not None else base_role,
                  rules=[r for r in rules if isinstance(r, Rule)])  # all of them: checked above


def check_roles(schemes: Sequence[Scheme], roles: Sequence[str]) -> None:
    """Every role a scheme uses is one of the models' roles."""
    for scheme in schemes:
        missing = sorted(scheme.named_roles() - set(roles))
        if missing:
            raise GraftInputError(
                f"scheme {scheme.name!r} uses model role {missing[0]!r}; the models are "
                f"{', '.join(roles)}"
            )


def one_or_many(prompts: str | Sequence[str], spans: Spans | Mapping[str, Any]) -> tuple[Sequence[str], Spans]:
    """One prompt (a string, with one mapping of spans) as a list of one, as every API call takes
    it; a list of prompts as it is."""
    if isinstance(prompts, str):
        return [prompts], None if spans is None else [spans] if isinstance(spans, Mapping) else spans
    # one mapping with a list of prompts is passed on as it was (check_prompts sees its keys)
    return prompts, spans  # type: ignore[return-value]


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
    """Schemes bound to the base model's slots and the role order (a scheme's role ``r`` is
    source value ``roles.index(r)``). A selector that does not fit the model (a bad layer or
    component) is a ``SelectorError`` naming the scheme: a run's config error; the front doors
    see it as a :class:`GraftInputError` (:func:`input_errors`)."""
    check_protocol(protocol)
    names = slots(model)
    slot_heads = {s.name: s.heads or s.experts for s in model_slots(model) if s.heads or s.experts}  # units per slot
    index = {r: i for i, r in enumerate(roles)}
    return [compile_scheme(s, names, index, slot_heads, protocol=protocol,
                           tied_embeddings=embeddings_tied(model)) for s in schemes]


@contextmanager
def input_errors() -> Iterator[None]:
    """A ``ValueError`` raised inside (a selector that does not fit the model) as one
    :class:`GraftInputError` line, the error a notebook call raises for its inputs."""
    try:
        yield
    except GraftInputError:
        raise
    except ValueError as exc:
        raise GraftInputError(str(exc)) from exc


@dataclass(frozen=True)
class Encoded:
    """One prompt's tokens and its compiled source map."""

    input_ids: list[int]
    source: torch.Tensor  # [n_tokens, n_slots]
    heads: dict[str, torch.Tensor]  # slot name -> [n_tokens, heads]


def encode(
    tokenizer: Any, prompts: Sequence[str], spans: Sequence[Mapping[str, tuple[int, int]]],
    compiled: CompiledScheme,
) -> list[Encoded]:
    """Tokens and source map of every prompt; a rule that selects no token of a prompt (or a
    span it lacks) is an error naming that prompt, never a silently ungrafted row."""
    out = []
    for i, (prompt, prompt_spans) in enumerate(zip(prompts, spans, strict=True)):
        enc = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=True)
        if not enc["input_ids"]:
            raise GraftInputError(f"prompt {i} ({prompt!r}) tokenizes to nothing")
        try:
            source, heads = compiled.sources(enc["offset_mapping"], prompt_spans)
        except SpanNotFound as exc:
            hint = (" (wg.tokens(tokenizer, prompt, spans) shows its tokens and their labels)" if prompt_spans
                    else " (pass spans=[{name: substring or (start, end)}, ...])")
            raise GraftInputError(f"prompt {i} ({prompt!r}): {exc}{hint}") from exc
        out.append(Encoded(list(enc["input_ids"]), source, heads))
    return out


@dataclass(frozen=True)
class PreparedGraft:
    """A graft checked and bound to its models, ready for the engine: the roles with the engine's
    base first and their models in that order (a source value ``i`` is ``models[i]``), the
    schemes and each one compiled against ``models[0]``, and, when prompts were given, each
    prompt's named spans as character offsets."""

    roles: list[str]
    models: list[Any]
    schemes: list[Scheme]
    compiled: list[CompiledScheme]
    spans: list[dict[str, tuple[int, int]]]

    def encode(self, tokenizer: Any, prompts: Sequence[str]) -> list[Encoded]:
        """The prompts' tokens and source maps under the one scheme (see :func:`encode`)."""
        (compiled,) = self.compiled
        return encode(tokenizer, list(prompts), self.spans, compiled)


def _with_scaled_models(schemes: Sequence[Scheme], roles: list[str], models: list[Any],
                        build: bool = True) -> tuple[list[str], list[Any]]:
    """The roles and models with the scaled roles the schemes' scaled rules need, built from
    the given models (``base + scale * (donor - base)``); ``build=False``: None in their place."""
    from weightgraft.models.derived import scaled_model

    needed = with_scaled_roles({}, schemes)
    by_role = dict(zip(roles, models, strict=True))
    with input_errors():
        for text, spec in needed.items():
            by_role[text] = scaled_model(by_role[spec.base], by_role[spec.donor], spec.scale) if build else None
    return [*roles, *needed], [by_role[r] for r in [*roles, *needed]]


def prepare_graft(
    models: Mapping[str, Any], rules: Rules | Sequence[Scheme], *, base: str | None = None,
    many: bool = False, prompts: Sequence[str] | None = None, spans: Spans = None,
    tokenizer: Any = None, protocol: str = DEFAULT_PROTOCOL, build_scaled: bool = True,
) -> PreparedGraft:
    """Check and bind a graft, in this order: the models (``base`` first, else the first role);
    the rules as one scheme over the base (``many``: a list of Schemes as given, with distinct
    names, or the rules as one); the roles they use; the prompts and their spans and the
    tokenizer, when given; each scheme compiled against the base model. The scaled roles that
    scaled rules name are built (``build_scaled=False``: named, compiled, left None for a caller
    that keeps its own)."""
    roles, ordered = ordered_models(models, base)
    schemes = as_schemes(rules, roles[0], base) if many else [as_scheme(rules, roles[0], base)]
    names = [s.name for s in schemes]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise GraftInputError(f"two schemes are named {dup!r}; rows are keyed by scheme name")
    check_roles(schemes, roles)
    roles, ordered = _with_scaled_models(schemes, roles, ordered, build_scaled)
    prompt_spans = check_prompts(prompts, spans) if prompts is not None else []
    if tokenizer is not None:
        check_tokenizer(tokenizer)
    with input_errors():
        compiled = compile_for(schemes, ordered[0], roles, protocol)
    return PreparedGraft(roles, ordered, schemes, compiled, prompt_spans)
