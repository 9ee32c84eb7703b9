"""What a grafted pass computes at a whole decoder block rather than inside one module: Gemma 4's
learned scale of a block's output (``layer_scalar``), applied per position by the model serving
it (``scalars.py``)."""

from weightgraft.engine.blocks.scalars import swap_scalars

__all__ = ["swap_scalars"]
