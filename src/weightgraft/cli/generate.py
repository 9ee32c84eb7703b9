"""``weightgraft generate``: what a grafted model says after a prompt."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from rich.console import Console

console = Console(soft_wrap=True)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value:
            raise typer.BadParameter(f"{what} {item!r} must look like NAME=VALUE")
        out[key.strip()] = value
    return out


_OFFSETS = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)")


def _spans(values: list[str]) -> dict[str, str | tuple[int, int]]:
    """``NAME=TEXT`` (a text that occurs once in the prompt) or ``NAME=(START,END)`` characters."""
    out: dict[str, str | tuple[int, int]] = {}
    for key, value in _pairs(values, "span").items():
        m = _OFFSETS.fullmatch(value.strip())
        out[key] = (int(m[1]), int(m[2])) if m else value
    return out


def _rule(text: str):
    """``model=sft,positions=last,layers=-8..-1,components=o+ffn`` as a Rule."""
    from weightgraft.schemes.scheme import Rule

    fields = _pairs([p for p in text.split(",") if p.strip()], "rule field")
    try:
        return Rule(**fields)  # a bad field: SchemeInputError in one line (model_validate gave pydantic's text)
    except ValueError as exc:
        raise typer.BadParameter(f"rule {text!r}: {exc}") from None


def generate(
    prompts: list[str] = typer.Argument(..., help="Prompt text(s)."),
    model: list[str] = typer.Option([], "--model", "-m", help="ROLE=SPEC, e.g. pre=smollm2-135m sft=DIR (first is the base)."),
    rule: list[str] = typer.Option([], "--rule", "-r", help="A graft rule: model=sft,positions=first_entity,layers=all,components=body (repeatable; later wins)."),
    span: list[str] = typer.Option([], "--span", "-s", help="NAME=TEXT of the prompt (e.g. subject='Eiffel Tower'; a text that occurs more than once is refused) or NAME='(START,END)' characters."),
    config: Path | None = typer.Option(None, "--config", help="Take models and schemes from an experiment YAML."),
    scheme: list[str] = typer.Option([], "--scheme", help="With --config: the scheme(s) to generate with (default: every scheme)."),
    base: str = typer.Option("pre", "--base", help="Role whose weights fill the slots no rule claims."),
    max_new_tokens: int = typer.Option(20, "--max-new-tokens", "-n", min=1),
    sample: bool = typer.Option(False, "--sample", help="Sample instead of greedy decoding."),
    temperature: float = typer.Option(1.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Continue prompts with a grafted model (rules apply to each new token as the last token)."""
    from weightgraft.schemes.protocol import DEFAULT_PROTOCOL
    from weightgraft.schemes.scheme import Scheme, with_scaled_roles

    if sample and temperature <= 0:
        raise typer.BadParameter(f"--temperature must be positive when sampling, got {temperature}")
    spans = _spans(span)
    protocol = DEFAULT_PROTOCOL
    roles = _pairs(model, "model")
    if config is not None:
        from weightgraft.experiments.config import load_config

        cfg = load_config(config)
        schemes = [s for s in cfg.resolved_schemes() if not scheme or s.name in scheme]
        missing = sorted(set(scheme) - {s.name for s in schemes})
        if missing:
            raise typer.BadParameter(f"schemes {missing} are not in {config}")
        roles = roles or next(iter(cfg.sets().values()))
        protocol = cfg.protocol
    else:
        schemes = [Scheme(name="graft" if rule else base, base=base, rules=[_rule(r) for r in rule])]
    if not roles:
        raise typer.BadParameter("give the models with --model ROLE=SPEC (or --config)")
    need = sorted(set().union(*(s.named_roles() for s in schemes)) - set(roles))
    if need:
        raise typer.BadParameter(f"the schemes use model role(s) {need} that --model does not give")
    roles = with_scaled_roles(roles, schemes)
    used = sorted(set().union(*(s.roles() for s in schemes)), key=list(roles).index)
    from weightgraft.data.spans import SpanError, resolve_spans
    from weightgraft.schemes.selectors import unmarked_spans

    for prompt in prompts:  # spans are checked before any model loads
        try:
            resolve_spans(prompt, spans)
        except SpanError as exc:
            raise typer.BadParameter(str(exc)) from None
    for s in schemes:
        for r in s.rules:
            missing = unmarked_spans(r.positions, set(spans))
            if missing:
                raise typer.BadParameter(
                    f"scheme {s.name!r} grafts at positions {r.positions!r}, which needs span(s) "
                    f"{', '.join(missing)} that the prompt does not mark: pass -s NAME=SUBSTRING "
                    "(e.g. -s first_actor='Keanu Reeves')"
                )

    from weightgraft.api.generate import generate as run_generate
    from weightgraft.models.donors import LoadSettings, load_role
    from weightgraft.models.spec import check_roles, refuse_random

    specs = check_roles(roles, "--model")
    refuse_random(specs, "weightgraft generate")  # no tokenizer: one line, before loading
    settings = LoadSettings(device=device)
    loaded: dict = {}

    def load(role: str) -> None:
        """A role's model; a low-rank or LoRA role after the roles it is built from."""
        if role not in loaded:
            spec = specs[role]
            for ref in spec.refs():
                load(ref)
            loaded[role] = load_role(spec, settings, roles=specs, loaded=loaded)

    for r in used:
        load(r)
    models = {r: loaded[r].model for r in used}
    tok = next(lm.tokenizer for lm in loaded.values() if not lm.spec.derived)
    console.print(f"protocol {protocol}", highlight=False)
    for s in schemes:
        texts = run_generate(models, tok, prompts, s, max_new_tokens=max_new_tokens, do_sample=sample, spans=spans,
                             temperature=temperature, seed=seed, base=s.base, protocol=protocol)
        for prompt, text in zip(prompts, texts):
            console.print(f"[bold]{s.name}[/]: {prompt}[cyan]{text}[/]", highlight=False)
