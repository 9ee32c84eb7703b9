"""What an architecture adapter declares: for one HF ``model_type``, which module (and which
output columns) each logical component of a decoder layer is, and where the layers, the
embedding, the final norm and the unembedding sit.

Components are named canonically (``q, k, v, o, gate, up, down, attn_norm, mlp_norm, ...``); a
component is either a whole module (``"mlp.down_proj"``) or a set of output columns of a fused
projection (``Fused("attn.c_attn", "qkv_blocks", "q")``), so that q, k and v graft separately.
A hybrid family's recurrent token mixer (:class:`Mixer`: a short convolution, Gated DeltaNet)
takes the attention's place in the layers whose block holds it, its components named ``mixer_*``.
gpt-oss's attention sinks (``sinks``) are raw parameters of the attention module (:class:`Tensors`)
that the attention function reads per query row.
A vision-language checkpoint (:class:`Wrapper`) holds a text family's decoder under another
root; its adapter is the text family's, re-rooted (:meth:`Adapter.under`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# A recurrent mixer's components: Gated DeltaNet's q/k/v (before its conv), LFM2's B/C/x gates and
# input (Mamba2's B/C state projections and x input), the output gate z, GDN's write strength beta,
# the step / decay input (dt), the conv kernel, the decay parameters (A_log + dt_bias), Mamba2's skip
# (D), the gated norm and the output projection.
MIXER_COMPONENTS: tuple[str, ...] = (
    "mixer_q", "mixer_k", "mixer_v", "mixer_b", "mixer_c", "mixer_x", "mixer_z", "mixer_beta", "mixer_dt",
    "mixer_conv", "mixer_decay", "mixer_skip", "mixer_norm", "mixer_out",
)
# The attention components a mixer layer has none of.
# Multi-head latent attention's (DeepSeek-V3 / V2): the query's low-rank projection, its norm and
# up-projection, the key/value latent's projection (with the shared rotary key), its norm and up-projection.
LATENT_COMPONENTS: tuple[str, ...] = ("q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "kv_b")
ATTENTION_COMPONENTS: tuple[str, ...] = ("q", "k", "v", "q_norm", "k_norm", "attn_gate", "sinks", *LATENT_COMPONENTS, "o")

# The canonical order of per-layer components; ``slots()`` lists them in this order.
LAYER_COMPONENTS: tuple[str, ...] = (
    "attn_norm",
    "q",
    "k",
    "v",
    "q_norm",
    "k_norm",
    "attn_gate",  # Qwen3.5's per-head output gate, interleaved with q in q_proj
    "sinks",  # gpt-oss's attention sinks: a learned logit per head in each query row's softmax
    # multi-head latent attention (DeepSeek): q_a -> q_a_norm -> q_b is the query (where it is
    # low-rank; else ``q``); kv_a -> kv_a_norm -> kv_b the keys and values, at the key's position
    *LATENT_COMPONENTS,
    # a recurrent token mixer (the attention's place in a hybrid's mixer layers): its input
    # projections, convolution kernel, decay parameters, gated norm and output projection
    *MIXER_COMPONENTS,
    "o",
    "post_attn_norm",
    "mlp_norm",
    # a mixture-of-experts layer: the router (its weights and buffers, e.g. a routing-score
    # correction bias), the bank of routed experts, the shared experts' gate and projections
    "router",
    "experts",
    "shared_expert_gate",
    "shared_gate",
    "shared_up",
    "shared_down",
    "gate",
    "up",
    "act",  # an activation with learned parameters (Apertus' xIELU alpha_p / alpha_n)
    "down",
    "post_mlp_norm",
    # Gemma 4's per-layer inputs (PLE): after the MLP, a gate from the residual stream times the
    # layer's slice of the per-layer token embedding, projected back and normed
    "ple_gate",
    "ple_proj",
    "ple_norm",
    "layer_scalar",  # Gemma 4: a learned scale of the block's whole output, applied last
)
GLOBAL_SLOTS: tuple[str, ...] = ("embed", "pos_embed", "final_norm", "unembed")

Layout = Literal["qkv_blocks", "qkv_per_head", "halves", "thirds", "linear_qkv_blocks", "q_gate_per_head",
                 "mamba2_blocks", "falcon_mamba2_blocks", "qkvz_per_key_head", "ba_per_key_head"]
# Which batched forward computes a mixer (``weightgraft.engine.mixers``): LFM2's short
# convolution, Qwen3.5's Gated DeltaNet (OLMo Hybrid's: q, k, v projected apart, beta doubled),
# Mamba2's state space scan (Nemotron-H; Falcon-H1's, with muP multipliers and an optional norm).
MixerKind = Literal["short_conv", "gated_delta_net", "olmo_gated_delta_net", "next_gated_delta_net", "mamba2",
                    "falcon_mamba2"]

# The module a text family's decoder (layers, embedding, final norm) sits in: every wrappable
# family keeps it at ``model`` and the unembedding at ``lm_head``.
TEXT_ROOT = "model"


@dataclass(frozen=True)
class Fused:
    """A component that is a subset of the output columns of a fused projection.

    ``qkv_blocks``: [q | k | v] contiguous (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``);
    ``qkv_per_head``: per head [q_h | k_h | v_h] (GPT-NeoX ``query_key_value``);
    ``halves``: [first | second] (Phi-3 ``gate_up_proj``);
    ``thirds``: [first | second | third] (LFM2's mixer ``in_proj``: [B | C | x]);
    ``linear_qkv_blocks``: [q | k | v] sized by the config's ``linear_*`` heads (Gated DeltaNet's
    ``in_proj_qkv``);
    ``q_gate_per_head``: per head [q_h | gate_h] (Qwen3.5 attention's ``q_proj``);
    ``mamba2_blocks``: [z | x | B | C | dt] sized by the config's Mamba2 heads, groups and state
    (Nemotron-H's mixer ``in_proj``; parts "z", "x", "b", "c", "dt");
    ``falcon_mamba2_blocks``: the same blocks sized by Falcon-H1's config (``mamba_d_ssm``, ``mamba_n_groups``, ...);
    ``qkvz_per_key_head``: per linear-attention key head [q_h | k_h | v_h | z_h], its value heads' v and z
    (Qwen3-Next's ``in_proj_qkvz``; parts "q", "k", "v", "z"); ``ba_per_key_head``: per key head [b_h | a_h]
    (``in_proj_ba``; parts "b", "a").
    """

    module: str
    layout: Layout
    part: str  # "q" | "k" | "v" for qkv layouts, "first" | "second" | "third", "q" | "gate"


@dataclass(frozen=True)
class Tensors:
    """A component that is some tensors of a module, not the module (a mixer's ``A_log`` and
    ``dt_bias``, gpt-oss attention's ``sinks``: raw parameters no module call applies)."""

    module: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Mixer:
    """Where a hybrid's recurrent token mixer sits in a block, and its components (paths relative
    to the block). A layer is a mixer layer where its block holds ``module``; it has none of
    ``ATTENTION_COMPONENTS`` (its other components are the adapter's). The conv kernel is applied
    to earlier positions' values and the decay parameters are read raw, so the mixer has a batched
    forward of its own (``kind``)."""

    module: str
    kind: MixerKind
    components: dict[str, str | Fused | Tensors]
    # the mixer runs beside attention in every layer (Falcon-H1: both read the layer's one input and
    # their outputs add): a mixer layer keeps its attention components
    beside_attention: bool = False


@dataclass(frozen=True)
class BlockKinds:
    """A family whose blocks are of the kinds the config's ``attribute`` lists per layer, each kind
    with components of its own (Nemotron-H: one sublayer under one norm, a Mamba2 mixer, attention
    or an MLP, all at ``mixer``; OLMo Hybrid: pre-norm mixer layers, post-norm attention layers):
    whether a block is a mixer layer, and its components, follow that kind, not what it holds. A
    kind in ``refused`` (or not in ``kinds``) is refused before loading, with its reason."""

    attribute: str  # the config's per-layer list of kinds ("layers_block_type")
    kinds: dict[str, dict[str, str | Fused | Tensors]]  # kind -> its components (a mixer kind: besides the Mixer's)
    mixer: str | None = None  # the kind whose blocks hold the adapter's Mixer (None: no mixer)
    refused: dict[str, str] = field(default_factory=dict)  # kind -> why it is not grafted


@dataclass(frozen=True)
class Experts:
    """Where a mixture-of-experts layer keeps its parts, relative to the decoder block. A layer is
    of this kind where its block holds ``experts`` (DeepSeek's first layers and Llama 4's
    interleaved ones are dense: they graft as the adapter's ``components`` say)."""

    router: str  # returns (logits, top-k weights, top-k indices) over [batch * seq] rows
    experts: str  # the expert bank: fused 3D tensors, expert e at index e
    # shared_gate / shared_up / shared_down / shared_expert_gate (Granite's shared MLP: gate and up fused)
    shared: dict[str, str | Fused] = field(default_factory=dict)
    router_flat: bool = True  # the router sees [batch * seq, hidden] rows (else [batch, seq, hidden])
    # tensors of the block that the block passes to its router after the states (LFM2-MoE's
    # ``expert_bias``, a buffer that shifts which experts are picked): part of the router slot
    router_args: Tensors | None = None
    shared_flat: bool = False  # the shared experts see [batch * seq, hidden] rows (Qwen2-MoE)


@dataclass(frozen=True)
class Adapter:
    """Declarative description of one HF architecture."""

    layers: str  # path of the ModuleList of decoder blocks
    embed: tuple[str, ...]  # modules whose outputs together form the token embedding
    final_norm: str | None
    unembed: str
    components: Mapping[str, str | Fused | Tensors]  # canonical name -> module path inside a block (``sinks``: tensors)
    # The position axis of modules whose input is not [batch, seq, ...] (Gemma 3 q/k norms).
    pos_axis: dict[str, int] = field(default_factory=dict)
    # Config attributes that change the computation in ways this adapter does not model:
    # attribute -> the only value supported (a frozenset: the values supported).
    requires: dict[str, Any] = field(default_factory=dict)
    # Learned position embeddings (GPT-2's wpe): a slot of their own, ``pos_embed``.
    pos_embed: str | None = None
    # A mixture-of-experts layer's parts, in the layers whose block holds an expert bank.
    experts: Experts | None = None
    # A recurrent token mixer, in the layers whose block holds it (the others are attention layers).
    mixer: Mixer | None = None
    # Blocks of several kinds under one norm (Nemotron-H): each kind's components (``components`` unused).
    blocks: BlockKinds | None = None
    # Components (and embedding modules) some configs of the family leave out (Gemma 4's per-layer
    # inputs where ``hidden_size_per_layer_input`` is 0): skipped where absent; the coverage check
    # still refuses any parameter no slot holds.
    optional: frozenset[str] = frozenset()
    # Modules no text prompt reaches (a vision-language checkpoint's vision tower and projector):
    # their parameters belong to no slot, and a donor that differs there is reported, not grafted.
    outside: tuple[str, ...] = ()

    def under(self, root: str, outside: tuple[str, ...]) -> Adapter:
        """This text family's adapter with its decoder at ``root`` instead of ``model`` (a
        vision-language checkpoint's ``model.language_model``), the unembedding where it was."""
        if not self.layers.startswith(f"{TEXT_ROOT}."):
            raise ValueError(f"a family whose decoder is not at {TEXT_ROOT!r} cannot be re-rooted")

        def moved(path: str) -> str:
            return root + path[len(TEXT_ROOT):] if path.startswith(f"{TEXT_ROOT}.") else path

        return dataclasses.replace(
            self, layers=moved(self.layers), embed=tuple(moved(p) for p in self.embed),
            final_norm=None if self.final_norm is None else moved(self.final_norm),
            unembed=moved(self.unembed), outside=outside,
        )


@dataclass(frozen=True)
class Wrapper:
    """A vision-language checkpoint (``...ForConditionalGeneration``) whose language model is a
    text family's decoder: its slots are the text family's, named alike, and only text prompts
    are grafted (an image never reaches the language model through weightgraft)."""

    language_model: str = "model.language_model"  # where the text family's ``model`` sits
    outside: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    # Whether transformers builds the text family's causal LM from the checkpoint's language-model
    # tensors alone (loading then skips the vision tower): False where the text family has no
    # causal-LM class of its own (Qwen3-VL's ``qwen3_vl_text``).
    text_only: bool = True
    # Config attributes naming the placeholder tokens where images (or videos) enter the prompt.
    media_tokens: tuple[str, ...] = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")
