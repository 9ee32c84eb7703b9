"""The adapter table: one entry per HF ``model_type`` weightgraft grafts exactly, and one per
vision-language checkpoint whose language model is such a family (:data:`WRAPPERS`).

A new text family is one entry in :data:`ADAPTERS`; a new vision-language checkpoint is one
entry in :data:`WRAPPERS` (its text family must be in :data:`ADAPTERS`).
"""

from __future__ import annotations

from typing import Any

from weightgraft.engine.architectures.adapter import Adapter, BlockKinds, Experts, Fused, Mixer, Tensors, Wrapper
from weightgraft.errors import UnsupportedArchitectureError


def _llama_like(**extra: str | Fused) -> dict[str, str | Fused]:
    comps: dict[str, str | Fused] = {
        "attn_norm": "input_layernorm",
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.o_proj",
        "mlp_norm": "post_attention_layernorm",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    }
    comps.update(extra)
    return comps


_GEMMA2_NORMS = {
    "post_attn_norm": "post_attention_layernorm",
    "mlp_norm": "pre_feedforward_layernorm",  # NOT post_attention_layernorm in Gemma 2/3
    "post_mlp_norm": "post_feedforward_layernorm",
}
_QK_NORMS: dict[str, str | Fused] = {"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
# Mixtures of experts: router and bank under ``mlp``, the router on [batch * seq] rows.
_MOE = Experts("mlp.gate", "mlp.experts")
# Qwen2-MoE's and Qwen3.5-MoE's: a shared expert beside the bank, gated per token (sigmoid of a 1-wide projection)
_GATED_SHARED_MOE = Experts("mlp.gate", "mlp.experts", shared_flat=True, shared={
    "shared_expert_gate": "mlp.shared_expert_gate", "shared_gate": "mlp.shared_expert.gate_proj",
    "shared_up": "mlp.shared_expert.up_proj", "shared_down": "mlp.shared_expert.down_proj"})
_DEEPSEEK_MOE = Experts("mlp.gate", "mlp.experts", router_flat=False, shared={
    "shared_gate": "mlp.shared_experts.gate_proj", "shared_up": "mlp.shared_experts.up_proj",
    "shared_down": "mlp.shared_experts.down_proj"})
# Post-norm layers (OLMo 2 / 3, EXAONE 4): no norm before attention or the MLP, one after each.
_POST_NORM: dict[str, str | Fused] = {
    **{k: v for k, v in _llama_like().items() if k not in ("attn_norm", "mlp_norm")},
    "post_attn_norm": "post_attention_layernorm",
    "post_mlp_norm": "post_feedforward_layernorm",
}


# Hybrids: a recurrent token mixer in the layers whose block holds it (``config.layer_types``),
# attention in the others. LFM2's short convolution: in_proj = [B | C | x], a depthwise causal conv
# over B * x, out_proj after C * conv; Qwen3.5's Gated DeltaNet: in_proj_qkv = [q | k | v] into a
# causal conv, z (output gate), b (write strength beta), a (decay input) per token, the decay
# parameters A_log / dt_bias, a gated norm and out_proj.
_SHORT_CONV = Mixer("conv", "short_conv", {
    "mixer_b": Fused("conv.in_proj", "thirds", "first"), "mixer_c": Fused("conv.in_proj", "thirds", "second"),
    "mixer_x": Fused("conv.in_proj", "thirds", "third"), "mixer_conv": "conv.conv", "mixer_out": "conv.out_proj"})
_GATED_DELTA = Mixer("linear_attn", "gated_delta_net", {
    **{f"mixer_{p}": Fused("linear_attn.in_proj_qkv", "linear_qkv_blocks", p) for p in "qkv"},
    "mixer_z": "linear_attn.in_proj_z", "mixer_beta": "linear_attn.in_proj_b", "mixer_dt": "linear_attn.in_proj_a",
    "mixer_conv": "linear_attn.conv1d", "mixer_decay": Tensors("linear_attn", ("A_log", "dt_bias")),
    "mixer_norm": "linear_attn.norm", "mixer_out": "linear_attn.out_proj"})
_LFM2: dict[str, str | Fused] = {
    "attn_norm": "operator_norm", "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
    "q_norm": "self_attn.q_layernorm", "k_norm": "self_attn.k_layernorm", "o": "self_attn.out_proj",
    "mlp_norm": "ffn_norm", "gate": "feed_forward.w1", "up": "feed_forward.w3", "down": "feed_forward.w2"}
# Qwen3.5's attention layers: q_proj interleaves [q_h | gate_h] per head (``q`` and ``attn_gate``)
_QWEN3_5 = _llama_like(**_QK_NORMS, q=Fused("self_attn.q_proj", "q_gate_per_head", "q"),
                       attn_gate=Fused("self_attn.q_proj", "q_gate_per_head", "gate"))
# Nemotron-H: every block holds one sublayer at ``mixer`` under one ``norm``, of the kind
# ``layers_block_type`` names: a Mamba2 mixer (in_proj = [z | x | B | C | dt], a causal conv over
# x|B|C with a bias, A_log / dt_bias / D per head, a group-wise gated norm, out_proj), attention
# (no rotary positions) or an MLP (up and down, no gate).
_MAMBA2 = Mixer("mixer", "mamba2", {
    **{f"mixer_{p}": Fused("mixer.in_proj", "mamba2_blocks", p) for p in ("z", "x", "b", "c", "dt")},
    "mixer_conv": "mixer.conv1d", "mixer_decay": Tensors("mixer", ("A_log", "dt_bias")),
    "mixer_skip": Tensors("mixer", ("D",)), "mixer_norm": "mixer.norm", "mixer_out": "mixer.out_proj"})
_NEMOTRON_H_BLOCKS = BlockKinds("layers_block_type", {
    "linear_attention": {"attn_norm": "norm"},
    "full_attention": {"attn_norm": "norm", **{c: f"mixer.{c}_proj" for c in "qkvo"}},
    "mlp": {"mlp_norm": "norm", "up": "mixer.up_proj", "down": "mixer.down_proj"},
}, mixer="linear_attention", refused={
    "moe": "its mixture-of-experts blocks (ungated experts, an optional latent projection) are not modelled"})


# OLMo Hybrid: Gated DeltaNet layers with q, k, v projected apart into the conv, a gate ``g_proj``,
# a gated norm ``o_norm`` (norm before gate) and beta doubled (``allow_neg_eigval``), pre-norm
# (``input_layernorm`` before the mixer, ``post_attention_layernorm`` before the MLP); its attention
# layers are OLMo 3's, post-norm with q/k norms on the whole projection (``layer_types``)
_OLMO_DELTA = Mixer("linear_attn", "olmo_gated_delta_net", {
    **{f"mixer_{p}": f"linear_attn.{p}_proj" for p in "qkv"},
    "mixer_z": "linear_attn.g_proj", "mixer_beta": "linear_attn.b_proj", "mixer_dt": "linear_attn.a_proj",
    "mixer_conv": "linear_attn.conv1d", "mixer_decay": Tensors("linear_attn", ("A_log", "dt_bias")),
    "mixer_norm": "linear_attn.o_norm", "mixer_out": "linear_attn.o_proj"})
_MLP = {"gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
_OLMO_HYBRID_BLOCKS = BlockKinds("layer_types", {
    "linear_attention": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", **_MLP},
    "full_attention": {**_POST_NORM, **_QK_NORMS},
}, mixer="linear_attention")


# Gemma 4: Gemma 3's layer (q/k norms per head, a norm before and after attention and the MLP), a
# value norm without weights, the per-layer inputs (PLE) after the MLP and a learned scale of the
# block's output. Its kinds are its KV sharing modes: the last ``num_kv_shared_layers`` layers
# reuse the keys and values of the last earlier layer of their type, and hold no k / v of their own.
_GEMMA4 = {
    **_llama_like(**_GEMMA2_NORMS, **_QK_NORMS), "ple_gate": "per_layer_input_gate", "ple_proj": "per_layer_projection",
    "ple_norm": "post_per_layer_input_norm", "layer_scalar": Tensors("", ("layer_scalar",))}
_GEMMA4_SHARED = {k: v for k, v in _GEMMA4.items() if k not in ("k", "v", "k_norm")}
_GEMMA4_BLOCKS = BlockKinds("kv_sharing_modes", {"None": _GEMMA4, "store": _GEMMA4, "reuse": _GEMMA4_SHARED})
# the token embedding and, where the config has them, the per-layer inputs' embedding, the projection
# of the token embedding into them and its norm: each a function of the position's own token
_GEMMA4_EMBED = ("model.embed_tokens", "model.embed_tokens_per_layer", "model.per_layer_model_projection",
                 "model.per_layer_projection_norm")


# Falcon-H1: in every layer attention and a Mamba2 mixer read the one normed input side by side (the
# mixer ``beside_attention``) and their outputs add; muP multipliers are the config's, alike in every
# model; the mixer's gated norm only where ``mamba_rms_norm``
_FALCON_MAMBA2 = Mixer("mamba", "falcon_mamba2", {
    **{f"mixer_{p}": Fused("mamba.in_proj", "falcon_mamba2_blocks", p) for p in ("z", "x", "b", "c", "dt")},
    "mixer_conv": "mamba.conv1d", "mixer_decay": Tensors("mamba", ("A_log", "dt_bias")),
    "mixer_skip": Tensors("mamba", ("D",)), "mixer_norm": "mamba.norm", "mixer_out": "mamba.out_proj"},
    beside_attention=True)
_FALCON_H1 = {**_llama_like(), "mlp_norm": "pre_ff_layernorm", "gate": "feed_forward.gate_proj",
              "up": "feed_forward.up_proj", "down": "feed_forward.down_proj"}


# Qwen3-Next: Qwen3.5's layers before it, its Gated DeltaNet projecting q, k, v and z interleaved per
# key head (``in_proj_qkvz``) and b and a likewise (``in_proj_ba``); a gated shared expert beside each bank
_NEXT_DELTA = Mixer("linear_attn", "next_gated_delta_net", {
    **{f"mixer_{p}": Fused("linear_attn.in_proj_qkvz", "qkvz_per_key_head", p) for p in "qkvz"},
    "mixer_beta": Fused("linear_attn.in_proj_ba", "ba_per_key_head", "b"),
    "mixer_dt": Fused("linear_attn.in_proj_ba", "ba_per_key_head", "a"),
    "mixer_conv": "linear_attn.conv1d", "mixer_decay": Tensors("linear_attn", ("A_log", "dt_bias")),
    "mixer_norm": "linear_attn.norm", "mixer_out": "linear_attn.out_proj"})


def _llama_family(components: dict[str, str | Fused], **kw: Any) -> Adapter:
    return Adapter(
        layers="model.layers",
        embed=("model.embed_tokens",),
        final_norm="model.norm",
        unembed="lm_head",
        components=components,
        **kw,
    )


ADAPTERS: dict[str, Adapter] = {
    "gpt2": Adapter(
        layers="transformer.h",
        embed=("transformer.wte",),
        pos_embed="transformer.wpe",
        final_norm="transformer.ln_f",
        unembed="lm_head",
        components={
            "attn_norm": "ln_1",
            "q": Fused("attn.c_attn", "qkv_blocks", "q"),
            "k": Fused("attn.c_attn", "qkv_blocks", "k"),
            "v": Fused("attn.c_attn", "qkv_blocks", "v"),
            "o": "attn.c_proj",
            "mlp_norm": "ln_2",
            "up": "mlp.c_fc",
            "down": "mlp.c_proj",
        },
        requires={"add_cross_attention": False},
    ),
    "gpt_neox": Adapter(
        layers="gpt_neox.layers",
        embed=("gpt_neox.embed_in",),
        final_norm="gpt_neox.final_layer_norm",
        unembed="lm_head",
        components={
            "attn_norm": "input_layernorm",
            "q": Fused("attention.query_key_value", "qkv_per_head", "q"),
            "k": Fused("attention.query_key_value", "qkv_per_head", "k"),
            "v": Fused("attention.query_key_value", "qkv_per_head", "v"),
            "o": "attention.dense",
            "mlp_norm": "post_attention_layernorm",
            "up": "mlp.dense_h_to_4h",
            "down": "mlp.dense_4h_to_h",
        },
    ),
    "llama": _llama_family(_llama_like()),
    "mistral": _llama_family(_llama_like()),
    "qwen2": _llama_family(_llama_like()),
    "granite": _llama_family(_llama_like()),
    "gemma": _llama_family(_llama_like()),
    "gemma2": _llama_family(_llama_like(**_GEMMA2_NORMS)),
    "gemma3_text": _llama_family(
        _llama_like(**_GEMMA2_NORMS, **_QK_NORMS),
        pos_axis={"q_norm": 2, "k_norm": 2},  # they see [batch, heads, seq, head_dim]
    ),
    "qwen3": _llama_family(_llama_like(**_QK_NORMS)),  # q/k norms see [batch, seq, heads, dim]
    # OLMo 1 norms are parameter-free LayerNorms: nothing to graft there.
    "olmo": _llama_family(
        {k: v for k, v in _llama_like().items() if k not in ("attn_norm", "mlp_norm")}
    ),
    # OLMo 2 is post-norm: the norms act on the attention / MLP outputs.
    "olmo2": _llama_family(_POST_NORM | _QK_NORMS),
    "phi3": _llama_family(
        {
            "attn_norm": "input_layernorm",
            "q": Fused("self_attn.qkv_proj", "qkv_blocks", "q"),
            "k": Fused("self_attn.qkv_proj", "qkv_blocks", "k"),
            "v": Fused("self_attn.qkv_proj", "qkv_blocks", "v"),
            "o": "self_attn.o_proj",
            "mlp_norm": "post_attention_layernorm",
            "gate": Fused("mlp.gate_up_proj", "halves", "first"),
            "up": Fused("mlp.gate_up_proj", "halves", "second"),
            "down": "mlp.down_proj",
        }
    ),
    "stablelm": _llama_family(_llama_like(), requires={"qk_layernorm": False}),
    # 2025-26 dense families. SmolLM3 leaves rotary positions out of every fourth layer (NoPE):
    # the same weights.
    "smollm3": _llama_family(_llama_like()),
    "ernie4_5": _llama_family(_llama_like()),
    "seed_oss": _llama_family(_llama_like()),  # q/k/v biases
    # GLM-4: gate and up fused in halves; a norm after attention and after the MLP besides the two before
    "glm4": _llama_family({
        **_llama_like(), "gate": Fused("mlp.gate_up_proj", "halves", "first"),
        "up": Fused("mlp.gate_up_proj", "halves", "second"),
        "post_attn_norm": "post_self_attn_layernorm", "post_mlp_norm": "post_mlp_layernorm",
    }),
    # EXAONE 4 and OLMo 3 are post-norm as OLMo 2 (sliding and full layers alike); EXAONE's q/k
    # norms see [batch, heads, seq, head_dim], OLMo's the whole projection
    "exaone4": _llama_family(_POST_NORM | _QK_NORMS, pos_axis={"q_norm": 2, "k_norm": 2}),
    "olmo3": _llama_family(_POST_NORM | _QK_NORMS),
    # Apertus: no gate; the xIELU activation's alpha_p / alpha_n are weights of their own (``act``)
    "apertus": _llama_family({
        **{k: v for k, v in _llama_like(**_QK_NORMS).items() if k != "gate"},
        "attn_norm": "attention_layernorm", "mlp_norm": "feedforward_layernorm", "act": "mlp.act_fn",
    }, pos_axis={"q_norm": 2, "k_norm": 2}),
    # Mixtures of experts: the adapter's components in dense layers (DeepSeek's first ones), the
    # router, expert bank and shared experts (``Experts``) where a layer holds a bank.
    "mixtral": _llama_family(_llama_like(), experts=_MOE),
    "qwen3_moe": _llama_family(_llama_like(**_QK_NORMS), experts=_MOE),
    "olmoe": _llama_family(_llama_like(**_QK_NORMS), experts=_MOE),  # q/k norms on the whole projection
    "qwen2_moe": _llama_family(_llama_like(), experts=_GATED_SHARED_MOE),
    "granitemoe": _llama_family(_llama_like(), experts=Experts("block_sparse_moe.router", "block_sparse_moe.experts")),
    # Granite MoE with a shared MLP beside the bank, at the block (its gate and up fused in halves)
    "granitemoeshared": _llama_family(_llama_like(), experts=Experts(
        "block_sparse_moe.router", "block_sparse_moe.experts", shared={
            "shared_gate": Fused("shared_mlp.input_linear", "halves", "first"),
            "shared_up": Fused("shared_mlp.input_linear", "halves", "second"), "shared_down": "shared_mlp.output_linear"})),
    "phimoe": _llama_family(_llama_like(), experts=Experts("mlp.router", "mlp.experts")),  # LayerNorms with biases
    # GLM-4.5 and dots.llm1: DeepSeek-V3's mixture (dense first layers, grouped routing with a
    # routing-score correction bias, a buffer, in the router; shared experts) with plain attention
    "glm4_moe": _llama_family(_llama_like(), experts=_DEEPSEEK_MOE),
    "dots1": _llama_family(_llama_like(**_QK_NORMS), experts=_DEEPSEEK_MOE),
    # DeepSeek-V3 / V2 (``deepseek_v3``): that mixture under multi-head latent attention. The query is
    # q_b(q_a_norm(q_a(x))), or ``q`` where q_lora_rank is None; kv_a gives the key/value latent and the
    # shared rotary key, kv_b decompresses the normed latent into per-head keys and values, at the key's
    # position (docs/moe.md; ``weightgraft.engine.attention.latent``). kv_b sees [batch, 1, seq, rank].
    "deepseek_v3": _llama_family({
        **{k: v for k, v in _llama_like().items() if k not in ("k", "v")},
        "q_a": "self_attn.q_a_proj", "q_a_norm": "self_attn.q_a_layernorm", "q_b": "self_attn.q_b_proj",
        "kv_a": "self_attn.kv_a_proj_with_mqa", "kv_a_norm": "self_attn.kv_a_layernorm", "kv_b": "self_attn.kv_b_proj",
    }, experts=_DEEPSEEK_MOE, pos_axis={"kv_b": 2}),
    # gpt-oss: attention sinks (a learned logit per head beside each query row's keys, read by the
    # attention function: ``sinks``), biased q/k/v/o, sliding and full layers; a biased router on
    # [batch * seq] rows and a bank whose gate/up columns interleave, with biases
    "gpt_oss": Adapter(
        layers="model.layers", embed=("model.embed_tokens",), final_norm="model.norm", unembed="lm_head",
        components={**_llama_like(), "sinks": Tensors("self_attn", ("sinks",))},
        experts=Experts("mlp.router", "mlp.experts")),
    # Hybrids (``Mixer``): LFM2 (short convolutions; its ``embedding_norm`` is the final norm,
    # applied after the layers) and Qwen3.5 (Gated DeltaNet; attention layers whose q_proj
    # interleaves [q_h | gate_h] per head: ``q`` and ``attn_gate``)
    "lfm2": Adapter(
        layers="model.layers", embed=("model.embed_tokens",), final_norm="model.embedding_norm", unembed="lm_head",
        components=_LFM2, mixer=_SHORT_CONV),
    "qwen3_5_text": _llama_family(_QWEN3_5, mixer=_GATED_DELTA),
    # All three layer kinds in one family: mixer layers and attention layers, every layer's MLP a
    # mixture of experts. Qwen3.5-MoE: Qwen3.5's layers with Qwen2-MoE's mixture (a gated shared
    # expert); LFM2-MoE: LFM2's layers, dense first layers, a sigmoid router whose picks the block's
    # ``expert_bias`` buffer shifts (passed to the router: the router slot holds it)
    "qwen3_5_moe_text": _llama_family(_QWEN3_5, mixer=_GATED_DELTA, experts=_GATED_SHARED_MOE),
    "lfm2_moe": Adapter(
        layers="model.layers", embed=("model.embed_tokens",), final_norm="model.embedding_norm", unembed="lm_head",
        components=_LFM2, mixer=_SHORT_CONV, experts=Experts(
            "feed_forward.gate", "feed_forward.experts", router_args=Tensors("feed_forward", ("expert_bias",)))),
    # Gemma 4 (E2B / E4B with per-layer inputs and KV sharing, 31B); its mixture-of-experts block (a
    # dense MLP beside the experts, 26B-A4B) and fully bidirectional attention are refused
    "gemma4_text": Adapter(
        layers="model.layers", embed=_GEMMA4_EMBED, final_norm="model.norm", unembed="lm_head", components={},
        blocks=_GEMMA4_BLOCKS, optional=frozenset({*_GEMMA4_EMBED[1:], "ple_gate", "ple_proj", "ple_norm"}),
        requires={"enable_moe_block": False, "use_bidirectional_attention": frozenset({None, "vision"})}),
    # the step floor of its scan is (0, inf) by default: its one-token decode step agrees with it (with
    # a floor it would not, as Nemotron-H's: refused until that is modelled)
    "falcon_h1": Adapter(
        layers="model.layers", embed=("model.embed_tokens",), final_norm="model.final_layernorm", unembed="lm_head",
        components=_FALCON_H1, mixer=_FALCON_MAMBA2, requires={"time_step_limit": (0.0, float("inf"))}),
    "qwen3_next": _llama_family(_QWEN3_5, mixer=_NEXT_DELTA, experts=_GATED_SHARED_MOE),
    "olmo_hybrid": _llama_family({}, mixer=_OLMO_DELTA, blocks=_OLMO_HYBRID_BLOCKS),
    "nemotron_h": Adapter(layers="model.layers", embed=("model.embeddings",), final_norm="model.norm_f",
                          unembed="lm_head", components={}, mixer=_MAMBA2, blocks=_NEMOTRON_H_BLOCKS),
    # Qwen3-VL's language model: Qwen3's layer (q/k norms on [batch, seq, heads, dim]) with
    # multimodal rotary positions, which on text alone are the same position on every axis.
    "qwen3_vl_text": _llama_family(_llama_like(**_QK_NORMS)),
    # Qwen2-VL's and Qwen2.5-VL's: Qwen2's layer (q/k/v biases), multimodal rotary positions likewise
    "qwen2_vl_text": _llama_family(_llama_like()),
    "qwen2_5_vl_text": _llama_family(_llama_like()),
}

# Vision-language checkpoints: the language model at ``model.language_model``, the unembedding at
# ``lm_head``, the vision tower and projector beside them. Each takes its text family's adapter
# (the text config's ``model_type``), so a Llava over Qwen2 grafts as Qwen2 does.
_TOWER = ("model.vision_tower", "model.multi_modal_projector")
WRAPPERS: dict[str, Wrapper] = {
    "gemma3": Wrapper(),  # Gemma 3 4B / 12B / 27B (their 270M and 1B are text-only gemma3_text)
    "gemma4": Wrapper(outside=("model.vision_tower", "model.embed_vision", "model.audio_tower",
                               "model.embed_audio")),
    "mistral3": Wrapper(),  # Mistral Small 3.1 / 3.2
    "llava": Wrapper(),
    "llava_next": Wrapper(outside=(*_TOWER, "model.image_newline")),
    "llava_onevision": Wrapper(outside=(*_TOWER, "model.image_newline")),
    "internvl": Wrapper(),  # InternVL 3 / 3.5 over Qwen2 / Qwen3
    "idefics3": Wrapper(language_model="model.text_model", outside=("model.vision_model", "model.connector")),
    "smolvlm": Wrapper(language_model="model.text_model", outside=("model.vision_model", "model.connector")),
    "qwen3_vl": Wrapper(outside=("model.visual",), text_only=False),
    "qwen2_vl": Wrapper(outside=("model.visual",), text_only=False),
    "qwen2_5_vl": Wrapper(outside=("model.visual",), text_only=False),
    # Qwen3.5 / Qwen3.5-MoE: a hybrid language model (qwen3_5_text / qwen3_5_moe_text), which has a
    # causal-LM class of its own: loaded alone, its vision tower unread
    "qwen3_5": Wrapper(outside=("model.visual",)),
    "qwen3_5_moe": Wrapper(outside=("model.visual",)),
}





# Families looked at and not grafted yet, each refused in one line (before any weight loads) saying why.
REFUSED: dict[str, str] = {
    "kimi_linear": "Kimi Linear's delta attention decays per channel through low-rank projections in its own "
                   "scan, beside MLA attention and a mixture of experts, none of which is modelled yet",
}


def supported_model_types() -> list[str]:
    """Every ``model_type`` weightgraft grafts: the text families and the vision-language
    checkpoints over them."""
    return sorted([*ADAPTERS, *WRAPPERS])


def wrapper_of(config: Any) -> Wrapper | None:
    """The vision-language wrapper a config describes, None for a text-only model."""
    return WRAPPERS.get(getattr(config, "model_type", None) or "")


def text_config(config: Any) -> Any:
    """The config of the decoder that is grafted: the text config of a vision-language
    checkpoint, the config itself otherwise."""
    if wrapper_of(config) is None:
        return config
    return config.get_text_config(decoder=True)


def adapter_for(config: Any) -> Adapter:
    """The adapter for a model config; a clear error for anything we do not model exactly."""
    model_type = getattr(config, "model_type", None)
    wrapper = wrapper_of(config)
    if wrapper is not None:
        text = text_config(config)
        if getattr(text, "model_type", None) not in ADAPTERS:
            raise UnsupportedArchitectureError(
                f"model_type {model_type!r} is a vision-language checkpoint whose language model is "
                f"{getattr(text, 'model_type', None)!r}, a family weightgraft does not graft yet. "
                f"Supported language models: {', '.join(sorted(ADAPTERS))}."
            )
        return adapter_for(text).under(wrapper.language_model, wrapper.outside)
    if model_type in REFUSED:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported by weightgraft: {REFUSED[model_type]}. "
            f"Supported: {', '.join(supported_model_types())}.")
    if model_type not in ADAPTERS:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported by weightgraft. "
            f"Supported: {', '.join(supported_model_types())}. "
            "Adding one is a single entry in weightgraft/engine/architectures/table.py."
        )
    adapter = ADAPTERS[model_type]
    for attr, wanted in adapter.requires.items():
        allowed = tuple(wanted) if isinstance(wanted, frozenset) else (wanted,)
        value = getattr(config, attr, allowed[0])
        value = tuple(value) if isinstance(value, list) else value  # a config read from JSON holds lists
        if value not in allowed:
            raise UnsupportedArchitectureError(
                f"{model_type}: config.{attr}={value!r} changes the computation in a way "
                f"weightgraft does not model; only {attr}={' or '.join(sorted(map(repr, allowed)))} is supported."
            )
    if adapter.blocks is not None:
        _check_block_kinds(model_type, adapter.blocks, config)
    return adapter


def _check_block_kinds(model_type: str, blocks: BlockKinds, config: Any) -> None:
    """Refuse, from the config alone, a model with a block kind its adapter does not model (Nemotron-H's
    mixture-of-experts blocks), naming why."""
    for kind in dict.fromkeys(str(k) for k in getattr(config, blocks.attribute, None) or ()):
        if kind not in blocks.kinds:
            why = blocks.refused.get(kind, "a block kind its adapter does not model")
            raise UnsupportedArchitectureError(
                f"{model_type}: config.{blocks.attribute} holds {kind!r} blocks: {why}; supported block kinds: "
                f"{', '.join(blocks.kinds)}.")
