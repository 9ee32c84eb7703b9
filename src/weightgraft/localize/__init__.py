"""Localize a finetuned behaviour cell by cell (``weightgraft localize``)."""

from weightgraft.localize.config import LocalizeConfig, load_localize_config
from weightgraft.localize.run import LocalizeResult, localize

__all__ = ["LocalizeConfig", "LocalizeResult", "load_localize_config", "localize"]
