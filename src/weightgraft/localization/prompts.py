"""Which prompts ``localize`` maps, read from the config's data once (``localize_prompts``): the
config's selection (``RunInputs.select``) in the chosen directions, and the prompts of the
reversal setting (``reversal:``).

Without ``directions`` in the config, the direction the SFT model was trained on is mapped. A
map over untrained (reversed) prompts measures a fact the donor never learned, so mixing them
in silently blurs the map; the prompts of other directions left out are counted in the note.

Read, in order: the SFT model's ``training_manifest.json`` (its ``data.split``; for a LoRA
donor ``peft(pre, DIR)``, the adapter folder's), then the dataset's ``manifest.json`` (the
directions its training lines hold). Neither found (a hub model, a free-form prompt file):
every direction, and the note says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightgraft.configfile import ConfigError
from weightgraft.data.freeform import load_prompts
from weightgraft.data.prompts import DatasetError, TestPrompt
from weightgraft.localization.config import ReversalSetting
from weightgraft.resume.manifests import Json

SPLIT_DIRECTIONS = {"a2b": ["a2b"], "b2a": ["b2a"], "both": ["a2b", "b2a"]}


@dataclass(frozen=True)
class DirectionChoice:
    """The prompt directions kept (``None``: every prompt) and why, in one sentence."""

    directions: list[str] | None
    note: str


def _read_json(path: Path) -> Json | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _sft_folder(spec: str) -> Path | None:
    from weightgraft.models.spec import parse_spec
    from weightgraft.models.spec.named import resolve_demo_spec

    spec = resolve_demo_spec(spec)  # `demo`: the demo's finetune folder, whose manifest names its split
    parsed = parse_spec(spec)
    folder = Path(parsed.adapter[1]) if parsed.adapter is not None else parsed.folder or Path(spec).expanduser()
    return folder if folder.is_dir() else None


def model_directions(spec: str) -> list[str] | None:
    """The directions a finetuned model was trained on, from its training manifest (None where
    it has none: a hub model, a model trained elsewhere)."""
    folder = _sft_folder(spec)
    if folder is None:
        return None
    from weightgraft.training.outputs import MANIFEST_NAME

    split = ((_read_json(folder / MANIFEST_NAME) or {}).get("data") or {}).get("split")
    return SPLIT_DIRECTIONS.get(split) if isinstance(split, str) else None


def trained_directions(data: Path, sft_spec: str) -> DirectionChoice:
    """The trained direction(s) of the pair, from the SFT's training manifest or the data's."""
    folder = _sft_folder(sft_spec)
    if folder is not None:
        from weightgraft.training.outputs import MANIFEST_NAME

        manifest = _read_json(folder / MANIFEST_NAME)
        split = ((manifest or {}).get("data") or {}).get("split")
        if split in SPLIT_DIRECTIONS:
            return DirectionChoice(SPLIT_DIRECTIONS[split],
                                   f"directions: {SPLIT_DIRECTIONS[split]}, the SFT model's training split "
                                   f"({folder / MANIFEST_NAME}); set 'directions' to choose")
    data = Path(data)
    folder = data.parent if data.name == "test_prompts.jsonl" else data
    manifest = _read_json(folder / "manifest.json") if folder.is_dir() else None
    trained = (manifest or {}).get("directions")
    if isinstance(trained, list) and trained and all(d in ("a2b", "b2a") for d in trained):
        return DirectionChoice(sorted(trained), f"directions: {sorted(trained)}, the directions the dataset "
                                                f"trains ({folder / 'manifest.json'}); set 'directions' to choose")
    return DirectionChoice(None, "directions: every prompt (no training or dataset manifest names a trained "
                                 "direction); set 'directions' to choose")


def choose_directions(config: Any) -> DirectionChoice:
    """The config's ``directions`` where set, else the trained direction(s)."""
    if config.directions is not None:
        return DirectionChoice(list(config.directions), f"directions: {list(config.directions)} (config)")
    choices = [(label, trained_directions(config.data, spec)) for label, spec in config.mapped_models()]
    first = choices[0][1]
    for label, choice in choices[1:]:  # seeds of one recipe agree; a mix would blur the comparison
        if choice.directions != first.directions:
            raise ConfigError(f"the mapped models were trained on different directions ({choices[0][0]}: "
                             f"{first.directions}, {label}: {choice.directions}); set 'directions' to choose")
    return first


def left_out(config: Any, choice: DirectionChoice, prompts: Sequence[TestPrompt]) -> int:
    """How many of ``prompts`` (of the chosen templates) the direction filter leaves out
    (counted, never dropped silently)."""
    if choice.directions is None:
        return 0
    return sum(1 for p in prompts
               if (config.templates is None or p.template in config.templates)
               and p.direction not in choice.directions and (config.directions is not None or p.direction is not None))


def roles_checked(setting: ReversalSetting) -> str:
    """The reversal roles' training splits where their training manifests name them: the donor
    must have trained on both directions and the recipient not on the prompts' direction (else
    an error, before any model loads); a sentence saying what was checked."""
    said = []
    both = lambda d: d == ["a2b", "b2a"]  # noqa: E731
    checks = [("donor", setting.donor, both), ("recipient", setting.recipient, lambda d: setting.direction not in d)]
    checks += [(f"control[{i}]", spec, both) for i, spec in enumerate(setting.controls)]
    for role, spec, ok in checks:
        found = model_directions(spec)
        if found is None:
            said.append(f"{role}: no training manifest")
            continue
        if not ok(found):
            raise DatasetError(f"reversal: the {role} {spec} was trained on {found}; the paper's setting "
                               f"needs a donor trained on both directions and a recipient not on {setting.direction}")
        said.append(f"{role}: trained on {found}")
    return "; ".join(said)


def reversal_prompts(config: Any, prompts: Sequence[TestPrompt]) -> list[TestPrompt]:
    """The reversal setting's prompts among ``prompts`` (``claims.prompts`` at most), or a
    one-line error where the data has none; empty without ``reversal:``."""
    setting = config.reversal
    if setting is None:
        return []
    if config.metric == "logit_diff":
        raise DatasetError("reversal: metric 'logit_diff' needs a distractor per prompt; use first_logprob or neg_kl_donor")
    roles_checked(setting)
    chosen = [p for p in prompts if p.template == setting.template and p.direction == setting.direction]
    if not chosen:
        raise DatasetError(f"reversal: the data has no {setting.direction} prompt of template {setting.template!r}")
    return chosen[: config.claims.prompts] if config.claims.prompts else chosen


@dataclass(frozen=True)
class LocalizePrompts:
    """What a localize config maps, read from its data once."""

    mapped: list[TestPrompt]  # the selection in the chosen directions
    reversal: list[TestPrompt]  # the reversal setting's (empty without ``reversal:``)
    choice: DirectionChoice  # its note counts the prompts of other directions left out


def localize_prompts(config: Any) -> LocalizePrompts:
    """The config's prompts, its direction choice and its reversal prompts; a one-line error on
    bad data before any model loads."""
    every = load_prompts(config.data)
    choice = choose_directions(config)
    mapped = config.select(every, choice.directions)
    if other := left_out(config, choice, every):
        choice = DirectionChoice(choice.directions, f"{choice.note} ({other} prompt(s) of other directions left out)")
    return LocalizePrompts(mapped, reversal_prompts(config, every), choice)


def select_prompts(config: Any) -> list[TestPrompt]:
    """The prompts a localize config maps (``localize_prompts(config).mapped``)."""
    return localize_prompts(config).mapped
