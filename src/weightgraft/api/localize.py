"""``weightgraft.localization``: a localize config run (or resumed) and its report page drawn.

The maps, claims and found sets are ``weightgraft.localization``'s; the page is
``weightgraft.report``'s, which reads them: this call joins the two."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from weightgraft.localization.config import LocalizeConfig, load_localize_config
from weightgraft.localization.run import LocalizeResult, run_localize


def localize(config: LocalizeConfig | str | Path, overrides: list[str] | None = None,
             progress: bool = True, load: Any = None) -> LocalizeResult:
    """Run (or resume) a localize config (a ``LocalizeConfig`` or a YAML path with ``key=value``
    ``overrides``) and, unless it says ``report: false``, write ``report/index.html``.

    ``load(spec, dtype)`` returns an object with ``model`` and ``tokenizer`` (default:
    ``weightgraft.models.load_model``)."""
    if not isinstance(config, LocalizeConfig):
        config = load_localize_config(Path(config), overrides)
    result = run_localize(config, progress=progress, load=load)
    if not config.report:
        return result
    from weightgraft.report.localize import write_localize_report  # matplotlib: only when drawn

    return dataclasses.replace(result, report=write_localize_report(result.run_dir))
