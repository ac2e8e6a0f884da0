"""PagedAttention in plain torch: attention over K/V stored in fixed-size blocks.

A step's tokens arrive flat: [T, heads, head_dim], every scheduled sequence's new tokens
concatenated in batch order. Sequence b has query_len q_b new tokens at positions
[c_b, c_b + q_b) and reads context_len = c_b + q_b keys through its block table
(entry i holds tokens [i*block_size, (i+1)*block_size)).

- Decode (one new token per sequence) has two backends, chosen per step by
  build_attention_metadata(decode_backend=...):
  - "cpu_kernel" (the default on CPU in float32, when engine.cpu_decode could build it): a C
    kernel reads K/V in place through the block tables, one thread per (sequence, kv head) at
    a time, each over its own context length (no padding, no mask);
  - "torch" (CUDA, half precision, no C compiler, or asked for): every sequence's K/V is
    gathered through its block table into a padded [B, kv_heads, L, head_dim] view with one
    index_select, and an additive mask hides each sequence's padding. A large ragged batch is
    first sorted by context length and cut into at most 4 groups, each padded to its own
    longest context (a loop over groups, never over sequences). The query heads of a GQA
    group are folded into the query-row axis, so K/V are never copied per query head.
- Prefill runs one fused SDPA call per sequence (the work is quadratic in its length, the loop
  is not the cost): causal on this step's K/V when nothing is cached, and bottom-right causal
  over the K/V gathered from the cache when the sequence resumes with cached tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from engine.cpu_decode import CpuKernelUnavailableError, load_cpu_decode
from engine.kv_cache import write_kv

DecodeBackend = Literal["auto", "torch", "cpu_kernel"]


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
    """Decode sequences of similar context length, gathered and attended together."""

    index: torch.Tensor | None  # [g] int64 rows of the batch; None: the whole batch, in order
    block_tables: torch.Tensor  # [g, nb] int64, padded with block 0
    max_context_len: int  # L: keys gathered per sequence
    mask: torch.Tensor | None  # additive 0 / -inf [g, 1, 1, L]; None if no padding


MAX_DECODE_GROUPS = 4  # decode batches split into at most this many length groups ...
MIN_DECODE_GROUP = 8  # ... of at least this many sequences ...
MIN_PADDING_SAVED = 0.2  # ... when that saves this share of the padded keys


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionMetadata:
    """Per-step index tensors shared by every layer (tensors on the model's device)."""

    is_decode: bool  # every sequence has exactly one new token
    slot_mapping: torch.Tensor  # [T] int64, flat slot of every new token
    block_tables: torch.Tensor  # [B, max_blocks] int64, context blocks, padded with block 0
    decode_groups: tuple[DecodeGroup, ...]  # decode: the batch split by context length
    query_lens: tuple[int, ...]  # per sequence: new tokens this step
    context_lens: tuple[int, ...]  # per sequence: cached + new tokens (keys it reads)
    workspace: GatherWorkspace | None = None  # scratch for decode gathers
    decode_backend: Literal["torch", "cpu_kernel"] = "torch"  # prefill steps: always "torch"
    context_lens_tensor: torch.Tensor | None = None  # [B] int64 (CPU), cpu_kernel only


def build_attention_metadata(
    *,
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    workspace: GatherWorkspace | None = None,
    decode_backend: DecodeBackend = "auto",
) -> AttentionMetadata:
    """Index tensors for one step; lists are per sequence in batch order (counts in tokens).

    `decode_backend` (decode steps only): "auto" picks "cpu_kernel" for float32 on CPU when
    the kernel is available, else "torch"; naming a backend forces it. The torch path's decode
    mask is additive and in the model's `dtype`, so SDPA uses it as is.
    """
    if not (len(query_lens) == len(context_lens) == len(block_tables)) or not query_lens:
        raise ValueError(
            f"need one query_len, context_len and block table per sequence, got "
            f"{len(query_lens)}, {len(context_lens)}, {len(block_tables)}"
        )
    if sum(query_lens) != len(slot_mapping):
        raise ValueError(f"slot_mapping has {len(slot_mapping)} slots for {sum(query_lens)} tokens")
    bad = [(q, c) for q, c in zip(query_lens, context_lens) if not 1 <= q <= c]
    if bad:
        raise ValueError(f"(query_len, context_len) pairs {bad[:3]} break 1 <= query <= context")
    is_decode = max(query_lens) == 1
    # only the blocks holding context: an allocator may have reserved more ahead
    needed = [-(-c // block_size) for c in context_lens]
    if any(len(t) < n for t, n in zip(block_tables, needed)):
        raise ValueError(f"a block table is shorter than its context of {context_lens} tokens")
    tables = [t[:n] for t, n in zip(block_tables, needed)]
    groups: tuple[DecodeGroup, ...] = ()
    backend = resolve_decode_backend(decode_backend, device, dtype) if is_decode else "torch"
    lens_tensor = None
    if backend == "cpu_kernel":
        lens_tensor = torch.tensor(context_lens, dtype=torch.int64)
    elif is_decode:
        groups = tuple(
            _decode_group(rows, tables, context_lens, batch_order, device, dtype)
            for rows, batch_order in _split_by_length(context_lens)
        )
    return AttentionMetadata(
        is_decode=is_decode,
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64).to(device),
        block_tables=_padded_tensor(tables, device),
        decode_groups=groups,
        query_lens=tuple(query_lens),
        context_lens=tuple(context_lens),
        workspace=workspace,
        decode_backend=backend,
        context_lens_tensor=lens_tensor,
    )


def resolve_decode_backend(
    requested: DecodeBackend, device: torch.device | str, dtype: torch.dtype
) -> Literal["torch", "cpu_kernel"]:
    """The decode backend for tensors of `dtype` on `device`; "cpu_kernel" only for float32 on
    CPU, and only if the kernel could be built (load_cpu_decode().reason says why not)."""
    if requested == "torch":
        return "torch"
    if requested not in ("auto", "cpu_kernel"):
        raise ValueError(f"decode_backend={requested!r}: expected 'auto', 'torch' or 'cpu_kernel'")
    fits = torch.device(device).type == "cpu" and dtype == torch.float32
    if requested == "auto":
        return "cpu_kernel" if fits and load_cpu_decode().kernel is not None else "torch"
    if not fits:
        raise ValueError(f"decode_backend='cpu_kernel' is float32 on CPU, not {dtype} on {device}")
    reason = load_cpu_decode().reason
    if reason is not None:
        raise CpuKernelUnavailableError(f"decode_backend='cpu_kernel': {reason}")
    return "cpu_kernel"


def _padded_tensor(tables: list[list[int]], device: torch.device | str) -> torch.Tensor:
    width = max(1, max(len(t) for t in tables))
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64).to(device)


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
        block_tables=_padded_tensor([tables[r] for r in rows], device),
        max_context_len=max_ctx,
        mask=mask,
    )


