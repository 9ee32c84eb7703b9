"""What ``weightgraft experts`` does before and around the map: its inputs checked in one line
before any model loads (data, templates, prompts, models' specs), then the models loaded one donor
at a time."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from weightgraft.configfile import ConfigError
from weightgraft.expert_maps.run import ExpertsSettings, run_experts
from weightgraft.resume.manifests import ModelEntry

__all__ = ["ExpertsJob", "prepare"]


@dataclass
class ExpertsJob:
    """Checked inputs of an expert map: its settings and the test prompts it runs on."""

    settings: ExpertsSettings
    prompts: list[Any]
    say: Callable[[str], None]

    def run(self) -> dict[str, pd.DataFrame]:
        """Load PRE, build the examples (each prompt left out is counted and said), map each donor."""
        from weightgraft.engine.metric_table import localize_metric
        from weightgraft.localization.examples import build_examples
        from weightgraft.models import load_model

        pre = load_model(self.settings.pre)
        models = {"pre": _identity(self.settings.pre, pre)}
        examples, excluded = build_examples(self.prompts, pre.tokenizer)
        if excluded:
            self.say(f"{len(excluded)} prompt(s) left out: {excluded[:3]}")
        alone = [e.prompt.id for e in examples if localize_metric(self.settings.metric).needs_answers and not e.scored.other_answers]
        if alone:  # before any donor loads
            raise ConfigError(f"--metric {self.settings.metric}: {len(alone)} of {len(examples)} prompts (e.g. {alone[0]}) "
                              "have no other answer with another first token to contrast; use --metric first_logprob")
        tables: dict[str, list[pd.DataFrame]] = {}
        for label, spec in self.settings.donors.items():  # one donor in memory at a time
            donor = load_model(spec)
            models[label] = _identity(spec, donor)
            got = run_experts(self.settings, examples, pre.model, {label: donor.model}, pad_id=pre.pad_id, say=self.say,
                              write=False)
            for name, frame in got.items():
                tables.setdefault(name, []).append(frame)
            del donor, got
            gc.collect()
        from weightgraft.expert_maps.run import write_tables

        return write_tables(self.settings, examples, {k: pd.concat(v, ignore_index=True) for k, v in tables.items()},
                            excluded=len(excluded), models=models)


def _refuse_dense(pre: str) -> None:
    """One line, from the model's config alone, for a base without an expert bank."""
    from weightgraft.engine.architectures import model_slots
    from weightgraft.models.spec import parse_spec

    try:
        meta = parse_spec(pre).footprint().meta
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - a config the planner cannot read: the loader says what is wrong
        return
    if not any(s.experts for s in model_slots(meta)):
        raise ConfigError(f"--pre {pre}: {type(meta).__name__} has no expert bank; an expert map needs a mixture of "
                          "experts (weightgraft run / localize map a dense model)")


def _identity(spec: str, loaded: Any) -> ModelEntry:
    return ModelEntry(spec=spec, source=loaded.source, weights_sha256=loaded.weights_sha256)


def prepare(*, pre: str, donors: Mapping[str, str], data: Path, out: Path, templates: tuple[str, ...],
            direction: str, prompts: int | None, metric: str, say: Callable[[str], None] = print) -> ExpertsJob:
    """The job, or a one-line ConfigError before any model loads."""
    from weightgraft.data.prompts import load_test_prompts
    from weightgraft.engine.metric_table import localize_metric
    from weightgraft.models.spec import parse_spec

    localize_metric(metric)
    for role, spec in {"pre": pre, **donors}.items():
        parse_spec(spec).check(role)
    _refuse_dense(pre)
    if not (Path(data) / "test.jsonl").is_file() and not Path(data).is_dir():
        raise ConfigError(f"--data {data}: no such data folder")
    found = load_test_prompts(Path(data))
    chosen: list[Any] = []
    for template in templates:
        mine = [p for p in found if p.template == template and str(p.direction) == direction]
        if not mine:
            have = sorted({p.template for p in found})
            raise ConfigError(f"--template {template}: no {direction} test prompts in {data} (it has: {', '.join(have)})")
        chosen += mine[:prompts] if prompts is not None else mine
    settings = ExpertsSettings(pre=pre, donors=dict(donors), data=Path(data), out=Path(out), templates=templates,
                               direction=direction, prompts=prompts, metric=metric)
    return ExpertsJob(settings, chosen, say)
