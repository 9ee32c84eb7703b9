"""Names a package exports, imported on first use, so that light commands (``weightgraft
--help``, ``weightgraft data``) do not pay for importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, str | None]], own: Callable[[], dict[str, Any]],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps a public name to
    ``(module, attribute)`` (attribute None: the module itself); ``own`` gives the package's
    globals."""

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = exports[name]
        value = importlib.import_module(module)
        return value if attr is None else getattr(value, attr)

    def dir_() -> list[str]:
        return sorted([*own(), *exports])

    return getattr_, dir_
