"""Grafting: architecture adapters, the one-pass engine, prefix sharing, the per-token
definition it is held to, and the check that compares them on any models.

The package is callable: ``weightgraft.graft(models, tokenizer, prompts, rules, ...)`` is the
notebook front door :func:`weightgraft.api.graft.graft`. Importing any module under it binds
this package to the name ``weightgraft.graft``, so the package itself carries the call."""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from weightgraft.api.graft import graft

        return graft(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
