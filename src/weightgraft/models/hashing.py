"""Content hashes of weights, independent of how or where they were stored."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch


def weights_sha256(model_or_state_dict: Any) -> str:
    """Content hash of a model's weights, independent of how or where they were stored.

    Covers every entry of ``model.state_dict()`` (parameters and persistent buffers), in
    name-sorted order; for each entry it hashes the name, the dtype, the shape and the raw
    little-endian bytes of the values (moved to CPU, made contiguous). Tied weights appear
    under each of their names. It does not cover the config, the tokenizer or non-persistent
    buffers (e.g. rotary frequency tables). The same weights in another dtype hash differently.
    """
    state = (
        model_or_state_dict
        if isinstance(model_or_state_dict, dict)
        else model_or_state_dict.state_dict()
    )
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name]
        if isinstance(tensor, torch.Tensor):
            hash_tensor(digest, name, tensor)
    return digest.hexdigest()


def hash_tensor(digest: Any, name: str, tensor: torch.Tensor) -> None:
    """One entry of :func:`weights_sha256` (also streamed by lean donors, tensor by tensor)."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        for inner in flatten()[0]:  # a tensor subclass (torchao's quantized weights): its own tensors
            hash_tensor(digest, f"{name}.{inner}", getattr(tensor, inner))
        return
    t = tensor.detach().to("cpu").contiguous()
    header = f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{tuple(t.shape)}\0"
    digest.update(header.encode())
    if t.numel():
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
