"""Can these roles be grafted together? Asked of their configs alone (meta models: module trees
and shapes, no weights), before a plan counts bytes and before a run loads anything, so a pair of
different architectures or sizes is one line naming both models and the first difference, never
a plan that "fits" nor an error after loading."""

from __future__ import annotations

from weightgraft.engine.compat import ModelMismatchError
from weightgraft.models.footprint import ModelFootprint


def check_graftable(base_role: str, base: ModelFootprint, role: str, donor: ModelFootprint) -> None:
    """Raise :class:`ModelMismatchError` (one line) where ``donor`` differs from ``base`` in
    architecture, parameter names or shapes."""
    if donor is base or donor.config is base.config:
        return
    head = f"{role} ({donor.spec}) cannot be grafted into {base_role} ({base.spec}): "
    bt, dt = base.config.model_type, donor.config.model_type
    if bt != dt:
        raise ModelMismatchError(head + f"{role} is a {dt!r} model, {base_role} a {bt!r} model")
    theirs = {n: tuple(p.shape) for n, p in donor.meta.named_parameters(remove_duplicate=False)}
    for name, p in base.meta.named_parameters(remove_duplicate=False):
        shape = theirs.pop(name, None)
        if shape is None:
            raise ModelMismatchError(head + f"{role} has no tensor {name!r}")
        if shape != tuple(p.shape):
            raise ModelMismatchError(head + f"{name!r} is {list(shape)} in {role} but {list(p.shape)} in {base_role}")
    if theirs:
        raise ModelMismatchError(head + f"{role} has a tensor {next(iter(theirs))!r} that {base_role} lacks")
