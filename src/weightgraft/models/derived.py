"""Donors derived from a base and a donor: the base plus a rank-k approximation of the
finetuning change (low-rank), or plus the change times a scale (scaled).

Scaled: ``scaled(sft, S)`` is a copy of the base with every parameter at
``W_pre + S * (W_sft - W_pre)``, computed in float64 and rounded once to the model's dtype (scale
1 is the donor's tensor itself, 0 the base's). Every grafted piece is affine in its weights, so
grafting a cell from it is grafting ``f(x; W_pre) + S * (f(x; W_sft) - f(x; W_pre))``. A LoRA donor
enters with its adapters merged (``W + scale * B A``); a quantized model is refused (its packed
weights cannot hold the scaled ones exactly).

Low-rank:

A low-rank donor is a third model whose every weight matrix is ``W_pre + U_k S_k V_k^T``, the
truncated SVD of ``W_sft - W_pre`` (computed in float64, so the same weights give the same
donor). The engine serves it as just another model, so a sweep over k (one model set per k,
or one role per k) tells how low-rank the part of the finetuning change that carries a
behaviour is, cell by cell.

What k means per tensor: for a matrix (projections, fused q/k/v or gate/up matrices taken as
one matrix, embeddings and unembedding) the change keeps its k largest singular directions;
``k >= min(rows, cols)`` takes the donor's matrix as is. Vectors (norm weights, biases) have no
rank: they come whole from the donor (``vectors="donor"``) or stay the base's
(``vectors="pre"``). In a config a role spec ``lowrank(sft, k=8)`` names the donor role
``sft`` and the base role ``pre`` of the same model set (``base=ROLE`` changes it;
``vectors=pre`` too).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from torch import nn

from weightgraft.models.errors import LowRankError, ModelSpecError
from weightgraft.models.hashing import weights_sha256
from weightgraft.models.loaded import LoadedModel
from weightgraft.models.peft_donor import adapter_info, merged_copy

__all__ = ["LowRankDelta", "LowRankError", "Vectors", "build_lowrank", "build_scaled", "lowrank_delta", "lowrank_model",
           "scaled_model"]
Vectors = Literal["donor", "pre"]


class LowRankDelta:
    """The SVD factors of ``sft - pre`` per matrix, computed once and reused for every k."""

    def __init__(self, pre: nn.Module, sft: nn.Module) -> None:
        self.pre, self.sft = pre, sft
        sft_params = dict(sft.named_parameters())
        self.factors: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for name, p in pre.named_parameters():
            if name not in sft_params or sft_params[name].shape != p.shape:
                raise LowRankError(f"parameter {name}: the donor has no tensor of shape {tuple(p.shape)}")
            if p.dim() == 2:
                delta = sft_params[name].detach().double().cpu() - p.detach().double().cpu()
                u, s, vh = torch.linalg.svd(delta, full_matrices=False)
                self.factors[name] = (u, s, vh)

    def model(self, k: int, vectors: Vectors = "donor") -> nn.Module:
        """A copy of the base with every matrix at ``W_pre + rank-k(W_sft - W_pre)``."""
        if k < 1:
            raise LowRankError(f"rank k must be at least 1, got {k}")
        out = copy.deepcopy(self.pre)
        sft_params = dict(self.sft.named_parameters())
        with torch.no_grad():
            for name, p in out.named_parameters():
                donor = sft_params[name]
                if p.dim() != 2:
                    if vectors == "donor":
                        p.copy_(donor)
                    continue
                u, s, vh = self.factors[name]
                if k >= s.numel():
                    p.copy_(donor)  # full rank: the donor's matrix itself, not a rounded sum
                    continue
                low = (u[:, :k] * s[:k]) @ vh[:k]
                p.copy_((p.detach().double().cpu() + low).to(p.dtype))
        return out.eval()


def lowrank_model(pre: nn.Module, sft: nn.Module, k: int, vectors: Vectors = "donor") -> nn.Module:
    """``pre`` with every matrix at ``W_pre + rank-k(W_sft - W_pre)`` (see the module doc)."""
    return LowRankDelta(pre, sft).model(k, vectors)


def lowrank_delta(base: LoadedModel, donor: LoadedModel) -> LowRankDelta:
    """The SVD of ``donor - base``, refused for models spread by a device_map."""
    if getattr(base.model, "hf_device_map", None) or getattr(donor.model, "hf_device_map", None):
        raise LowRankError("low-rank donors are built on one device; drop device_map")
    return LowRankDelta(base.model, donor.model)


def build_lowrank(low: Any, base: LoadedModel, donor: LoadedModel, delta: LowRankDelta | None = None) -> LoadedModel:
    """The low-rank role ``low`` from its loaded base and donor (``delta``: their SVD, when
    already computed for another k; see :func:`weightgraft.models.donors.load_role`)."""
    model = (delta or lowrank_delta(base, donor)).model(low.k, low.vectors)
    return LoadedModel(
        model=model, tokenizer=donor.tokenizer,
        source=f"lowrank(k={low.k}, vectors={low.vectors}) of {donor.source} over {base.source}",
        weights_sha256=weights_sha256(model), spec=low,
    )


def _plain(model: nn.Module, role: str) -> nn.Module:
    """A model whose parameters are the weights it applies: LoRA adapters merged; a quantized
    model refused."""
    if adapter_info(model) is not None:
        model = merged_copy(model)
    packed = next((n for n, p in model.named_parameters() if not p.dtype.is_floating_point), None)
    if packed is not None:
        raise ModelSpecError(f"a scaled graft needs float weights; the {role}'s {packed} is "
                             f"{dict(model.named_parameters())[packed].dtype} (quantized): load it unquantized")
    return model


def scaled_model(base: nn.Module, donor: nn.Module, scale: float) -> nn.Module:
    """A copy of ``base`` with every parameter at ``base + scale * (donor - base)`` (see the module doc)."""
    plain_base, plain_donor = _plain(base, "base"), _plain(donor, "donor")
    out = copy.deepcopy(plain_base)
    donor_params = dict(plain_donor.named_parameters())
    with torch.no_grad():
        for name, p in out.named_parameters():
            d = donor_params.get(name)
            if d is None or d.shape != p.shape:
                raise ModelSpecError(f"scaled graft: the donor has no parameter {name} of shape {tuple(p.shape)}")
            if scale == 1:
                p.copy_(d)
            elif scale != 0:
                b64 = p.detach().double()
                p.copy_((b64 + scale * (d.detach().to(b64) - b64)).to(p.dtype))
    return out.eval()


def build_scaled(spec: Any, base: LoadedModel, donor: LoadedModel) -> LoadedModel:
    """The scaled role ``spec`` from its loaded base and donor."""
    if getattr(base.model, "hf_device_map", None) or getattr(donor.model, "hf_device_map", None):
        raise ModelSpecError("scaled donors are built on one device; drop device_map")
    model = scaled_model(base.model, donor.model, spec.scale)
    return LoadedModel(model=model, tokenizer=donor.tokenizer or base.tokenizer,
                       source=f"{spec.text}: {base.source} + {spec.scale:g} x ({donor.source} - {base.source})",
                       weights_sha256=weights_sha256(model), spec=spec)
