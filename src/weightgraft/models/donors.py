"""Loading the models of a sweep: the base in full, donors lean (only what they serve)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from weightgraft.models.lean import donor_view, needed_parameters
from weightgraft.models.loading import load_model


def load_donor(load: Callable[[str, Any], Any], spec: str, config: Any,
                base: Any, slots_served: set[str]) -> Any:
    """A donor holding only what it serves (``config.lean_donors``), sharing the rest with
    the base: read lazily from safetensors where the default loader would read a directory,
    else loaded in full and then thinned."""

    from weightgraft.models import load_lean_donor

    if not config.lean_donors or config.device_map is not None:
        return load(spec, config)
    needed = needed_parameters(base.model, slots_served)
    if load is default_loader:
        lean = load_lean_donor(spec, base, needed)
        if lean is not None:
            return lean
    full = load(spec, config)
    params = dict(full.model.named_parameters(remove_duplicate=False))
    missing = sorted(needed - set(params))
    if missing:
        return full  # the engine's compatibility check names the mismatch
    thin = copy.copy(full)
    thin.model = donor_view(base.model, {n: params[n] for n in needed}, full.model.config)
    return thin


def default_loader(spec: str, config: Any) -> Any:
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config.dtype]
    return load_model(spec, device=config.device, dtype=dtype, device_map=config.device_map)
