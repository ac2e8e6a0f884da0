"""PagedAttention in plain torch: attention over K/V stored in fixed-size blocks.

A step's tokens arrive flat: [T, heads, head_dim], every scheduled sequence's new tokens
concatenated in batch order. Sequence b has query_len q_b new tokens at positions
[c_b, c_b + q_b) and reads context_len = c_b + q_b keys through its block table
(entry i holds tokens [i*block_size, (i+1)*block_size)).

Both phases are vectorised over the batch: the K/V of every sequence is gathered through its
block table into a padded [B, L, kv_heads, head_dim] tensor with one indexing op, and a boolean
mask hides padding and future positions. Grouped-query attention never copies K/V per query head:
the query heads of a group are folded into the query-row axis instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kv_cache import write_kv


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionMetadata:
    """Per-step index tensors shared by every layer (all on the model's device)."""

    is_decode: bool  # every sequence has exactly one new token
    fresh_prefill: bool  # prefill with no cached tokens: attend to this step's K/V directly
    slot_mapping: torch.Tensor  # [T] int64, flat slot of every new token
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with block 0 (masked)
    context_lens: torch.Tensor  # [B] int64, keys each sequence reads (cached + new)
    max_context_len: int  # keys gathered per sequence: max(context_lens)
    max_query_len: int  # rows per sequence in the padded query layout
    query_index: torch.Tensor  # [T] int64, row of each token in the padded [B * max_query_len]
    attn_mask: torch.Tensor  # bool, decode [B, 1, 1, L]; prefill [B, 1, max_query_len * G, L]


def build_attention_metadata(
    *,
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
    num_queries_per_kv: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Index tensors for one step. Lists are per sequence in batch order (counts in tokens)."""
    if not (len(query_lens) == len(context_lens) == len(block_tables)) or not query_lens:
        raise ValueError(
            f"need one query_len, context_len and block table per sequence, got "
            f"{len(query_lens)}, {len(context_lens)}, {len(block_tables)}"
        )
    if sum(query_lens) != len(slot_mapping):
        raise ValueError(f"slot_mapping has {len(slot_mapping)} slots for {sum(query_lens)} tokens")
    batch = len(query_lens)
    max_q, max_ctx = max(query_lens), max(context_lens)
    is_decode = max_q == 1
    fresh = not is_decode and all(q == c for q, c in zip(query_lens, context_lens))
    max_blocks = max(1, max(len(t) for t in block_tables))
    padded = [t + [0] * (max_blocks - len(t)) for t in block_tables]

    ctx = torch.tensor(context_lens, dtype=torch.int64)
    qlen = torch.tensor(query_lens, dtype=torch.int64)
    # 1. mask over keys: key j valid iff j < context_len and j <= cached + query row.
    key_len = max_q if fresh else max_ctx
    keys = torch.arange(key_len)[None, None, :]  # [1, 1, L]
    rows = torch.arange(max_q)[None, :, None]  # [1, max_q, 1]
    cached = (ctx - qlen)[:, None, None]  # [B, 1, 1]
    mask = (keys < ctx[:, None, None]) & (keys <= cached + rows)  # [B, max_q, L]
    if not is_decode:
        mask = mask.repeat_interleave(num_queries_per_kv, dim=1)  # [B, max_q * G, L]
    # 2. position of each flat token in the padded query layout [B * max_q].
    starts = torch.arange(batch, dtype=torch.int64) * max_q
    query_index = torch.repeat_interleave(starts, qlen) + _ragged_arange(qlen)
    return AttentionMetadata(
        is_decode=is_decode,
        fresh_prefill=fresh,
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64).to(device),
        block_tables=torch.tensor(padded, dtype=torch.int64).to(device),
        context_lens=ctx.to(device),
        max_context_len=max_ctx,
        max_query_len=max_q,
        query_index=query_index.to(device),
        attn_mask=mask[:, None].to(device),  # [B, 1, rows, L]
    )


def _ragged_arange(lengths: torch.Tensor) -> torch.Tensor:
    """Concatenation of arange(n) for each n in lengths: [sum(lengths)]."""
    offsets = torch.cumsum(lengths, 0) - lengths  # [B]
    return torch.arange(int(lengths.sum())) - torch.repeat_interleave(offsets, lengths)


# --- kernels ---------------------------------------------------------------------------------


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """cache [N, bs, KVH, D] through block_tables [B, nb] -> [B, KVH, length, D] (a view)."""
    batch, num_blocks = block_tables.shape
    _, block_size, kv_heads, head_dim = cache.shape
    gathered = cache[block_tables]  # [B, nb, bs, KVH, D]
    flat = gathered.view(batch, num_blocks * block_size, kv_heads, head_dim)
    return flat[:, :length].transpose(1, 2)  # [B, KVH, L, D]


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """query [B, H, D] (one token per sequence) -> [B, H, D]."""
    batch, heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    q = query.view(batch, kv_heads, heads // kv_heads, head_dim)  # [B, KVH, G, D]
    k = gather_kv(key_cache, meta.block_tables, meta.max_context_len)  # [B, KVH, L, D]
    v = gather_kv(value_cache, meta.block_tables, meta.max_context_len)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=meta.attn_mask)  # [B, KVH, G, D]
    return out.reshape(batch, heads, head_dim)


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """query [T, H, D], this step's key/value [T, KVH, D] -> [T, H, D].

    Causal within each sequence; a sequence with cached tokens also attends to all of them.
    """
    num_tokens, heads, head_dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    batch, max_q = meta.block_tables.shape[0], meta.max_query_len
    rows = batch * max_q
    q_pad = query.new_zeros(rows, heads, head_dim).index_copy_(0, meta.query_index, query)
    q = q_pad.view(batch, max_q, kv_heads, group, head_dim).transpose(1, 2)  # [B,KVH,mq,G,D]
    q = q.reshape(batch, kv_heads, max_q * group, head_dim)  # row = i * G + g
    if meta.fresh_prefill:
        k = _pad(key, meta.query_index, rows).view(batch, max_q, kv_heads, head_dim)
        v = _pad(value, meta.query_index, rows).view(batch, max_q, kv_heads, head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, KVH, mq, D]
    else:
        k = gather_kv(key_cache, meta.block_tables, meta.max_context_len)  # [B, KVH, L, D]
        v = gather_kv(value_cache, meta.block_tables, meta.max_context_len)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=meta.attn_mask)  # [B,KVH,mq*G,D]
    out = out.view(batch, kv_heads, max_q, group, head_dim).transpose(1, 2)  # [B,mq,KVH,G,D]
    out = out.reshape(rows, heads, head_dim)
    return out.index_select(0, meta.query_index)[:num_tokens]  # [T, H, D]


def _pad(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """Scatter flat x [T, ...] into zeros [rows, ...] at `index`."""
    return x.new_zeros(rows, *x.shape[1:]).index_copy_(0, index, x)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """Write this step's key/value [T, KVH, D] into the cache, then attend: -> [T, H, D]."""
    write_kv(key_cache, value_cache, key, value, meta.slot_mapping)
    if meta.is_decode:
        return decode_attention(query, key_cache, value_cache, meta)
    return prefill_attention(query, key, value, key_cache, value_cache, meta)
