"""The physical KV pool.

Per layer, K and V of shape [num_blocks, block_size, num_kv_heads, head_dim].

Physical block b holds flat slots b*block_size .. (b+1)*block_size - 1. Which block belongs to which
sequence is the BlockManager's business; this module only stores and writes tensors.
"""

from __future__ import annotations

import torch

from engine.core.errors import EngineError


class KVCacheError(EngineError, ValueError):
    """An impossible pool size: names the field and the bad value."""


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    return torch.empty((), dtype=dtype).element_size()


def bytes_per_block(
    *, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes one physical block occupies over all layers, K and V together."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_size(dtype)


class KVCache:
    """Preallocated K/V tensors for every layer. Zero-filled, so unused slots are finite."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks <= 0:
            raise KVCacheError(f"num_blocks={num_blocks} must be > 0")
        if not 1 <= block_size <= 1024:
            raise KVCacheError(f"block_size={block_size} must be in 1..1024")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.key_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.value_cache = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)
        ]

    @classmethod
    def from_bytes(
        cls,
        kv_cache_bytes: int,
        *,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        """As many blocks as fit in `kv_cache_bytes` (bytes, all layers, K and V)."""
        per_block = bytes_per_block(
            num_layers=num_layers,
            block_size=block_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
        )
        num_blocks = kv_cache_bytes // per_block
        if num_blocks <= 0:
            raise KVCacheError(
                f"kv_cache_bytes={kv_cache_bytes} holds no block of {per_block} bytes"
            )
        return cls(
            num_layers=num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )

    @property
    def num_layers(self) -> int:
        return len(self.key_cache)

    @property
    def bytes_per_block(self) -> int:
        """Bytes per physical block over all layers (K and V)."""
        return bytes_per_block(
            num_layers=self.num_layers,
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
        )

    @property
    def num_bytes(self) -> int:
        """Bytes of the whole pool."""
        return self.num_blocks * self.bytes_per_block

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of one layer, each [num_blocks, block_size, num_kv_heads, head_dim]."""
        return self.key_cache[index], self.value_cache[index]


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value [T, num_kv_heads, head_dim] at flat slots slot_mapping [T] (int64)."""
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)
