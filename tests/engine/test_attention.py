"""PagedAttention against a slow, loop-based dense reference.

Decode checks run on both backends: "torch" and "auto" (the C kernel on CPU where it builds,
torch on CUDA); tests/engine/test_cpu_decode.py covers the kernel itself.
Set KVSIM_TEST_DEVICE=cuda to run the same checks on a GPU.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from engine.torch_engine.attention import DecodeBackend, build_attention_metadata, paged_attention
from engine.torch_engine.kv_cache import KVCache, bytes_per_block, write_kv

DEVICE = os.environ.get("KVSIM_TEST_DEVICE", "cpu")
HEADS, HEAD_DIM = 8, 16
DECODE_BACKENDS: list[DecodeBackend] = ["torch", "auto"]


def _reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
) -> torch.Tensor:
    """Token by token, head by head, in float64: the definition of causal attention."""
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = query.shape[1] // kv_heads
    out = torch.zeros(query.shape, dtype=torch.float64)
    row = 0
    for q_len, ctx, table in zip(query_lens, context_lens, block_tables):
        keys = torch.stack([key_cache[table[j // block_size], j % block_size] for j in range(ctx)])
        values = torch.stack(
            [value_cache[table[j // block_size], j % block_size] for j in range(ctx)]
        )
        keys, values = keys.double().cpu(), values.double().cpu()  # [ctx, KVH, D]
        for i in range(q_len):
            visible = ctx - q_len + i + 1
            for head in range(query.shape[1]):
                q = query[row + i, head].double().cpu()
                k, v = keys[:visible, head // group], values[:visible, head // group]
                weights = torch.softmax(k @ q / math.sqrt(q.shape[0]), dim=0)
                out[row + i, head] = weights @ v
        row += q_len
    return out


def _case(
    block_size: int,
    group: int,
    query_lens: list[int],
    cached: list[int],
    seed: int,
    decode_backend: DecodeBackend = "auto",
    shared_blocks: int = 0,
) -> tuple[torch.Tensor, ...]:
    """(paged attention, reference); every table starts with the same `shared_blocks`
    physical blocks (a prefix-cache hit: each sequence must cache at least those)."""
    gen = torch.Generator().manual_seed(seed)
    kv_heads = HEADS // group
    context_lens = [c + q for c, q in zip(cached, query_lens)]
    blocks_needed = [math.ceil(c / block_size) - shared_blocks for c in context_lens]
    num_blocks = shared_blocks + sum(blocks_needed) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered physical blocks
    tables, start = [], shared_blocks
    for n in blocks_needed:
        tables.append(order[:shared_blocks] + order[start : start + n])
        start += n
    slots = [
        t[j // block_size] * block_size + j % block_size
        for t, c, q in zip(tables, cached, query_lens)
        for j in range(c, c + q)
    ]
    shape = (num_blocks, block_size, kv_heads, HEAD_DIM)
    key_cache = torch.randn(shape, generator=gen).to(DEVICE)  # stale values everywhere
    value_cache = torch.randn(shape, generator=gen).to(DEVICE)
    tokens = sum(query_lens)
    query = torch.randn(tokens, HEADS, HEAD_DIM, generator=gen).to(DEVICE)
    key = torch.randn(tokens, kv_heads, HEAD_DIM, generator=gen).to(DEVICE)
    value = torch.randn(tokens, kv_heads, HEAD_DIM, generator=gen).to(DEVICE)
    meta = build_attention_metadata(
        query_lens=query_lens,
        context_lens=context_lens,
        block_tables=tables,
        slot_mapping=slots,
        block_size=block_size,
        device=DEVICE,
        decode_backend=decode_backend,
    )
    out = paged_attention(query, key, value, key_cache, value_cache, meta)
    expected = _reference(query, key_cache, value_cache, query_lens, context_lens, tables)
    return out, expected


BLOCK_SIZES = [1, 2, 3, 16, 256]
GROUPS = [1, 2, 4, 8]


@pytest.mark.parametrize("backend", DECODE_BACKENDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GROUPS)
def test_decode_matches_reference_over_ragged_contexts(
    block_size: int, group: int, backend: DecodeBackend
) -> None:
    cached = [0, 6, 17, 33, 2]
    out, expected = _case(
        block_size, group, [1] * 5, cached, seed=block_size, decode_backend=backend
    )
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GROUPS)
def test_fresh_prefill_is_causal_per_sequence(block_size: int, group: int) -> None:
    out, expected = _case(block_size, group, [5, 1, 19, 8], [0, 0, 0, 0], seed=group)
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GROUPS)
def test_prefill_with_cached_prefix_attends_to_it(block_size: int, group: int) -> None:
    # a resumed sequence (cached 9) next to a fresh one and one whose prefix fills whole blocks
    out, expected = _case(block_size, group, [4, 11, 3], [9, 0, 16], seed=7)
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", DECODE_BACKENDS)
@pytest.mark.parametrize("block_size", [1, 16])
def test_large_ragged_decode_batch_split_by_length_matches_reference(
    block_size: int, backend: DecodeBackend
) -> None:
    cached = [(7 * i * i) % 90 for i in range(40)]  # contexts 1..90 in no particular order
    out, expected = _case(block_size, 4, [1] * 40, cached, seed=11, decode_backend=backend)
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-5, rtol=1e-5)


def test_decode_groups_cut_padding_only_when_worth_it() -> None:
    def groups(context_lens: list[int]) -> list[list[int]]:
        tables = [[0] * c for c in context_lens]  # block_size 1
        meta = build_attention_metadata(
            query_lens=[1] * len(context_lens),
            context_lens=context_lens,
            block_tables=tables,
            slot_mapping=[0] * len(context_lens),
            block_size=1,
            decode_backend="torch",  # the kernel needs no groups
        )
        return [
            list(range(len(context_lens))) if g.index is None else g.index.tolist()
            for g in meta.decode_groups
        ]

    ragged = [100 - 3 * i for i in range(32)]  # 100, 97, ..., 7
    assert groups(ragged) == [
        list(range(31, 23, -1)),
        list(range(23, 15, -1)),
        list(range(15, 7, -1)),
        list(range(7, -1, -1)),
    ]
    assert groups([50] * 31 + [60]) == [list(range(32))]  # little padding: one group
    assert groups(ragged[:15]) == [list(range(15))]  # too few sequences to split


@pytest.mark.parametrize("backend", DECODE_BACKENDS)
def test_decode_ignores_slots_beyond_context_and_unowned_blocks(backend: DecodeBackend) -> None:
    gen = torch.Generator().manual_seed(3)
    key_cache = torch.randn(8, 4, 2, HEAD_DIM, generator=gen).to(DEVICE)
    value_cache = torch.randn(8, 4, 2, HEAD_DIM, generator=gen).to(DEVICE)
    query = torch.randn(2, 4, HEAD_DIM, generator=gen).to(DEVICE)
    key = torch.randn(2, 2, HEAD_DIM, generator=gen).to(DEVICE)
    meta = build_attention_metadata(
        query_lens=[1, 1],
        context_lens=[6, 13],
        block_tables=[[6, 1], [3, 0, 7, 4]],
        slot_mapping=[1 * 4 + 1, 4 * 4 + 0],
        block_size=4,
        device=DEVICE,
        decode_backend=backend,
    )
    first = paged_attention(query, key, key, key_cache, value_cache, meta)
    # scribble over what no sequence may read: slots past each context and unowned blocks
    for cache in (key_cache, value_cache):
        cache[1, 2:] = 1e4
        cache[4, 1:] = -1e4
        cache[2] = cache[5] = float("nan")
    second = paged_attention(query, key, key, key_cache, value_cache, meta)
    torch.testing.assert_close(first, second)


def test_blocks_reserved_ahead_are_not_read_and_short_tables_refused() -> None:
    meta = build_attention_metadata(
        query_lens=[1, 1],
        context_lens=[5, 2],
        block_tables=[[4, 2, 7, 1], [3, 6]],  # more blocks than the contexts need
        slot_mapping=[2 * 4 + 0, 3 * 4 + 1],
        block_size=4,
    )
    assert meta.block_tables.tolist() == [[4, 2], [3, 0]]
    with pytest.raises(ValueError, match="shorter"):
        build_attention_metadata(
            query_lens=[1], context_lens=[9], block_tables=[[0, 1]], slot_mapping=[8], block_size=4
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_close_to_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(6, 4, 2, HEAD_DIM, generator=gen)
    key_cache, value_cache = cache.to(DEVICE, dtype), cache.flip(0).to(DEVICE, dtype)
    query = torch.randn(2, 4, HEAD_DIM, generator=gen).to(DEVICE, dtype)
    tables, ctx = [[5, 0, 2], [1]], [11, 3]
    meta = build_attention_metadata(
        query_lens=[1, 1],
        context_lens=ctx,
        block_tables=tables,
        slot_mapping=[2 * 4 + 2, 1 * 4 + 2],
        block_size=4,
        device=DEVICE,
        dtype=dtype,
    )
    key = key_cache.view(-1, 2, HEAD_DIM)[meta.slot_mapping]
    value = value_cache.view(-1, 2, HEAD_DIM)[meta.slot_mapping]
    out = paged_attention(query, key, value, key_cache, value_cache, meta)
    expected = _reference(query, key_cache, value_cache, [1, 1], ctx, tables)
    torch.testing.assert_close(out.double().cpu(), expected, atol=2e-2, rtol=2e-2)


def test_write_kv_places_tokens_at_flat_slots() -> None:
    cache = KVCache(num_layers=2, num_blocks=4, block_size=3, num_kv_heads=2, head_dim=4)
    key_cache, value_cache = cache.layer(1)
    key = torch.arange(2 * 2 * 4, dtype=torch.float32).view(2, 2, 4)
    write_kv(key_cache, value_cache, key, -key, torch.tensor([7, 2]))
    torch.testing.assert_close(key_cache[2, 1], key[0])  # slot 7 = block 2, offset 1
    torch.testing.assert_close(value_cache[0, 2], -key[1])  # slot 2 = block 0, offset 2
    assert int(torch.count_nonzero(cache.layer(0)[0])) == 0


def test_pool_sized_from_bytes_reports_bytes_per_block() -> None:
    per_block = bytes_per_block(
        num_layers=2, block_size=16, num_kv_heads=2, head_dim=8, dtype=torch.float16
    )
    assert per_block == 2 * 2 * 16 * 2 * 8 * 2
    cache = KVCache.from_bytes(
        10 * per_block + 5,
        num_layers=2,
        block_size=16,
        num_kv_heads=2,
        head_dim=8,
        dtype=torch.float16,
    )
    assert cache.num_blocks == 10
    assert cache.bytes_per_block == per_block
    assert cache.num_bytes == 10 * per_block
