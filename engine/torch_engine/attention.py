"""PagedAttention: attention over K/V stored in fixed-size blocks, for any mix of decodes and
prefill chunks in one step.

A step's tokens arrive flat: [T, heads, head_dim], every scheduled sequence's new tokens
concatenated in batch order. Sequence b has query_len n_b new tokens at positions
[c_b, c_b + n_b) (c_b tokens already cached: its own earlier chunks, prefix-cache hits, or
nothing) and reads context_len = c_b + n_b keys through its block table (entry i holds tokens
[i*block_size, (i+1)*block_size)). Every step first writes its K/V at slot_mapping, so each
query at position p attends to positions [0, p] of its sequence, all of them in the pool. A
decode is n_b = 1 at position num_tokens - 1.

Two backends, chosen per step by build_attention_metadata(decode_backend=...):
- "cpu_kernel" (the default on CPU in float32, when engine.torch_engine.cpu_decode could build
  it): a C kernel reads K/V in place through the block tables for every query row of the step,
  decodes and chunks alike, in one call per layer (rows of one chunk share a walk over K/V).
- "torch" (CUDA, half precision, no C compiler, or asked for): engine.torch_engine.attention_torch
  gathers K/V through the block tables and calls SDPA: single-token rows batched in length groups,
  each longer chunk with one SDPA call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import torch

from engine.torch_engine.attention_torch import (
    DecodeGroup,
    GatherWorkspace,
    PrefillChunk,
    chunk_attention,
    decode_groups,
    gather_kv,
    padded_tensor,
    single_token_attention,
)
from engine.torch_engine.cpu_decode import CpuKernelUnavailableError, load_cpu_decode
from engine.torch_engine.kv_cache import write_kv

__all__ = [
    "AttentionMetadata",
    "DecodeBackend",
    "DecodeGroup",
    "GatherWorkspace",
    "PrefillChunk",
    "build_attention_metadata",
    "decode_attention",
    "gather_kv",
    "paged_attention",
    "prefill_attention",
    "resolve_decode_backend",
]

DecodeBackend = Literal["auto", "torch", "cpu_kernel"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionMetadata:
    """Per-step index tensors shared by every layer (tensors on the model's device)."""

    is_decode: bool  # every sequence has exactly one new token
    slot_mapping: torch.Tensor  # [T] int64, flat slot of every new token
    block_tables: torch.Tensor  # [B, max_blocks] int64, context blocks, padded with block 0
    decode_groups: tuple[DecodeGroup, ...]  # torch: the single-token rows split by length
    query_lens: tuple[int, ...]  # per sequence: new tokens this step
    context_lens: tuple[int, ...]  # per sequence: cached + new tokens (keys it reads)
    workspace: GatherWorkspace | None = None  # scratch for decode gathers
    decode_backend: Literal["torch", "cpu_kernel"] = "torch"  # the backend of every row
    # cpu_kernel: [R] int64 (CPU) keys each query row reads; R = B in decode steps, else T
    context_lens_tensor: torch.Tensor | None = None
    row_seqs: torch.Tensor | None = None  # cpu_kernel, not decode: [T] batch row of each token
    single_token_rows: torch.Tensor | None = None  # torch, not decode: [B1] token index of
    # each single-token sequence (decode_groups index these rows)
    chunks: tuple[PrefillChunk, ...] = ()  # torch, not decode: the sequences with n > 1


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

    `decode_backend`: "auto" picks "cpu_kernel" for float32 on CPU when the kernel is
    available, else "torch"; naming a backend forces it. It serves decodes and prefill chunks
    alike. The torch path's decode mask is additive and in the model's `dtype`, so SDPA uses it
    as is.
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
    backend = resolve_decode_backend(decode_backend, device, dtype)
    padded = padded_tensor(tables, device)
    groups: tuple[DecodeGroup, ...] = ()
    lens_tensor = row_seqs = single_rows = None
    chunks: tuple[PrefillChunk, ...] = ()
    if backend == "cpu_kernel" and is_decode:
        lens_tensor = torch.tensor(context_lens, dtype=torch.int64)
    elif backend == "cpu_kernel":
        row_seqs, lens_tensor = _kernel_rows(query_lens, context_lens)
    elif is_decode:
        groups = decode_groups(tables, context_lens, device, dtype)
    else:
        starts = [0, *itertools.accumulate(query_lens)][:-1]
        chunks = tuple(
            PrefillChunk(
                start=start,
                num_tokens=n,
                context_len=ctx,
                block_table=None if ctx == n else padded[b : b + 1, : -(-ctx // block_size)],
            )
            for b, (start, n, ctx) in enumerate(zip(starts, query_lens, context_lens))
            if n > 1
        )
        singles = [b for b, n in enumerate(query_lens) if n == 1]
        if singles:
            single_rows = torch.tensor([starts[b] for b in singles], dtype=torch.int64).to(device)
            groups = decode_groups(
                [tables[b] for b in singles], [context_lens[b] for b in singles], device, dtype
            )
    return AttentionMetadata(
        is_decode=is_decode,
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64).to(device),
        block_tables=padded,
        decode_groups=groups,
        query_lens=tuple(query_lens),
        context_lens=tuple(context_lens),
        workspace=workspace,
        decode_backend=backend,
        context_lens_tensor=lens_tensor,
        row_seqs=row_seqs,
        single_token_rows=single_rows,
        chunks=chunks,
    )


def _kernel_rows(query_lens: list[int], context_lens: list[int]) -> tuple[torch.Tensor, ...]:
    """Per token row: its sequence's batch row and the keys it reads (its position + 1)."""
    counts = torch.tensor(query_lens, dtype=torch.int64)
    ends = torch.tensor(context_lens, dtype=torch.int64)
    row_seqs = torch.repeat_interleave(torch.arange(len(query_lens)), counts)  # [T]
    # token i of sequence b reads ctx_b - n_b + 1 + i keys
    offset = (ends - counts + 1 - (counts.cumsum(0) - counts)).repeat_interleave(counts)
    return row_seqs, offset + torch.arange(int(counts.sum()))


def resolve_decode_backend(
    requested: DecodeBackend, device: torch.device | str, dtype: torch.dtype
) -> Literal["torch", "cpu_kernel"]:
    """The attention backend for tensors of `dtype` on `device`; "cpu_kernel" only for float32
    on CPU, and only if the kernel could be built (load_cpu_decode().reason says why not)."""
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


# --- attention -------------------------------------------------------------------------------


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


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """A decode step: query [B, H, D] (one token per sequence, K/V already cached) -> [B, H, D]."""
    if meta.decode_backend == "cpu_kernel":
        return _kernel_attention(query, key_cache, value_cache, meta)
    return single_token_attention(query, key_cache, value_cache, meta.decode_groups, meta.workspace)


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """A step with prefill chunks (and maybe decodes): query [T, H, D], this step's key/value
    [T, KVH, D] (already in the cache) -> [T, H, D].

    Causal within each sequence; a sequence with cached tokens also attends to all of them.
    """
    if meta.decode_backend == "cpu_kernel":
        return _kernel_attention(query, key_cache, value_cache, meta)
    if meta.is_decode:
        return decode_attention(query, key_cache, value_cache, meta)
    if meta.single_token_rows is None and len(meta.chunks) == 1:
        return chunk_attention(query, key, value, key_cache, value_cache, meta.chunks[0])
    out = torch.empty_like(query)
    if meta.single_token_rows is not None:
        rows = meta.single_token_rows
        singles = single_token_attention(
            query.index_select(0, rows), key_cache, value_cache, meta.decode_groups, meta.workspace
        )
        out.index_copy_(0, rows, singles)
    for chunk in meta.chunks:
        span = slice(chunk.start, chunk.start + chunk.num_tokens)
        out[span] = chunk_attention(
            query[span], key[span], value[span], key_cache, value_cache, chunk
        )
    return out


def _kernel_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """Every query row through engine.torch_engine.cpu_decode's kernel (inference only: it has
    no backward)."""
    kernel = load_cpu_decode().kernel
    assert kernel is not None and meta.context_lens_tensor is not None  # checked when built
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key_cache, value_cache)):
        raise ValueError("the CPU attention kernel has no backward: use decode_backend='torch'")
    return kernel.paged_attention(
        query.contiguous(),
        key_cache,
        value_cache,
        meta.block_tables,
        meta.context_lens_tensor,
        meta.row_seqs,
    )
