"""weightgraft: exact, fast dynamic weight grafting for HF decoder language models.

``slots`` and ``graft_forward`` are imported on first use, so that light commands (``weightgraft
data``) do not pay for importing torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["graft_forward", "slots"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in __all__:
        from weightgraft.graft import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'weightgraft' has no attribute {name!r}")
