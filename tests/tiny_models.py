"""Tiny random models of every supported architecture, built from HF configs (no downloads)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import transformers as T

_COMMON = dict(vocab_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_LLAMA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)

TINY_CONFIGS: dict[str, T.PretrainedConfig] = {
    "gpt2": T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **_COMMON),
    "gpt_neox": T.GPTNeoXConfig(**_LLAMA, **_COMMON),
    "llama": T.LlamaConfig(**_LLAMA, num_key_value_heads=2, **_COMMON),  # GQA
    "gemma": T.GemmaConfig(  # tied embeddings, multi-query attention
        **_LLAMA, num_key_value_heads=1, head_dim=8, **_COMMON
    ),
    "gemma2": T.Gemma2Config(  # tied, four norms, soft-capping, sliding window
        **_LLAMA, num_key_value_heads=2, head_dim=8, sliding_window=3, **_COMMON
    ),
    "gemma3_text": T.Gemma3TextConfig(  # tied, q/k norms on [b, h, t, d], sliding window
        **_LLAMA, num_key_value_heads=2, head_dim=8, sliding_window=3, **_COMMON
    ),
    # Gemma 4: sliding and full layers (the full ones with 16-wide heads, one kv head, k = v), per-layer
    # inputs, and the last two layers reusing the keys and values of the last two before them
    "gemma4_text": T.Gemma4TextConfig(
        **_LLAMA | {"num_hidden_layers": 4}, num_key_value_heads=2, head_dim=8, global_head_dim=16,
        num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=64, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=3,
        final_logit_softcapping=30.0, **_COMMON),
    "qwen2": T.Qwen2Config(**_LLAMA, num_key_value_heads=2, **_COMMON),  # q/k/v biases
    "qwen3": T.Qwen3Config(**_LLAMA, num_key_value_heads=2, head_dim=8, **_COMMON),
    "mistral": T.MistralConfig(**_LLAMA, num_key_value_heads=2, sliding_window=3, **_COMMON),
    "olmo": T.OlmoConfig(**_LLAMA, **_COMMON),
    "olmo2": T.Olmo2Config(**_LLAMA, num_key_value_heads=2, **_COMMON),
    "phi3": T.Phi3Config(**_LLAMA, num_key_value_heads=2, **_COMMON),  # fused qkv, gate_up
    "stablelm": T.StableLmConfig(**_LLAMA, num_key_value_heads=2, **_COMMON),
    "granite": T.GraniteConfig(**_LLAMA, num_key_value_heads=2, **_COMMON),
    # 2025-26 dense families
    "smollm3": T.SmolLM3Config(  # layer 1 without rotary positions (NoPE), GQA
        **_LLAMA, num_key_value_heads=2, no_rope_layers=[1, 0], **_COMMON),
    "ernie4_5": T.Ernie4_5Config(**_LLAMA, num_key_value_heads=2, head_dim=8, **_COMMON),
    "seed_oss": T.SeedOssConfig(**_LLAMA, num_key_value_heads=2, head_dim=8, **_COMMON),  # q/k/v biases
    "glm4": T.Glm4Config(**_LLAMA, num_key_value_heads=2, head_dim=8, **_COMMON),  # fused gate/up, 4 norms
    "exaone4": T.Exaone4Config(  # post-norm, q/k norms on [b, h, t, d], a sliding and a full layer
        **_LLAMA, num_key_value_heads=2, head_dim=8, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"], **_COMMON),
    "olmo3": T.Olmo3Config(  # post-norm, q/k norms on the whole projection, sliding and full
        **_LLAMA, num_key_value_heads=2, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"], **_COMMON),
    "apertus": T.ApertusConfig(  # no gate; xIELU's learned alpha_p / alpha_n (``act``)
        **_LLAMA, num_key_value_heads=2, head_dim=8, **_COMMON),
}

# Vision-language checkpoints over a supported text family: a tiny vision tower beside a tiny
# language model. Their image / video placeholders are ids past the tiny vocabulary (64, 65), so
# random token ids never hold one; weightgraft refuses a prompt that does.
_TEXT = dict(**_LLAMA, num_key_value_heads=2, head_dim=8, **_COMMON)
_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
               image_size=28, patch_size=14)
_QWEN3_5_TEXT = dict(  # multimodal rotary positions, which on text alone are the same position on every axis
    **_TEXT | {"num_hidden_layers": 3}, layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=4, rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0,
                                                   mrope_section=[2, 1, 1], mrope_interleaved=True))
_QWEN3_5_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=14,
                       num_position_embeddings=16)
VL_CONFIGS: dict[str, T.PretrainedConfig] = {
    "gemma3": T.Gemma3Config(  # Gemma 3 4B-27B: tied, four norms, q/k norms, sliding window
        text_config=dict(**_TEXT, sliding_window=3), vision_config=_VISION, mm_tokens_per_image=4,
        image_token_index=64, boi_token_index=61, eoi_token_index=62,
    ),
    "gemma4": T.Gemma4Config(  # Gemma 4 E2B-31B: gemma4_text's layers (per-layer inputs, KV sharing), a vision tower
        text_config=TINY_CONFIGS["gemma4_text"].to_dict(),
        vision_config=dict(**_VISION, num_key_value_heads=2, head_dim=8),
        audio_config=None, image_token_id=64,
    ),
    "mistral3": T.Mistral3Config(  # Mistral Small 3.1: a Mistral language model, Pixtral's tower
        text_config=dict(model_type="mistral", **_TEXT, sliding_window=3),
        vision_config=dict(model_type="pixtral", **_VISION, head_dim=8), image_token_index=64,
        tie_word_embeddings=False,
    ),
    "llava": T.LlavaConfig(  # a Llama language model, CLIP's tower
        text_config=dict(model_type="llama", **_TEXT),
        vision_config=dict(model_type="clip_vision_model", **_VISION), image_token_index=64,
        vision_feature_layer=-1,
    ),
    "llava_next": T.LlavaNextConfig(  # LLaVA-NeXT: a learned image-newline vector beside the tower
        text_config=dict(model_type="mistral", **_TEXT, sliding_window=3),
        vision_config=dict(model_type="clip_vision_model", **_VISION), image_token_index=64,
        vision_feature_layer=-1, image_grid_pinpoints=[[28, 28]],
    ),
    "llava_onevision": T.LlavaOnevisionConfig(  # a Qwen2 language model, SigLIP's tower, videos too
        text_config=dict(model_type="qwen2", **_TEXT), vision_config=dict(model_type="siglip_vision_model", **_VISION),
        image_token_index=64, video_token_index=65, vision_feature_layer=-1, image_grid_pinpoints=[[28, 28]],
    ),
    "internvl": T.InternVLConfig(  # InternVL 3: a Qwen2 language model, tied
        text_config=dict(model_type="qwen2", **_TEXT, tie_word_embeddings=True),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=[28, 28], patch_size=[14, 14]), image_token_id=64,
    ),
    "idefics3": T.Idefics3Config(  # the language model at model.text_model
        text_config=dict(model_type="llama", **_TEXT),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14), image_token_id=64, scale_factor=1,
    ),
    "smolvlm": T.SmolVLMConfig(  # SmolVLM: a SmolLM2 (Llama) language model at model.text_model
        text_config=dict(model_type="llama", **_TEXT),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14), image_token_id=64, scale_factor=1,
    ),
    "qwen2_vl": T.Qwen2VLConfig(  # Qwen2's layer with multimodal rotary positions; loaded whole
        text_config=dict(**_TEXT, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1])),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, out_hidden_size=32, patch_size=14,
                           spatial_merge_size=2), image_token_id=64, video_token_id=65,
    ),
    "qwen2_5_vl": T.Qwen2_5_VLConfig(
        text_config=dict(**_TEXT, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1])),
        vision_config=dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32,
                           patch_size=14, spatial_merge_size=2), image_token_id=64, video_token_id=65,
    ),
    "qwen3_vl": T.Qwen3VLConfig(  # Qwen3's layer with multimodal rotary positions; no text-only class
        text_config=dict(**_TEXT, rope_parameters=dict(
            rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1], mrope_interleaved=True)),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           deepstack_visual_indexes=[0], patch_size=14, num_position_embeddings=16),
        image_token_id=64, video_token_id=65,
    ),
    # Qwen3.5 / Qwen3.5-MoE: a hybrid language model (Gated DeltaNet and gated attention; experts in every MLP)
    # placeholder ids past the character tokenizer's 91 ids: a generated token is never one
    "qwen3_5": T.Qwen3_5Config(text_config=_QWEN3_5_TEXT, vision_config=_QWEN3_5_VISION, image_token_id=95,
                               video_token_id=96),
    "qwen3_5_moe": T.Qwen3_5MoeConfig(
        text_config=dict(_QWEN3_5_TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         shared_expert_intermediate_size=20), vision_config=_QWEN3_5_VISION, image_token_id=95,
        video_token_id=96),
}
TINY_CONFIGS.update(VL_CONFIGS)

# Mixtures of experts: 4 experts, 2 picked per token; eager experts (the implementation transformers
# runs on CPU in float64, and a reference for the default one, set per test where it matters).
_MOE = dict(_TEXT, intermediate_size=24)
MOE_CONFIGS: dict[str, T.PretrainedConfig] = {
    "mixtral": T.MixtralConfig(**_MOE, num_local_experts=4, num_experts_per_tok=2, sliding_window=3),
    "qwen3_moe": T.Qwen3MoeConfig(**_MOE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    "olmoe": T.OlmoeConfig(**_MOE, num_experts=4, num_experts_per_tok=2),
    "qwen2_moe": T.Qwen2MoeConfig(  # a shared expert beside the bank, gated per token
        **_MOE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=20),
    "granitemoe": T.GraniteMoeConfig(**_MOE, num_local_experts=4, num_experts_per_tok=2),
    "granitemoeshared": T.GraniteMoeSharedConfig(  # a shared MLP (gate and up fused) beside the bank
        **_MOE, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=20),
    "phimoe": T.PhimoeConfig(**_MOE, num_local_experts=4, num_experts_per_tok=2),
    "glm4_moe": T.Glm4MoeConfig(  # layer 0 dense; a correction bias in the router
        **_MOE, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
        first_k_dense_replace=1, n_group=2, topk_group=1),
    "dots1": T.Dots1Config(
        **_MOE, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
        first_k_dense_replace=1, n_group=2, topk_group=1),
    "deepseek_v3": T.DeepseekV3Config(  # multi-head latent attention (low-rank q, a 12-wide kv latent); glm4_moe's mixture
        **{k: v for k, v in _MOE.items() if k != "head_dim"} | {"num_key_value_heads": 4}, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1, n_group=2,
        topk_group=1, q_lora_rank=16, kv_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6),
    "gpt_oss": T.GptOssConfig(  # attention sinks, biased attention and router, interleaved gate/up with biases,
        **_MOE, num_local_experts=4, num_experts_per_tok=2, sliding_window=3),  # a sliding and a full layer
}
for _config in MOE_CONFIGS.values():
    _config._experts_implementation = "eager"

# Hybrids: a recurrent token mixer in some layers (``layer_types``), attention in the others; a mixer
# layer after an attention layer too, so a padded attention row reaches a mixer.
HYBRID_CONFIGS: dict[str, T.PretrainedConfig] = {
    "lfm2": T.Lfm2Config(  # short convolutions (kernel 3), tied embeddings
        **_LLAMA | {"num_hidden_layers": 3}, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"],
        conv_L_cache=3, block_auto_adjust_ff_dim=False, **_COMMON),
    "qwen3_5_text": T.Qwen3_5TextConfig(  # Gated DeltaNet (2 k heads, 4 v heads), gated attention
        **_LLAMA | {"num_hidden_layers": 3}, num_key_value_heads=2, head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention"], linear_conv_kernel_dim=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, **_COMMON),
    "nemotron_h": T.NemotronHConfig(  # Mamba2 (4 heads in 2 groups, chunks of 4), attention and MLP blocks
        hidden_size=32, layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48, ssm_state_size=8,
        mamba_num_heads=4, mamba_head_dim=8, n_groups=2, conv_kernel=4, chunk_size=4, **_COMMON),
    # OLMo Hybrid: Gated DeltaNet with q/k/v apart and beta doubled; post-norm attention with rotary positions
    "olmo_hybrid": T.OlmoHybridConfig(
        **_LLAMA | {"num_hidden_layers": 3}, num_key_value_heads=2, layer_types=["linear_attention", "full_attention",
        "linear_attention"], linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **_COMMON),
    # Falcon-H1: attention and a Mamba2 mixer side by side in every layer (4 heads in 2 groups, an inner width
    # of its own, chunks of 4), muP multipliers away from one, the mixer's gated norm on
    "falcon_h1": T.FalconH1Config(
        **_LLAMA | {"num_hidden_layers": 2}, num_key_value_heads=2, head_dim=8, mamba_d_ssm=24, mamba_n_heads=4,
        mamba_d_head=6, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=4, mamba_rms_norm=True,
        embedding_multiplier=1.5, lm_head_multiplier=0.8, attention_in_multiplier=0.9, attention_out_multiplier=1.1,
        ssm_in_multiplier=1.2, ssm_out_multiplier=0.7, key_multiplier=0.9, mlp_multipliers=[1.1, 0.9],
        ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3], **_COMMON),
    # All three layer kinds in one family: mixer and attention layers, mixtures of experts (the MoE matrix runs them too)
    "qwen3_5_moe_text": T.Qwen3_5MoeTextConfig(  # Qwen3.5's layers, every MLP 4 experts and a gated shared expert
        **_LLAMA | {"num_hidden_layers": 3}, num_key_value_heads=2, head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention"], linear_conv_kernel_dim=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=20, **_COMMON),
    "qwen3_next": T.Qwen3NextConfig(  # Qwen3.5-MoE's layers, its DeltaNet's q/k/v/z and b/a interleaved per key head
        **_LLAMA | {"num_hidden_layers": 3}, num_key_value_heads=2, head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention"], linear_conv_kernel_dim=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=20, **_COMMON),
    "lfm2_moe": T.Lfm2MoeConfig(  # LFM2's layers, layer 0 dense, a sigmoid router shifted by the block's expert_bias
        **_LLAMA | {"num_hidden_layers": 3}, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"],
        conv_L_cache=3, num_dense_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, **_COMMON),
}
TINY_CONFIGS.update(HYBRID_CONFIGS)
# Every tiny model whose layers hold a recurrent mixer, the wrappers over a hybrid included: the
# matrices of what refuses mixers (partial grafts, depth and prefix sharing) leave them out
WITH_MIXERS = frozenset({*HYBRID_CONFIGS, *(m for m, c in VL_CONFIGS.items()
                                            if c.get_text_config(decoder=True).model_type in HYBRID_CONFIGS)})
# Every tiny model whose cache depth sharing does not select rows of (mixer states, Gemma 4's
# KV-shared layers, which hold no cache of their own): its items run whole, with a warning
# Gemma 4 and its wrapper: a block's output scale, which partial grafts refuse (tests/engine/test_gemma4.py)
WITH_BLOCK_SCALES = frozenset({"gemma4_text", "gemma4"})
RUNS_WHOLE = WITH_MIXERS | WITH_BLOCK_SCALES
for _name in ("qwen3_5_moe_text", "lfm2_moe", "qwen3_next"):
    MOE_CONFIGS[_name] = HYBRID_CONFIGS[_name]
    MOE_CONFIGS[_name]._experts_implementation = "eager"
# a wrapper over an MoE runs its banks eagerly too (grouped_mm refuses the float64 matrices)
VL_CONFIGS["qwen3_5_moe"]._experts_implementation = "eager"
VL_CONFIGS["qwen3_5_moe"].get_text_config(decoder=True)._experts_implementation = "eager"


@torch.no_grad()
def _randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Large random weights, so that grafting any slot visibly changes the logits."""
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if p.dim() == 1:
            p.copy_(1 + 0.3 * noise if name.endswith("weight") else 0.3 * noise)
        else:
            p.copy_(noise / p.shape[-1] ** 0.5 if p.shape[-1] > 1 else noise)


