"""The model presets: ModelSpec values of released checkpoints, by name.

Every number is from the model's config.json on the Hugging Face Hub; ``num_params`` is the exact
count of the released checkpoint (sources in docs/costmodel.md). Re-exported by
kvsim.costmodel.modelspec.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from kvsim.costmodel.modelspec import ModelSpec


def _llama(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    inter: int,
    vocab: int,
    params: int,
    max_len: int,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        dtype_bytes=2,
        num_params=params,
        max_model_len=max_len,
    )


def _llama4_scout(name: str, *, expert_weight_bytes: int) -> ModelSpec:
    """Llama 4 Scout 17B-16E: ``expert_weight_bytes`` 1 is the FP8 checkpoint the sim-to-real
    study served (experts in FP8, attention, router, embeddings and LM head in bf16)."""
    return ModelSpec(
        name=name,
        num_layers=48,
        hidden_size=5120,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=16384,
        vocab_size=202048,
        dtype_bytes=2,
        num_params=108_641_793_536,
        max_model_len=10485760,
        num_experts=16,
        num_experts_per_tok=1,
        moe_intermediate_size=8192,
        shared_expert_intermediate_size=8192,
        expert_weight_bytes=expert_weight_bytes,
    )


MODEL_PRESETS: MappingProxyType[str, ModelSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 6_738_415_616, 4096),
            _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 13_015_864_320, 4096),
            _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 68_976_648_192, 4096),
            _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8_030_261_248, 8192),
            _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8_030_261_248, 131072),
            _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 70_553_706_496, 8192),
            # Mistral-7B-v0.1: max_position_embeddings 32768; its 4096-token sliding window is
            # not modelled (the cache keeps every token, as a paged cache without window eviction).
            _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 7_241_732_096, 32768),
            # Qwen2.5-7B(-Instruct): 32768 native context (longer needs YaRN rope scaling).
            _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 7_615_616_512, 32768),
            ModelSpec(
                name="opt-13b",
                num_layers=40,
                hidden_size=5120,
                num_heads=40,
                num_kv_heads=40,
                head_dim=128,
                intermediate_size=20480,
                vocab_size=50272,
                dtype_bytes=2,
                num_params=12_853_473_280,
                max_model_len=2048,
                gated_mlp=False,
                tie_word_embeddings=True,
            ),
            # Mixtral-8x7B-v0.1: 8 experts of width 14336 (its config's intermediate_size),
            # top-2; sliding_window null. 46.7B parameters, 12.9B active per token.
            dataclasses.replace(
                _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 46_702_792_704, 32768),
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=14336,
            ),
            # Qwen3-30B-A3B: 128 experts of width 768, top-8, no shared expert; head_dim 128
            # (not hidden / heads = 64); intermediate_size 6144 is unused (no mlp_only_layers).
            ModelSpec(
                name="qwen3-30b-a3b",
                num_layers=48,
                hidden_size=2048,
                num_heads=32,
                num_kv_heads=4,
                head_dim=128,
                intermediate_size=6144,
                vocab_size=151936,
                dtype_bytes=2,
                num_params=30_532_122_624,
                max_model_len=40960,
                num_experts=128,
                num_experts_per_tok=8,
                moe_intermediate_size=768,
            ),
            # CodeLlama-34b-Instruct-hf (the base -hf has the same config): 48 layers, GQA 64 / 8,
            # vocab 32000 (the 7B / 13B have 32016), max_position_embeddings 16384.
            _llama("codellama-34b", 48, 8192, 64, 8, 22016, 32000, 33_743_970_304, 16384),
            # Qwen3-14B: head_dim 128 given by the config (here equal to hidden / heads), untied,
            # no sliding window. The count includes the per-head q/k norms (40 x 256 weights).
            ModelSpec(
                name="qwen3-14b",
                num_layers=40,
                hidden_size=5120,
                num_heads=40,
                num_kv_heads=8,
                head_dim=128,
                intermediate_size=17408,
                vocab_size=151936,
                dtype_bytes=2,
                num_params=14_768_307_200,
                max_model_len=40960,
            ),
            # Mixtral-8x22B-Instruct-v0.1 (the study's; the base v0.1 has vocab 32000): 8 experts
            # of width 16384 (intermediate_size), top-2, 65536 positions. 141B, 39B active.
            dataclasses.replace(
                _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 140_630_071_296, 65536),
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=16384,
            ),
            # Llama-4-Scout-17B-16E-Instruct's text model (text_config): 16 routed experts of
            # width 8192 (intermediate_size), top-1, and a shared expert of the same width; every
            # layer MoE (interleave_moe_layer_step 1), so intermediate_size_mlp 16384 is unused.
            # Three layers in four use 8192-token chunked attention, not modelled (docs). The
            # count is the checkpoint's: 871,932,416 of it are the vision encoder and projector
            # (bf16), which vLLM loads and a text request never runs.
            _llama4_scout("llama-4-scout-17b-16e", expert_weight_bytes=1),
            _llama4_scout("llama-4-scout-17b-16e-bf16", expert_weight_bytes=0),
        )
    }
)
