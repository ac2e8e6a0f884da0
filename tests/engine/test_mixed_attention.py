"""PagedAttention on vLLM v1 steps: decodes and prefill chunks over cached context in one batch,
sequences sharing prefix blocks. Both backends against test_attention's float64 loop reference;
the kernel's row tiles against rows computed alone (bitwise).

Set KVSIM_TEST_DEVICE=cuda to run the torch backend's checks on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.torch_engine.attention import DecodeBackend, build_attention_metadata
from engine.torch_engine.cpu_decode import CpuDecodeKernel, load_cpu_decode
from tests.engine.test_attention import _case, _reference

BACKENDS: list[DecodeBackend] = ["torch", "auto"]


@pytest.fixture(scope="module")
def kernel() -> CpuDecodeKernel:
    status = load_cpu_decode()
    if status.kernel is None:
        pytest.skip(f"CPU attention kernel unavailable: {status.reason}")
    return status.kernel


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [1, 3, 16, 256])
@pytest.mark.parametrize("group", [1, 4])
def test_mixed_step_of_decodes_and_chunks_matches_reference(
    backend: DecodeBackend, block_size: int, group: int
) -> None:
    # decodes, a fresh 7-token chunk, a 64-token chunk over 9 cached tokens, a 2-token chunk
    # over 130, a 1-token chunk of a fresh prompt, a chunk ending on a block boundary
    query_lens = [1, 7, 1, 64, 2, 1, 13]
    cached = [30, 0, 5, 9, 130, 0, 3]
    out, expected = _case(
        block_size, group, query_lens, cached, seed=block_size + group, decode_backend=backend
    )
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [1, 16])
def test_sequences_sharing_prefix_blocks_read_them_in_place(
    backend: DecodeBackend, block_size: int
) -> None:
    """Three tables start with the same three physical blocks (a prefix-cache hit): one
    sequence decoding, two prefilling their suffixes in chunks over the shared blocks."""
    shared = 3 * block_size
    out, expected = _case(
        block_size,
        2,
        [1, 11, 5],
        [shared + 6, shared, shared],
        seed=block_size,
        decode_backend=backend,
        shared_blocks=3,
    )
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-5, rtol=1e-5)


def test_backends_pick_per_step_and_split_the_torch_work() -> None:
    meta = build_attention_metadata(
        query_lens=[1, 4, 1],
        context_lens=[9, 4, 3],
        block_tables=[[0, 1, 2], [3], [4]],
        slot_mapping=[8, 12, 13, 14, 15, 18],
        block_size=4,
        decode_backend="torch",
    )
    assert not meta.is_decode
    assert meta.single_token_rows is not None and meta.single_token_rows.tolist() == [0, 5]
    assert [(c.start, c.num_tokens, c.context_len, c.block_table) for c in meta.chunks] == [
        (1, 4, 4, None)  # fresh: attends to its own K/V, gathers nothing
    ]
    if load_cpu_decode().kernel is not None:
        via_kernel = build_attention_metadata(
            query_lens=[1, 4, 1],
            context_lens=[9, 6, 3],
            block_tables=[[0, 1, 2], [3, 5], [4]],
            slot_mapping=[8, 14, 15, 20, 21, 18],
            block_size=4,
        )
        assert via_kernel.decode_backend == "cpu_kernel" and not via_kernel.chunks
        assert via_kernel.row_seqs is not None and via_kernel.context_lens_tensor is not None
        assert via_kernel.row_seqs.tolist() == [0, 1, 1, 1, 1, 2]
        assert via_kernel.context_lens_tensor.tolist() == [9, 3, 4, 5, 6, 3]


# --- the kernel's query rows -----------------------------------------------------------------


def _pool(
    seed: int, block_size: int, context_len: int, kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    blocks = math.ceil(context_len / block_size)
    shape = (blocks + 2, block_size, kv_heads, head_dim)
    table = torch.randperm(blocks + 2, generator=gen)[:blocks][None].contiguous()
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen), table


@pytest.mark.parametrize("group", [1, 2, 4, 8, 32])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_chunk_rows_equal_rows_attended_alone_bitwise(
    kernel: CpuDecodeKernel, group: int, head_dim: int
) -> None:
    """A chunk's rows share tiles; each row's output equals the row computed as a decode."""
    cached, n, kv_heads = 70, 45, 2
    key_cache, value_cache, table = _pool(group, 16, cached + n, kv_heads, head_dim)
    query = torch.randn(n, kv_heads * group, head_dim)
    lens = torch.arange(cached + 1, cached + n + 1)
    chunk = kernel.paged_attention(
        query, key_cache, value_cache, table, lens, torch.zeros(n, dtype=torch.int64)
    )
    for i in range(n):
        alone = kernel.paged_decode(
            query[i : i + 1], key_cache, value_cache, table, lens[i : i + 1]
        )
        assert torch.equal(chunk[i], alone[0]), i
    expected = _reference(query, key_cache, value_cache, [n], [cached + n], table.tolist())
    torch.testing.assert_close(chunk.double(), expected, atol=1e-5, rtol=1e-5)
    for threads in (1, 3):
        again = kernel.paged_attention(
            query,
            key_cache,
            value_cache,
            table,
            lens,
            torch.zeros(n, dtype=torch.int64),
            num_threads=threads,
        )
        assert torch.equal(again, chunk)


def test_rows_of_several_sequences_in_any_order(kernel: CpuDecodeKernel) -> None:
    """Rows need not come grouped: interleaved sequences and repeated contexts still tile right."""
    key_cache, value_cache, table = _pool(3, 4, 60, 2, 16)
    tables = torch.cat([table, table.flip(1)])  # two sequences over the same blocks
    row_seqs = torch.tensor([0, 1, 0, 0, 1, 1, 1, 0])
    lens = torch.tensor([5, 60, 6, 6, 1, 2, 3, 59])
    query = torch.randn(8, 4, 16)
    out = kernel.paged_attention(query, key_cache, value_cache, tables, lens, row_seqs)
    for r in range(8):
        alone = kernel.paged_decode(
            query[r : r + 1],
            key_cache,
            value_cache,
            tables[row_seqs[r] : row_seqs[r] + 1],
            lens[r : r + 1],
        )
        assert torch.equal(out[r], alone[0]), r


def test_kernel_refuses_rows_naming_no_sequence(kernel: CpuDecodeKernel) -> None:
    key_cache, value_cache, table = _pool(4, 4, 10, 2, 16)
    query = torch.randn(2, 4, 16)
    lens = torch.tensor([3, 4])
    with pytest.raises(IndexError, match="outside the block tables"):
        kernel.paged_attention(query, key_cache, value_cache, table, lens, torch.tensor([0, 1]))
    with pytest.raises(IndexError, match="context length"):
        kernel.paged_attention(
            query, key_cache, value_cache, table, torch.tensor([3, 13]), torch.tensor([0, 0])
        )
    with pytest.raises(ValueError, match="row_seqs"):
        kernel.paged_attention(query, key_cache, value_cache, table, lens, torch.tensor([0]))
