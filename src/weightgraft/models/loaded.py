"""What loading a model gives: the model, its tokenizer, where it came from, its hash.

One type for every role a run holds (a model loaded by name, a lean donor, a LoRA donor, a
low-rank donor), so that callers read the same fields whatever the spec was."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase


@dataclass
class LoadedModel:
    """A loaded causal LM.

    Attributes:
        model: the ``transformers`` causal LM, in eval mode, on the requested device/dtype.
        tokenizer: its tokenizer. If it had no pad token, ``pad_token`` is set to the EOS token.
            None for ``random:`` models (weightgraft.models.random_models), which have none.
        source: where it came from, e.g. ``"embedded:smollm2-135m (/home/u/.cache/...)"``,
            ``"dir:/abs/path"``, ``"gguf:/abs/file.gguf"`` or ``"hub-cache:org/name"``.
        weights_sha256: :func:`weights_sha256` of the model as loaded (before moving it to
            ``device``; after the dtype conversion). For a LoRA donor, the sha256 of the base's
            hash and the adapter's.
        spec: the typed spec it was loaded from (:mod:`weightgraft.models.spec`), when known.
        adapter: a LoRA donor's adapter (what manifests record), else None.
        lean: whether the model holds only some tensors, sharing the rest with a base.
    """

    model: nn.Module  # a transformers causal LM, or a donor module wrapping one (LoRA, low-rank)
    tokenizer: PreTrainedTokenizerBase | None
    source: str
    weights_sha256: str
    spec: Any = None  # the weightgraft.models.spec.ModelSpec (not imported: specs load through this)
    adapter: Any = None  # weightgraft.models.peft_donor.AdapterInfo (not imported: peft_donor builds on this)
    lean: bool = False

    @property
    def pad_id(self) -> int:
        """The id padding is written with: the tokenizer's pad token, else 0 (padded positions
        are masked out, so any id serves)."""
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        return int(pad) if isinstance(pad, int) else 0


DeviceMap = str | Mapping[str, int | str | torch.device]  # transformers' device_map: "auto", or module -> device
Loader = Callable[[str, "LoadSettings"], Any]  # a custom loader: (spec's text, the run's settings) -> a loaded model


@dataclass
class LoadSettings:
    """How the roles of a run load: where, in which dtype, and with what loader.

    ``loader`` loads a model by its spec's text (tests and ``run_experiment(load=...)`` give
    their own; None: the spec's own loading with the fields below).
    ``cache`` holds what a run's model sets share: the SVD of a (base, donor) pair for every k,
    the base of a LoRA role that no scheme uses."""

    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32
    device_map: DeviceMap | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False
    lean_donors: bool = False
    loader: Callable[[str], Any] | None = None
    cache: dict[Any, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, config: Any, load: Loader | None = None) -> LoadSettings:
        """The settings of a pipeline's config (``device``, ``dtype``, ``device_map``,
        ``lean_donors``); ``load(text, settings)``: a custom loader, the one signature every
        pipeline takes (None: each spec loads itself)."""
        settings = cls(device=config.device, dtype=getattr(torch, config.dtype), device_map=getattr(config, "device_map", None),
                       lean_donors=bool(getattr(config, "lean_donors", False)))
        if load is not None:
            settings.loader = lambda text: load(text, settings)
        return settings