# --- kernels ---------------------------------------------------------------------------------


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


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """query [B, H, D] (one token per sequence, K/V already cached) -> [B, H, D]."""
    if meta.decode_backend == "cpu_kernel":
        return _kernel_decode(query, key_cache, value_cache, meta)
    batch, heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    q = query.view(batch, kv_heads, heads // kv_heads, head_dim)  # [B, KVH, G, D]
    groups = meta.decode_groups
    if len(groups) == 1 and groups[0].index is None:
        out = _decode_group_attention(q, key_cache, value_cache, groups[0], meta.workspace)
    else:
        out = torch.empty_like(q)
        for group in groups:
            assert group.index is not None
            q_group = q.index_select(0, group.index)  # [g, KVH, G, D]
            o = _decode_group_attention(q_group, key_cache, value_cache, group, meta.workspace)
            out.index_copy_(0, group.index, o)
    return out.reshape(batch, heads, head_dim)


def _kernel_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """Decode through engine.cpu_decode's kernel (inference only: it has no backward)."""
    kernel = load_cpu_decode().kernel
    assert kernel is not None and meta.context_lens_tensor is not None  # checked when built
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key_cache, value_cache)):
        raise ValueError("the CPU decode kernel has no backward: use decode_backend='torch'")
    return kernel.paged_decode(
        query.contiguous(), key_cache, value_cache, meta.block_tables, meta.context_lens_tensor
    )


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


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """query [T, H, D], this step's key/value [T, KVH, D] -> [T, H, D].

    Causal within each sequence; a sequence with cached tokens also attends to all of them
    (read from the cache, which already holds this step's K/V).
    """
    heads, kv_heads = query.shape[1], key.shape[1]
    group = heads // kv_heads
    block_size = key_cache.shape[1]
    outs = []
    start = 0
    for index, (n, ctx) in enumerate(zip(meta.query_lens, meta.context_lens)):
        q = query[start : start + n].transpose(0, 1)  # [H, n, D]
        if ctx == n:  # nothing cached: this step's K/V are the whole context
            k = _per_query_head(key[start : start + n], group)  # [H, n, D]
            v = _per_query_head(value[start : start + n], group)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [H, n, D]
        else:  # resumed: keys [0, ctx) from the cache; query i sits at position ctx - n + i
            table = meta.block_tables[index : index + 1, : -(-ctx // block_size)]  # [1, nb]
            k = gather_kv(key_cache, table, ctx)[0].repeat_interleave(group, dim=0)  # [H,ctx,D]
            v = gather_kv(value_cache, table, ctx)[0].repeat_interleave(group, dim=0)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, ctx))
        outs.append(out.transpose(0, 1))  # [n, H, D]
        start += n
    return torch.cat(outs) if len(outs) > 1 else outs[0].contiguous()


def _per_query_head(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [n, KVH, D] -> [KVH * group, n, D]: each K/V head repeated for its query heads."""
    return x.transpose(0, 1).repeat_interleave(group, dim=0)


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
