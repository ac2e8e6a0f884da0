"""The portable torch backend of PagedAttention: gather K/V through block tables, then SDPA.

It runs where the C kernel does not (CUDA, half precision, no C compiler, or when asked for):
- single-token rows (decodes, and one-token prefill chunks) are gathered into a padded
  [B, kv_heads, L, head_dim] view with one index_select per K and V, an additive mask hiding
  each sequence's padding. A large ragged batch is first sorted by context length and cut into
  at most 4 groups, each padded to its own longest context (a loop over groups, never over
  sequences). The query heads of a GQA group are folded into the query-row axis, so K/V are
  never copied per query head.
- a prefill chunk of n > 1 tokens runs one fused SDPA call per sequence (the work is quadratic
  in its length, the loop is not the cost): causal on this step's K/V when nothing is cached,
  and bottom-right causal over the sequence's K/V gathered from the pool when it has cached
  tokens (its own earlier chunks, prefix-cache hits, or a resumed sequence's recompute).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

MAX_DECODE_GROUPS = 4  # decode batches split into at most this many length groups ...
MIN_DECODE_GROUP = 8  # ... of at least this many sequences ...
MIN_PADDING_SAVED = 0.2  # ... when that saves this share of the padded keys


class GatherWorkspace:
    """Reusable scratch rows for decode's K/V gathers, grown on demand.

    Gathering into fresh tensors in every layer of every step makes the CPU allocator map and
    page-fault megabytes each time (4x slower decode on CPU); one workspace per engine avoids it.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def rows(self, name: str, num_rows: int, like: torch.Tensor) -> torch.Tensor:
        """A [num_rows, like.shape[1]] buffer with like's dtype and device (contents undefined)."""
        buf = self._buffers.get(name)
        if (
            buf is None
            or buf.shape[0] < num_rows
            or buf.shape[1] != like.shape[1]
            or buf.dtype != like.dtype
            or buf.device != like.device
        ):
            size = num_rows + num_rows // 4  # headroom: batches grow step by step
            buf = torch.empty(size, like.shape[1], dtype=like.dtype, device=like.device)
            self._buffers[name] = buf
        return buf[:num_rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeGroup:
    """Single-token rows of similar context length, gathered and attended together."""

    index: torch.Tensor | None  # [g] int64 rows of the batch; None: the whole batch, in order
    block_tables: torch.Tensor  # [g, nb] int64, padded with block 0
    max_context_len: int  # L: keys gathered per sequence
    mask: torch.Tensor | None  # additive 0 / -inf [g, 1, 1, L]; None if no padding


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillChunk:
    """One sequence's n > 1 new tokens: rows [start, start + n) of the step's tokens."""

    start: int
    num_tokens: int  # n
    context_len: int  # keys it reads: cached + n
    block_table: torch.Tensor | None  # [1, nb] int64; None when nothing is cached (ctx == n)


def padded_tensor(tables: list[list[int]], device: torch.device | str) -> torch.Tensor:
    """Block tables as one [B, max_blocks] int64 tensor, padded with block 0."""
    width = max(1, max(len(t) for t in tables))
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64).to(device)


def decode_groups(
    tables: list[list[int]],
    context_lens: list[int],
    device: torch.device | str,
    dtype: torch.dtype,
) -> tuple[DecodeGroup, ...]:
    """The single-token rows (one table and context length each) split by context length."""
    return tuple(
        _decode_group(rows, tables, context_lens, batch_order, device, dtype)
        for rows, batch_order in _split_by_length(context_lens)
    )