def make_tiny(
    model_type: str, seed: int = 0, vocab_size: int | None = None, n_layers: int | None = None,
    tied: bool | None = None, randomize: bool = True,
) -> torch.nn.Module:
    """A tiny model of ``model_type``; ``tied`` overrides the config's embedding tying, and
    ``randomize=False`` keeps transformers' own (seeded) initialization, e.g. for training."""
    config = copy.deepcopy({**TINY_CONFIGS, **MOE_CONFIGS, **HYBRID_CONFIGS}[model_type])
    if tied is not None:
        config.tie_word_embeddings = tied
    text = config.get_text_config(decoder=True)
    if vocab_size is not None:
        text.vocab_size = vocab_size
        if getattr(text, "vocab_size_per_layer_input", None):  # Gemma 4's per-layer inputs' embedding
            text.vocab_size_per_layer_input = vocab_size
    if n_layers is not None:
        text.num_hidden_layers = n_layers
        for per_layer in ("layer_types", "no_rope_layers"):  # per-layer kinds: repeat the pattern
            kinds = getattr(text, per_layer, None)
            settable = not isinstance(getattr(type(text), text.attribute_map.get(per_layer, per_layer), None), property)
            if kinds and settable:  # Falcon-H1's is computed: one "hybrid" per layer
                setattr(text, per_layer, [kinds[i % len(kinds)] for i in range(n_layers)])
    torch.manual_seed(seed)
    auto = T.AutoModelForImageTextToText if model_type in VL_CONFIGS else T.AutoModelForCausalLM
    model = auto.from_config(config)
    if randomize:
        _randomize(model, torch.Generator().manual_seed(seed))
    return model.eval()


