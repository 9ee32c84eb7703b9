"""The one check every pipeline makes before a model loads: the device is here, every role's
spec can be built and names a model that exists, a model without a tokenizer has the config's,
and the plan fits this machine (else one line, saying what would make it fit).

Why one: ``run`` and ``localize`` made these checks in two copies that drifted (one checked the
device with a custom loader, the other did not); a pipeline now gives its model sets and its
plan, and gets the tokenizer and the batch size it runs with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from weightgraft.configfile import ConfigError, RunInputs
from weightgraft.devices import require_device
from weightgraft.models.spec import ModelSpec, check_models, check_roles, refuse_random
from weightgraft.models.tokenization import config_tokenizer
from weightgraft.planning.plan import UNREADABLE_CONFIG, Plan, check_plan

__all__ = ["Preflight", "preflight"]


@dataclass(frozen=True)
class Preflight:
    """What the checks leave a pipeline: the config's tokenizer (None without one) and the batch
    size to run with (the plan's where the config fixes none)."""

    tokenizer: Any
    batch_size: int


def preflight(config: RunInputs, sets: Mapping[str, Mapping[str, ModelSpec]], every_role: Mapping[str, ModelSpec],
              plan: Callable[[], Plan], command: str, *, batch_size: int, custom_loader: bool = False) -> Preflight:
    """Refuse, in one line and before any weight is read, what cannot run: a device not here;
    a role of ``sets`` (by where it is written: ``models``, ``model set 'x'``) that cannot be
    built; a model that does not exist or has no tokenizer (none in the config); a ``plan()``
    that does not fit (``batch_size``: the config's, kept where the plan cannot read the models).
    ``custom_loader``: the caller loads models itself (tests), so nothing is
    read from the specs (their existence, shapes and plan are the loader's)."""
    require_device(config.device, ConfigError, "device=")
    for where, roles in sets.items():
        check_roles(roles, where)
    # a vocabulary too small for the config's tokenizer is refused from the models' configs
    tokenizer = config_tokenizer(config.tokenizer, None if custom_loader else every_role)
    if custom_loader:
        return Preflight(tokenizer, batch_size)
    for where, roles in sets.items():
        check_models(roles, where)
        if config.tokenizer is None:  # the config's tokenizer serves models that have none
            refuse_random(roles, command)
    try:
        planned = plan()
    except UNREADABLE_CONFIG:  # the loader then says what is wrong in its own words
        return Preflight(tokenizer, batch_size)
    check_plan(planned)
    return Preflight(tokenizer, planned.batch_size)