def _split_by_length(context_lens: list[int]) -> list[tuple[list[int], bool]]:
    """Rows of each decode group, and whether the group is the whole batch in order.

    Sorted by context length and cut into equal-count groups when that saves enough padding
    (each group is padded to its own longest context instead of the batch's).
    """
    batch = len(context_lens)
    num_groups = min(MAX_DECODE_GROUPS, batch // MIN_DECODE_GROUP)
    if num_groups > 1:
        order = sorted(range(batch), key=context_lens.__getitem__)
        cuts = [batch * i // num_groups for i in range(num_groups + 1)]
        grouped = sum((b - a) * context_lens[order[b - 1]] for a, b in itertools.pairwise(cuts))
        if grouped <= (1 - MIN_PADDING_SAVED) * batch * max(context_lens):
            return [(order[a:b], False) for a, b in itertools.pairwise(cuts)]
    return [(list(range(batch)), True)]


def _decode_group(
    rows: list[int],
    tables: list[list[int]],
    context_lens: list[int],
    batch_order: bool,
    device: torch.device | str,
    dtype: torch.dtype,
) -> DecodeGroup:
    ctx = [context_lens[r] for r in rows]
    max_ctx = max(ctx)
    mask = None
    if min(ctx) < max_ctx:
        keys = torch.arange(max_ctx)[None, :]  # [1, L]
        hidden = keys >= torch.tensor(ctx)[:, None]  # [g, L]
        additive = torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf"))
        mask = additive[:, None, None, :].to(device)  # [g, 1, 1, L]
    return DecodeGroup(
        index=None if batch_order else torch.tensor(rows, dtype=torch.int64).to(device),
        block_tables=padded_tensor([tables[r] for r in rows], device),
        max_context_len=max_ctx,
        mask=mask,
    )


def gather_kv(
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    length: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """cache [N, bs, KVH, D] through block_tables [B, nb] -> [B, KVH, length, D] (a view).

    `out`, if given, receives the copied blocks: [B * nb, bs * KVH * D].
    """
    batch, num_blocks = block_tables.shape
    total, block_size, kv_heads, head_dim = cache.shape
    # one contiguous row per physical block: index_select copies whole blocks (memcpy-like)
    pool = cache.view(total, -1)  # [N, bs*KVH*D]
    index = block_tables.reshape(-1)  # [B*nb]
    rows = (
        pool.index_select(0, index) if out is None else torch.index_select(pool, 0, index, out=out)
    )
    flat = rows.view(batch, num_blocks * block_size, kv_heads, head_dim)
    return flat[:, :length].transpose(1, 2)  # [B, KVH, L, D]


def single_token_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    groups: tuple[DecodeGroup, ...],
    work: GatherWorkspace | None,
) -> torch.Tensor:
    """query [B, H, D] (one token per sequence, its K/V already cached) -> [B, H, D]."""
    batch, heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    q = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)  # [B, KVH, G, D]
    if len(groups) == 1 and groups[0].index is None:
        out = _decode_group_attention(q, key_cache, value_cache, groups[0], work)
    else:
        out = torch.empty_like(q)
        for group in groups:
            assert group.index is not None
            q_group = q.index_select(0, group.index)  # [g, KVH, G, D]
            o = _decode_group_attention(q_group, key_cache, value_cache, group, work)
            out.index_copy_(0, group.index, o)
    return out.reshape(batch, heads, head_dim)


def _decode_group_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    group: DecodeGroup,
    work: GatherWorkspace | None,
) -> torch.Tensor:
    """q [g, KVH, G, D] -> [g, KVH, G, D] over the group's gathered K/V."""
    tables, length = group.block_tables, group.max_context_len
    k_rows = v_rows = None
    if work is not None:
        k_rows = work.rows("key", tables.numel(), key_cache.view(key_cache.shape[0], -1))
        v_rows = work.rows("value", tables.numel(), value_cache.view(value_cache.shape[0], -1))
    k = gather_kv(key_cache, tables, length, k_rows)  # [g, KVH, L, D]
    v = gather_kv(value_cache, tables, length, v_rows)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=group.mask)


def chunk_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    chunk: PrefillChunk,
) -> torch.Tensor:
    """One prefill chunk: query [n, H, D], its key/value [n, KVH, D] -> [n, H, D].

    Query i sits at position ctx - n + i and sees keys [0, ctx - n + i].
    """
    group = query.shape[1] // key.shape[1]
    q = query.transpose(0, 1)  # [H, n, D]
    if chunk.block_table is None:  # nothing cached: this step's K/V are the whole context
        k = _per_query_head(key, group)  # [H, n, D]
        v = _per_query_head(value, group)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [H, n, D]
    else:  # keys [0, ctx) from the pool, which already holds this chunk's K/V
        n, ctx = chunk.num_tokens, chunk.context_len
        k = gather_kv(key_cache, chunk.block_table, ctx)[0].repeat_interleave(group, dim=0)
        v = gather_kv(value_cache, chunk.block_table, ctx)[0].repeat_interleave(group, dim=0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, ctx))
    return out.transpose(0, 1)  # [n, H, D]


def _per_query_head(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [n, KVH, D] -> [KVH * group, n, D]: each K/V head repeated for its query heads."""
    return x.transpose(0, 1).repeat_interleave(group, dim=0)