@torch.no_grad()
def make_donor(base: torch.nn.Module, seed: int, scale: float = 0.5) -> torch.nn.Module:
    """A 'finetuned' copy: every tensor moved by noise of ``scale`` times its spread."""
    donor = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(seed)
    for p in donor.parameters():
        spread = p.std() if p.numel() > 1 else p.abs()
        p.add_(scale * spread * torch.randn(p.shape, generator=gen))
    return donor.eval()


def tiny_models(
    model_type: str, n: int = 2, dtype: torch.dtype = torch.float32, vocab_size: int | None = None,
) -> list[torch.nn.Module]:
    """A tiny base (seed 0) and ``n - 1`` donors near it (seeds 1, 2, ...), all in ``dtype``:
    ``base, donor = tiny_models("llama", 2, torch.float64)``."""
    base = make_tiny(model_type, seed=0, vocab_size=vocab_size).to(dtype)
    return [base] + [make_donor(base, seed=i) for i in range(1, n)]


def random_ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """``[batch, seq]`` token ids of the tiny vocabulary (special ids 0-2 left out), seeded."""
    return torch.randint(3, 64, (batch, seq), generator=torch.Generator().manual_seed(seed))


_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,?:;'-!\"()&$"
    "éèáíóúñçöüÉ"
)


