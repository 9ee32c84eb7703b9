"""Low-rank donors: the base plus a rank-k approximation of the finetuning change.

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
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from weightgraft.errors import WeightgraftError
from weightgraft.models.hashing import weights_sha256

Vectors = Literal["donor", "pre"]
_SPEC = re.compile(r"^\s*lowrank\s*\((?P<args>.*)\)\s*$")


class LowRankError(WeightgraftError, ValueError):
    """A low-rank spec or model pair that cannot make a low-rank donor."""


@dataclass(frozen=True)
class LowRankSpec:
    """``lowrank(ROLE, k=K[, base=ROLE][, vectors=donor|pre])`` from a config's model roles."""

    donor: str
    k: int
    base: str = "pre"
    vectors: Vectors = "donor"


def parse_lowrank(spec: str) -> LowRankSpec | None:
    """The low-rank spec, None for an ordinary model spec; a malformed one is an error."""
    m = _SPEC.match(spec)
    if m is None:
        if spec.strip().startswith("lowrank"):
            raise LowRankError(f"model spec {spec!r}: write lowrank(ROLE, k=K), e.g. lowrank(sft, k=8)")
        return None
    parts = [p.strip() for p in m.group("args").split(",") if p.strip()]
    if not parts or "=" in parts[0]:
        raise LowRankError(f"model spec {spec!r}: the first argument is the donor role, e.g. lowrank(sft, k=8)")
    fields: dict[str, Any] = {"donor": parts[0]}
    for part in parts[1:]:
        key, _, value = (x.strip() for x in part.partition("="))
        if key == "k" and value.isdigit() and int(value) >= 1:
            fields["k"] = int(value)
        elif key == "base" and value:
            fields["base"] = value
        elif key == "vectors" and value in ("donor", "pre"):
            fields["vectors"] = value
        else:
            raise LowRankError(f"model spec {spec!r}: cannot read {part!r} (k=N with N >= 1, base=ROLE, vectors=donor|pre)")
    if "k" not in fields:
        raise LowRankError(f"model spec {spec!r}: give the rank, e.g. lowrank({parts[0]}, k=8)")
    return LowRankSpec(**fields)


def check_lowrank_roles(roles_spec: Mapping[str, str], where: str) -> None:
    """Every low-rank role refers to ordinary roles of its model set (before loading)."""
    for role, spec in roles_spec.items():
        low = parse_lowrank(spec)
        if low is None:
            continue
        for ref in (low.donor, low.base):
            if ref not in roles_spec:
                raise LowRankError(f"{where}: role {role!r} = {spec!r} refers to role {ref!r}, which the set does not define")
            if parse_lowrank(roles_spec[ref]) is not None:
                raise LowRankError(f"{where}: role {role!r} refers to {ref!r}, itself a low-rank role")


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


@dataclass
class LowRankLoaded:
    """What the runner holds per role, for a low-rank donor."""

    model: Any
    tokenizer: Any
    source: str
    weights_sha256: str


def load_lowrank_role(
    low: LowRankSpec, roles_spec: Mapping[str, str], load: Callable[[str, Any], Any], config: Any,
    loaded: Mapping[str, Any], cache: dict[tuple[str, str], tuple[LowRankDelta, Any, Any]],
) -> LowRankLoaded:
    """Build a low-rank role of a model set; the SVD of one (base, donor) pair is reused for
    every k and model set of the run (``cache``)."""
    key = (roles_spec[low.base], roles_spec[low.donor])
    if key not in cache:
        base = loaded.get(low.base) or load(roles_spec[low.base], config)
        donor = load(roles_spec[low.donor], config)
        if getattr(base.model, "hf_device_map", None) or getattr(donor.model, "hf_device_map", None):
            raise LowRankError("low-rank donors are built on one device; drop device_map")
        cache[key] = (LowRankDelta(base.model, donor.model), base, donor)
    delta, base, donor = cache[key]
    model = delta.model(low.k, low.vectors)
    return LowRankLoaded(
        model=model, tokenizer=donor.tokenizer,
        source=f"lowrank(k={low.k}, vectors={low.vectors}) of {donor.source} over {base.source}",
        weights_sha256=weights_sha256(model),
    )
