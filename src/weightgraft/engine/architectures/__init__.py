"""Architecture adapters: for each HF ``model_type``, which module (and which output columns)
each logical component of a decoder is, and the concrete slots of a model built from them.

``adapter.py`` says what an entry declares, ``table.py`` holds the entries (text families and
the vision-language checkpoints over them), ``units.py`` the slot and its heads / neurons, and
``slots.py`` binds an adapter to a model. A new architecture is one entry in ``table.py``.
"""

from weightgraft.engine.architectures.adapter import (
    GLOBAL_SLOTS,
    LAYER_COMPONENTS,
    MIXER_COMPONENTS,
    Adapter,
    Fused,
    Mixer,
    Tensors,
    Wrapper,
)
from weightgraft.engine.architectures.slots import fused_columns, model_slots, part_state
from weightgraft.engine.architectures.table import (
    ADAPTERS,
    WRAPPERS,
    adapter_for,
    supported_model_types,
    text_config,
    wrapper_of,
)
from weightgraft.engine.architectures.units import (
    HEAD_COMPONENTS,
    NEURON_COMPONENTS,
    MixerSite,
    Part,
    Slot,
    UnitKind,
    Units,
)
from weightgraft.errors import UnsupportedArchitectureError

__all__ = [
    "ADAPTERS", "WRAPPERS", "GLOBAL_SLOTS", "LAYER_COMPONENTS", "MIXER_COMPONENTS", "HEAD_COMPONENTS",
    "NEURON_COMPONENTS", "Adapter", "Fused", "Mixer", "MixerSite", "Tensors", "Wrapper", "Part", "Slot", "UnitKind",
    "Units", "UnsupportedArchitectureError",
    "adapter_for", "fused_columns", "model_slots", "part_state", "supported_model_types", "text_config", "wrapper_of",
]