def tiny_tokenizer() -> T.PreTrainedTokenizerFast:
    """A character-level fast tokenizer (real offset mapping), built offline."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(dict.fromkeys(_CHARS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return T.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>",
    )


def tiny_word_tokenizer(texts: list[str]) -> T.PreTrainedTokenizerFast:
    """A word-level fast tokenizer over the words of ``texts`` (splits on spaces/punctuation)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words: dict[str, None] = {}
    pre = pre_tokenizers.Whitespace()
    for text in texts:
        for word, _ in pre.pre_tokenize_str(text):
            words.setdefault(word, None)
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(words))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    return T.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>",
    )


def make_lora_adapter(base: torch.nn.Module, targets: list[str], out: Path, seed: int = 1, r: int = 4):
    """Save a LoRA adapter of ``base`` with random nonzero A and B (B is zero at init) in
    ``out``; return ``(out, merged)``, ``merged`` a separate copy merged by peft."""
    import copy

    import pytest
    from peft import LoraConfig, get_peft_model

    try:
        pm = get_peft_model(copy.deepcopy(base), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets))
    except (ValueError, TypeError) as exc:
        print(f"peft cannot target {targets} on {base.config.model_type}: {exc}")
        pytest.skip(f"peft cannot target {base.config.model_type}: {exc}")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) / p.shape[-1] ** 0.5)
    pm.save_pretrained(out)
    merged = pm.merge_and_unload().eval()
    return out, merged


