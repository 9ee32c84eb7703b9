"""The pipelines' front door: a ``run`` or ``localize`` config run (or resumed) and its report
page drawn, in the same place for both.

The rows, maps and claims are ``weightgraft.experiments``' and ``weightgraft.localization``'s; the
page is ``weightgraft.report``'s, which reads their folders (a floor above them): this module
joins the two, so the CLI, a notebook and the demo get the same folder and the same page."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weightgraft.configfile import apply_overrides
from weightgraft.experiments.config import ExperimentConfig, load_config
from weightgraft.experiments.runner import RunResult, run_experiment
from weightgraft.localization.config import LocalizeConfig, load_localize_config, parse_localize_config
from weightgraft.localization.run import LocalizeResult, run_localize
from weightgraft.models.loaded import Loader

__all__ = ["localize", "run"]


def run(config: ExperimentConfig | Path | str, overrides: list[str] | None = None, progress: bool = True,
        load: Loader | None = None) -> RunResult:
    """Run (or resume) a sweep (an ``ExperimentConfig`` or a YAML path with ``key=value``
    ``overrides``) and, unless it says ``report: false``, write its report (``report/index.html``
    beside the results; on the main process only)."""
    if not isinstance(config, ExperimentConfig):
        config = load_config(Path(config), overrides)
    result = run_experiment(config, load=load, progress=progress)
    if not (config.report and result.is_main):
        return result
    from weightgraft.report import write_report  # matplotlib: only when drawn

    return dataclasses.replace(result, report=write_report(result.run_dir).html)


def localize(config: LocalizeConfig | Mapping[str, Any] | str | Path, overrides: list[str] | None = None,
             progress: bool = True, load: Loader | None = None) -> LocalizeResult:
    """Run (or resume) a localize config (a ``LocalizeConfig``, a YAML path or the YAML's content
    as a dict, with ``key=value`` ``overrides``; a dict's relative paths are from the working
    directory) and, unless it says ``report: false``, write ``report/index.html``.

    ``load(spec, settings)`` returns an object with ``model`` and ``tokenizer`` (default: each
    spec loads itself)."""
    if isinstance(config, Mapping):  # the YAML's content as a dict: checked as the YAML is
        config = parse_localize_config(apply_overrides(copy.deepcopy(dict(config)), overrides or []))
    elif not isinstance(config, LocalizeConfig):
        config = load_localize_config(Path(config), overrides)
    result = run_localize(config, progress=progress, load=load)
    if not config.report:
        return result
    from weightgraft.report.localize import write_localize_report  # matplotlib: only when drawn

    return dataclasses.replace(result, report=write_localize_report(result.run_dir))

