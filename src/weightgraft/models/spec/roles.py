"""A model set's specs taken together: parsed with the role named in any error, checked as a set
before any model loads (every built role's roles exist and can build it), and the refusal of
random models where text is tokenized."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weightgraft.models.errors import ModelLoadError, ModelSpecError
from weightgraft.models.spec.base import ModelSpec
from weightgraft.models.spec.parse import parse_spec

CONFIG_COMMANDS = ("weightgraft run", "weightgraft localize")  # their configs may give `tokenizer:`


def parse_roles(roles: Mapping[str, Any], where: str) -> dict[str, ModelSpec]:
    """Every role's spec of a model set, parsed; an error names ``where`` and the role."""
    out: dict[str, ModelSpec] = {}
    for role, text in roles.items():
        try:
            out[role] = parse_spec(text)
        except ModelSpecError as exc:
            raise type(exc)(f"{where}: role {role!r}: {exc}") from None
    return out


def check_roles(roles: Mapping[str, str | ModelSpec], where: str) -> dict[str, ModelSpec]:
    """The set's specs, parsed, each built role checked against the set (its roles exist and can
    build it; a LoRA adapter's directory is usable), before any model loads."""
    specs = parse_roles(roles, where)
    for role, spec in specs.items():
        spec.check_in_set(role, specs, where)
    return specs


def check_models(roles: Mapping[str, str | ModelSpec], where: str) -> None:
    """Every role that names a model by name exists (built roles are checked as a set)."""
    for role, spec in parse_roles(roles, where).items():
        spec.check(f"{where}: model {role!r} =")


def random_roles(specs: Mapping[str, str | ModelSpec]) -> list[str]:
    """The roles whose model has no tokenizer (``random:`` models)."""
    return [role for role, spec in specs.items() if not parse_spec(spec).has_tokenizer]


def refuse_random(specs: Mapping[str, str | ModelSpec], command: str) -> None:
    """One error line, before any model loads, when ``command`` needs a tokenizer and some role
    is a random model (which has none); for a run or localize, what makes it work (a config's
    ``tokenizer:`` key), since there it does."""
    roles = random_roles(specs)
    if roles:
        role = roles[0]
        head = f"model {role!r} is {parse_spec(specs[role]).text!r}, a random model without a tokenizer; `{command}` tokenizes text"
        if command in CONFIG_COMMANDS:
            raise ModelLoadError(
                f"{head}: give the config a `tokenizer:` for it (bytes, an embedded model's name such as "
                "smollm2-135m, or a tokenizer directory) and it runs; `weightgraft plan` sizes it as it is")
        raise ModelLoadError(
            f"{head}, so it needs a real model (a run or localize config can pair random models with a "
            "`tokenizer:`; `weightgraft plan` and `weightgraft check` take them as they are)")