def tiny_spaced_tokenizer(texts: list[str]) -> T.PreTrainedTokenizerFast:
    """A word-level fast tokenizer whose words carry their leading space, as GPT-2's and
    Llama's do: ``" Tilda"`` is one token and a second space before it is a bare ``" "``."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    pre = pre_tokenizers.Split(Regex(r" ?[^\s]+|\s"), behavior="isolated")
    pieces: dict[str, None] = {" ": None}
    for text in texts:
        for word, _ in pre.pre_tokenize_str(text):
            pieces.setdefault(word, None)
            pieces.setdefault(word.lstrip(" "), None)
            pieces.setdefault(" " + word.lstrip(" "), None)
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list(pieces))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    return T.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>",
    )


def padded_ids(lengths=(9, 5, 7), side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``: seeded random rows of ``lengths``, padded on ``side``."""
    seq = max(lengths)
    ids = torch.zeros(len(lengths), seq, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        span = slice(seq - n, seq) if side == "left" else slice(0, n)
        ids[b, span], mask[b, span] = random_ids(1, n, seed=10 + b)[0], 1
    return ids, mask


def last_token_reference(pre: torch.nn.Module, sft: torch.nn.Module, tok, prompts: list[str], picked) -> torch.Tensor:
    """The per-token definition's logits at each prompt's last token when ``sft`` serves the slots
    ``picked(name)`` chooses there (float64 under ``float64_exact``): what a rule grafting them
    at ``positions="last"`` must give."""
    from weightgraft.engine.forward import slots
    from weightgraft.engine.precision import float64_exact
    from weightgraft.engine.reference import per_token_forward

    enc = tok(prompts, padding=True, return_tensors="pt")
    names = slots(pre)
    source = torch.zeros(*enc["input_ids"].shape, len(names), dtype=torch.long)
    for b, p in enumerate(prompts):
        source[b, len(p) - 1, [i for i, n in enumerate(names) if picked(n)]] = 1
    with float64_exact([pre, sft]):
        want = per_token_forward([pre, sft], enc["input_ids"], source, attention_mask=enc["attention_mask"])
    return want[torch.arange(len(prompts)), torch.tensor([len(p) - 1 for p in prompts])]

