"""A Llama-family decoder (Llama, Mistral, Qwen2) over a paged KV cache.

Parameter names follow Hugging Face checkpoints, except that q/k/v and gate/up projections are
fused (`qkv_proj`, `gate_up_proj`); engine.torch_engine.loader maps checkpoint names onto
the fused weights.
Instead of a dense past_key_values, each attention layer reads and writes the paged KVCache
through the step's AttentionMetadata.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.torch_engine.attention import AttentionMetadata, paged_attention
from engine.torch_engine.kv_cache import KVCache
from engine.torch_engine.models.config import ModelConfig
from engine.torch_engine.models.layers import RMSNorm, RotaryEmbedding, SwiGLUMLP, apply_rotary


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.split_sizes), bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_proj_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; writes this step's K/V into the layer's cache `kv`."""
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split_sizes, dim=-1)
        q = apply_rotary(q.view(num_tokens, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary(k.view(num_tokens, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, kv[0], kv[1], meta)  # [T, H, D]
        projected: torch.Tensor = self.o_proj(out.reshape(num_tokens, -1))  # [T, hidden]
        return projected


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, meta)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        """input_ids, positions [T] int64 -> final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary_emb(positions, x.dtype)  # [T, 1, D] each
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_cache.layer(index), meta)
        out: torch.Tensor = self.norm(x)
        return out


class LlamaForCausalLM(nn.Module):
    """Decoder plus LM head (tied to the embedding when config.tie_word_embeddings)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] for the step's flat tokens."""
        hidden: torch.Tensor = self.model(input_ids, positions, meta, kv_cache)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, hidden] -> logits [B, vocab] in float32."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded initialisation: normal(0, initializer_range) weights, zero biases, unit norms."""
        generator = torch.Generator(device=self.model.embed_tokens.weight.device)
        generator.manual_seed(seed)
        std = self.config.initializer_range
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=generator)
