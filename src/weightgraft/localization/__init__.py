"""Localize a finetuned behaviour cell by cell (``weightgraft localize``): cell maps, claims,
found sets and their controls. ``weightgraft.api.localize.localize`` runs it and draws the
report page (``weightgraft.report.localize``), which builds on this package."""

from weightgraft.localization.config import LocalizeConfig, load_localize_config
from weightgraft.localization.run import LocalizeResult, run_localize

__all__ = ["LocalizeConfig", "LocalizeResult", "load_localize_config", "run_localize"]
