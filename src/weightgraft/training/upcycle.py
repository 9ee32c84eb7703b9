"""Sparse upcycling: a dense model made a mixture of experts (MoE) whose every expert is a copy of
the dense MLP and whose router is fresh (Komatsuzaki et al., "Sparse Upcycling: Training
Mixture-of-Experts from Dense Checkpoints", ICLR 2023).

Why here: no MoE's weights can be downloaded on a machine without a model hub, and an upcycled
embedded model is an MoE whose finetune trains on a CPU. It is saved as a standard transformers
MoE model type (Llama -> Mixtral: the same attention, norms and rotary), so plain
``AutoModelForCausalLM`` loads it and every pipeline takes the folder like any model.

At initialisation the upcycled model computes the dense model's function: each position's picked
experts are the same MLP and the router's top-k weights are renormalised to sum to 1 (equal to
the dense model within rounding, tested in float64). The router then gets no gradient until the
experts differ; the experts differ from the first step on, because each learns only from the
positions routed to it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from weightgraft.errors import WeightgraftError
from weightgraft.resume.manifests import Json

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["MANIFEST", "Upcycling", "UpcycleError", "check_upcyclable", "upcycle", "upcycle_to_folder"]

MANIFEST = "upcycle.json"
# dense model type -> the MoE model type whose layers are its own plus a router and a bank
_TARGETS = {"llama": "mixtral", "mistral": "mixtral"}


class UpcycleError(WeightgraftError, ValueError):
    """A dense model or a setting the upcycler cannot serve (said in one line, before building)."""


@dataclass(frozen=True)
class Upcycling:
    """How to upcycle: ``experts`` copies of the MLP per layer, ``top_k`` picked per position, the
    router drawn from N(0, ``router_std``^2) (None: the dense config's ``initializer_range``)
    with ``seed``."""

    experts: int = 4
    top_k: int = 2
    seed: int = 0
    router_std: float | None = None

    def __post_init__(self) -> None:
        if self.experts < 2:
            raise UpcycleError(f"experts={self.experts}: an MoE layer needs at least 2 experts")
        if not 2 <= self.top_k <= self.experts:
            # top-1 with renormalised weights gives the router weight 1 at every position: no gradient
            raise UpcycleError(f"top_k={self.top_k}: between 2 and experts={self.experts} (with top-1 the "
                               "renormalised routing weight is always 1 and the router never learns)")
        if self.router_std is not None and not self.router_std > 0:
            raise UpcycleError(f"router_std={self.router_std}: a positive standard deviation")


def check_upcyclable(config: Any) -> str:
    """The MoE model type a dense config upcycles to, or a one-line UpcycleError saying why not."""
    kind = getattr(config, "model_type", None)
    if kind not in _TARGETS:
        raise UpcycleError(f"model type {kind!r} is not upcycled (served: {', '.join(sorted(_TARGETS))}, whose "
                           "attention the MoE type keeps as it is)")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(config, flag, False):
            raise UpcycleError(f"{kind} with {flag}=True: {_TARGETS[kind]} has no such bias, so the copy would "
                               "not be the dense model")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UpcycleError(f"hidden_act={config.hidden_act!r}: {_TARGETS[kind]}'s experts are SwiGLU (silu)")
    return _TARGETS[kind]


def _moe_config(dense: Any, settings: Upcycling) -> Any:
    from transformers import MixtralConfig

    check_upcyclable(dense)
    rope = dict(getattr(dense, "rope_parameters", None) or {"rope_type": "default", "rope_theta": dense.rope_theta})
    return MixtralConfig(
        vocab_size=dense.vocab_size, hidden_size=dense.hidden_size, intermediate_size=dense.intermediate_size,
        num_hidden_layers=dense.num_hidden_layers, num_attention_heads=dense.num_attention_heads,
        num_key_value_heads=dense.num_key_value_heads, head_dim=getattr(dense, "head_dim", None),
        hidden_act=dense.hidden_act, max_position_embeddings=dense.max_position_embeddings,
        initializer_range=dense.initializer_range, rms_norm_eps=dense.rms_norm_eps,
        tie_word_embeddings=bool(getattr(dense, "tie_word_embeddings", False)), rope_parameters=rope,
        sliding_window=None, attention_dropout=0.0, num_local_experts=settings.experts,
        num_experts_per_tok=settings.top_k, router_jitter_noise=0.0, output_router_logits=False,
        pad_token_id=dense.pad_token_id, bos_token_id=dense.bos_token_id, eos_token_id=dense.eos_token_id,
    )


def upcycle(dense: PreTrainedModel, settings: Upcycling = Upcycling()) -> PreTrainedModel:
    """The MoE model ``dense`` upcycles to, in ``dense``'s dtype, in eval mode."""
    from transformers import AutoModelForCausalLM

    config = _moe_config(dense.config, settings)
    source = dense.state_dict()
    dtype = next(dense.parameters()).dtype
    moe = AutoModelForCausalLM.from_config(config, dtype=dtype)  # on the CPU: its rotary buffers are computed
    generator = torch.Generator().manual_seed(settings.seed)
    std = settings.router_std if settings.router_std is not None else float(dense.config.initializer_range)
    state: dict[str, torch.Tensor] = {}
    for name, target in moe.state_dict().items():
        layer = name.split(".mlp.")[0] + ".mlp." if ".mlp." in name else ""
        if name.endswith("mlp.gate.weight"):
            state[name] = (torch.randn(target.shape, generator=generator, dtype=torch.float64) * std).to(dtype)
        elif name.endswith("mlp.experts.gate_up_proj"):
            mlp = torch.cat([source[layer + "gate_proj.weight"], source[layer + "up_proj.weight"]], dim=0)
            state[name] = mlp.unsqueeze(0).repeat(settings.experts, 1, 1)
        elif name.endswith("mlp.experts.down_proj"):
            state[name] = source[layer + "down_proj.weight"].unsqueeze(0).repeat(settings.experts, 1, 1)
        elif name in source:
            state[name] = source[name]
        elif name == "lm_head.weight" and config.tie_word_embeddings:
            state[name] = source["model.embed_tokens.weight"]
        else:
            raise UpcycleError(f"no dense tensor for {name!r}: the upcycler does not know this layout")
    moe.load_state_dict(state)
    if config.tie_word_embeddings:
        moe.tie_weights()
    return moe.eval()


def upcycle_to_folder(model: str, out: Path, settings: Upcycling = Upcycling()) -> Json:
    """Load ``model`` (any model spec), upcycle it and save it with its tokenizer in ``out``; the
    record (``upcycle.json``: the dense model, its weights' hash, the settings) is returned."""
    from importlib.metadata import version

    from weightgraft.models import load_model
    from weightgraft.models.hashing import weights_sha256
    from weightgraft.models.spec import parse_spec

    spec = parse_spec(model)
    spec.check("model")
    check_upcyclable(spec.footprint().meta.config)  # from the config alone, before any weight is read
    if Path(out).exists() and any(Path(out).iterdir()):
        raise UpcycleError(f"{out} exists and is not empty: the upcycled model is written to a new folder")
    loaded = load_model(model)
    moe = upcycle(loaded.model, settings)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    moe.save_pretrained(out)
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(out)
    record = {"format": "weightgraft.upcycle/1", "dense": model, "dense_sha256": weights_sha256(loaded.model),
              "model_type": moe.config.model_type, **asdict(settings), "weightgraft": version("weightgraft"),
              "method": "sparse upcycling: every expert a copy of the dense MLP, a fresh router"}
    (out / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
    return record
