"""Building blocks of a Llama-family decoder: RMSNorm, rotary embeddings, SwiGLU MLP.

All layers work on flat token batches: [num_tokens, ...], the layout the paged engine uses
(every sequence's new tokens concatenated, no padding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.torch_engine.models.config import RopeConfig


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32 as in the reference implementation."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] (radians per position, float32, CPU)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type != "llama3":
        return inv_freq
    old = rope.original_max_position_embeddings
    low_wavelen = old / rope.low_freq_factor
    high_wavelen = old / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Computes (cos, sin) for token positions; rotate-half convention (not interleaved)."""

    inv_freq: torch.Tensor

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def reset(self) -> None:
        """Recompute inv_freq in float32 on its current device (after to_empty or a dtype cast)."""
        device = self.inv_freq.device
        self.inv_freq = rope_inv_freq(self.rope, self.head_dim).to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions [T] int64 -> cos, sin [T, 1, head_dim] in `dtype` (computed in float32)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated by cos/sin [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 * I]
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)  # [T, hidden]
        return out
