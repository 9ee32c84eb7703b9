"""``weightgraft.localization``: a localize config run (or resumed) and its report page drawn.

The maps, claims and found sets are ``weightgraft.localization``'s; the page is
``weightgraft.report``'s, which reads them: this call joins the two."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weightgraft.configfile import apply_overrides
from weightgraft.localization.config import LocalizeConfig, load_localize_config, parse_localize_config
from weightgraft.localization.run import LocalizeResult, run_localize


def localize(config: LocalizeConfig | Mapping[str, Any] | str | Path, overrides: list[str] | None = None,
             progress: bool = True, load: Any = None) -> LocalizeResult:
    """Run (or resume) a localize config (a ``LocalizeConfig``, a YAML path or the YAML's content
    as a dict, with ``key=value`` ``overrides``; a dict's relative paths are from the working
    directory) and, unless it says ``report: false``, write ``report/index.html``.

    ``load(spec, dtype)`` returns an object with ``model`` and ``tokenizer`` (default:
    ``weightgraft.models.load_model``)."""
    if isinstance(config, Mapping):  # the YAML's content as a dict: checked as the YAML is
        config = parse_localize_config(apply_overrides(copy.deepcopy(dict(config)), overrides or []))
    elif not isinstance(config, LocalizeConfig):
        config = load_localize_config(Path(config), overrides)
    result = run_localize(config, progress=progress, load=load)
    if not config.report:
        return result
    from weightgraft.report.localize import write_localize_report  # matplotlib: only when drawn

    return dataclasses.replace(result, report=write_localize_report(result.run_dir))
