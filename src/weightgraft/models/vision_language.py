"""Loading a vision-language checkpoint (Gemma 3 4B-27B, Mistral Small 3.1, LLaVA, Qwen3-VL) the
way a grafting run needs it: its language model.

Where transformers builds the text family's causal LM from the checkpoint's language-model
tensors alone (``Wrapper.text_only`` in the adapter table), that model is loaded and the vision
tower is never read: Gemma 3 27B's is ~0.4B parameters. The model then carries a
:class:`~weightgraft.engine.architectures.vision_language.Checkpoint` record (the digest of the
tensors left unread, the image placeholder ids), so that a donor whose vision tower differs is
still reported and image placeholders are still refused. Elsewhere (Qwen3-VL) the whole model is
loaded, and the engine grafts its language model.
"""

from __future__ import annotations

import copy
import hashlib
import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch

from weightgraft.engine.architectures import wrapper_of
from weightgraft.engine.architectures.vision_language import CHECKPOINT_ATTR, Checkpoint, media_token_ids

# Checkpoint tensor names -> the text family's: transformers 5 writes the older layout
# (``language_model.model.*``, ``language_model.lm_head.*``); newer files hold ``model.language_model.*``.
LANGUAGE_MODEL_KEYS = {
    r"^language_model\.model\.": "model.",
    r"^language_model\.lm_head\.": "lm_head.",
    r"^model\.language_model\.": "model.",
    r"^model\.text_model\.": "model.",  # Idefics3, SmolVLM
}
_LANGUAGE_MODEL_PREFIXES = ("language_model.", "model.language_model.", "model.text_model.", "lm_head.")


@dataclass(frozen=True)
class LoadForm:
    """What is built from a checkpoint's config: ``config`` (the text config where only the
    language model is loaded), whether that is the language model alone, and a note saying so."""

    config: Any
    language_model_only: bool
    whole_vision_language: bool
    note: str | None
    media_tokens: tuple[int, ...] = ()
    whole_config: Any = None  # the checkpoint's own config, where only its language model is built

    def unloaded_parameters(self) -> int:
        """Parameters of the checkpoint that loading its language model alone leaves unread (the
        vision tower and projector), from the shapes on the meta device."""
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        if not self.language_model_only or self.whole_config is None:
            return 0
        with torch.device("meta"):
            whole = AutoModelForImageTextToText.from_config(self.whole_config)
            text = AutoModelForCausalLM.from_config(self.config)
        return sum(p.numel() for p in whole.parameters()) - sum(p.numel() for p in text.parameters())

    def auto_class(self) -> Any:
        """The transformers auto class that builds ``config``."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        return AutoModelForImageTextToText if self.whole_vision_language else AutoModelForCausalLM


def load_form(config: Any) -> LoadForm:
    """How a checkpoint with ``config`` loads: as it is (text models), its language model alone,
    or whole (a vision-language model whose text family has no causal-LM class of its own)."""
    wrapper = wrapper_of(config)
    if wrapper is None:
        return LoadForm(config, False, False, None)
    media = media_token_ids(config, wrapper.media_tokens)
    if not wrapper.text_only:
        return LoadForm(config, False, True, f"a {config.model_type} vision-language checkpoint, loaded whole; "
                        "its language model is grafted", media)
    text = copy.deepcopy(config.get_text_config(decoder=True))
    # the checkpoint's own tying decides: a text config left at its class default may say otherwise
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", text.tie_word_embeddings))
    return LoadForm(text, True, False, f"the language model of a {config.model_type} vision-language checkpoint "
                    "(its vision tower and projector not loaded)", media, config)


class LoadingInfo(TypedDict, total=False):
    """What transformers' ``from_pretrained(..., output_loading_info=True)`` says it could not
    read as the model has it (the loader refuses a checkpoint with missing or mismatched keys)."""

    missing_keys: list[str]
    unexpected_keys: list[str]
    mismatched_keys: list[tuple[str, Any, Any]]  # (name, shape in the checkpoint, shape in the model)
    error_msgs: list[str]


def from_pretrained(folder: str, config: Any, **kwargs: Any) -> tuple[Any, LoadingInfo]:
    """``(model, loading info)`` of the checkpoint in ``folder`` whose config is ``config``,
    built as :func:`load_form` says; ``kwargs`` as transformers' ``from_pretrained`` takes them."""
    form = load_form(config)
    if not form.language_model_only:
        model, info = form.auto_class().from_pretrained(folder, output_loading_info=True, **kwargs)
        return model, info
    from transformers.utils import logging as hf_logging

    # transformers reports every vision-tower tensor left unread (hundreds of lines on a 27B
    # checkpoint): expected here; a language-model tensor it could not place is a missing key,
    # which the caller refuses
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = form.auto_class().from_pretrained(
            folder, config=form.config, key_mapping=LANGUAGE_MODEL_KEYS, output_loading_info=True, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    # transformers keeps the renaming to undo it on save: a finetune of this model would be written
    # under the checkpoint's names with a text-only config, which nothing loads back. It is a text
    # model now: saved as one.
    model._weight_conversions = None
    record = Checkpoint(str(config.model_type), outside_sha256(Path(folder)), form.media_tokens)
    setattr(model, CHECKPOINT_ATTR, record)
    return model, info


def load_note(model: Any) -> str | None:
    """What a loaded vision-language model is, for the line that says where a model came from."""
    record = getattr(model, CHECKPOINT_ATTR, None)
    if isinstance(record, Checkpoint):
        return f"the language model of a {record.model_type} checkpoint; vision tower not loaded"
    config = getattr(model, "config", None)
    if config is not None and wrapper_of(config) is not None:
        return f"a {config.model_type} checkpoint loaded whole; its language model is grafted"
    return None


def outside_sha256(folder: Path) -> str | None:
    """The sha256 of the checkpoint's tensors outside the language model (names and bytes, in
    name order), read from its safetensors files; None where there are none."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    digest = hashlib.sha256()
    with ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(str(folder / f), framework="pt")) for f in files}
        # by the name without the newer layout's ``model.``, so both layouts of one tensor agree
        names = sorted((n.removeprefix("model."), n, f) for f, fh in handles.items() for n in fh.keys()
                       if not n.startswith(_LANGUAGE_MODEL_PREFIXES))
        for key, name, file in names:
            tensor = handles[file].get_tensor(name)
            digest.update(f"{key}|{tensor.dtype}|{list(tensor.shape)}|".encode())
            digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest() if names else None
