"""weightgraft: exact, fast dynamic weight grafting for HF decoder language models."""

from weightgraft.engine import graft_forward, slots

__all__ = ["graft_forward", "slots"]
__version__ = "0.1.0"
