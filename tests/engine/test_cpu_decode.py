"""The C decode kernel (engine/torch_engine/cpu_decode.py, engine/torch_engine/csrc/paged_decode.c).

Checked against test_attention's loop-based float64 reference and against the torch path, over
block sizes, GQA ratios, head sizes (the fixed-size copies 32/64/128 and the generic one) and
ragged contexts longer than one online-softmax chunk (64 tokens). Skipped, with the reason, where
the kernel cannot be built (no C compiler).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.torch_engine.attention
from engine.torch_engine.attention import build_attention_metadata, decode_attention
from engine.torch_engine.cpu_decode import (
    CpuDecodeKernel,
    CpuDecodeStatus,
    CpuKernelUnavailableError,
    load_cpu_decode,
)
from tests.engine.test_attention import _reference

Case = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]], list[int]]


@pytest.fixture(scope="module")
def kernel() -> CpuDecodeKernel:
    status = load_cpu_decode()
    if status.kernel is None:
        pytest.skip(f"CPU decode kernel unavailable: {status.reason}")
    return status.kernel


def _case(
    seed: int,
    block_size: int,
    group: int,
    context_lens: list[int],
    *,
    kv_heads: int = 2,
    head_dim: int = 16,
) -> Case:
    """query [B, H, D], K/V pools with shuffled blocks and stale values, block tables, lengths."""
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(c / block_size) for c in context_lens]
    num_blocks = sum(needed) + 3  # unowned blocks hold stale values too
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, start = [], 0
    for n in needed:
        tables.append(order[start : start + n])
        start += n
    shape = (num_blocks, block_size, kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen)
    value_cache = torch.randn(shape, generator=gen)
    query = torch.randn(len(context_lens), kv_heads * group, head_dim, generator=gen)
    return query, key_cache, value_cache, tables, context_lens


def _run(kernel: CpuDecodeKernel, case: Case, num_threads: int | None = None) -> torch.Tensor:
    query, key_cache, value_cache, tables, lens = case
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64)
    context_lens = torch.tensor(lens, dtype=torch.int64)
    return kernel.paged_decode(
        query, key_cache, value_cache, padded, context_lens, num_threads=num_threads
    )


def _expected(case: Case) -> torch.Tensor:
    query, key_cache, value_cache, tables, lens = case
    return _reference(query, key_cache, value_cache, [1] * len(lens), lens, tables)


RAGGED = [1, 5, 16, 17, 64, 65, 130, 2]  # one chunk, several chunks, block boundaries


@pytest.mark.parametrize("block_size", [1, 2, 3, 7, 16, 256])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_kernel_matches_reference_over_block_sizes_and_gqa(
    kernel: CpuDecodeKernel, block_size: int, group: int
) -> None:
    case = _case(block_size * 10 + group, block_size, group, RAGGED)
    torch.testing.assert_close(_run(kernel, case).double(), _expected(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [8, 16, 24, 32, 64, 80, 128])
def test_kernel_matches_reference_over_head_sizes(kernel: CpuDecodeKernel, head_dim: int) -> None:
    case = _case(head_dim, 16, 4, [3, 70, 129], head_dim=head_dim)
    torch.testing.assert_close(_run(kernel, case).double(), _expected(case), atol=1e-5, rtol=1e-5)


def test_kernel_batch_of_one_long_context(kernel: CpuDecodeKernel) -> None:
    case = _case(1, 16, 4, [1000], head_dim=64)
    torch.testing.assert_close(_run(kernel, case).double(), _expected(case), atol=1e-5, rtol=1e-5)


def test_kernel_large_ragged_batch(kernel: CpuDecodeKernel) -> None:
    lens = [1 + (37 * i * i) % 300 for i in range(48)]
    case = _case(2, 16, 2, lens, kv_heads=4, head_dim=32)
    torch.testing.assert_close(_run(kernel, case).double(), _expected(case), atol=1e-5, rtol=1e-5)


def test_kernel_softmax_is_stable_for_large_scores(kernel: CpuDecodeKernel) -> None:
    query, key_cache, value_cache, tables, lens = _case(3, 4, 2, [1, 9, 200])
    case = (query * 300.0, key_cache, value_cache, tables, lens)  # scores in the thousands
    out = _run(kernel, case)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _expected(case), atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.integers(1, 20),
    group=st.sampled_from([1, 2, 3, 4, 8]),
    head_dim=st.sampled_from([4, 16, 20, 32, 64]),
    lens=st.lists(st.integers(1, 150), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_reference_on_random_shapes(
    kernel: CpuDecodeKernel, block_size: int, group: int, head_dim: int, lens: list[int], seed: int
) -> None:
    case = _case(seed, block_size, group, lens, head_dim=head_dim)
    torch.testing.assert_close(_run(kernel, case).double(), _expected(case), atol=1e-5, rtol=1e-5)


def test_kernel_output_is_bitwise_deterministic_whatever_the_thread_count(
    kernel: CpuDecodeKernel,
) -> None:
    case = _case(4, 16, 4, [1 + (13 * i) % 250 for i in range(24)], head_dim=64)
    first = _run(kernel, case)
    assert torch.equal(first, _run(kernel, case))
    assert torch.equal(first, _run(kernel, case, num_threads=1))
    assert torch.equal(first, _run(kernel, case, num_threads=3))


def test_kernel_propagates_nan_like_torch(kernel: CpuDecodeKernel) -> None:
    query, key_cache, value_cache, tables, lens = _case(5, 4, 2, [10, 10])
    value_cache[tables[0][1], 2, 0] = float("nan")  # token 6 of sequence 0, kv head 0
    out = _run(kernel, (query, key_cache, value_cache, tables, lens))
    assert out[0, :2].isnan().all()  # the query heads of kv head 0
    assert not out[0, 2:].isnan().any() and not out[1].isnan().any()


def test_kernel_refuses_bad_inputs(kernel: CpuDecodeKernel) -> None:
    query, key_cache, value_cache, tables, lens = _case(6, 4, 2, [5, 3])
    good = torch.tensor([t + [0] * (2 - len(t)) for t in tables], dtype=torch.int64)
    ctx = torch.tensor(lens, dtype=torch.int64)
    with pytest.raises(IndexError, match="outside the pool"):
        bad = good.clone()
        bad[0, 1] = key_cache.shape[0]
        kernel.paged_decode(query, key_cache, value_cache, bad, ctx)
    with pytest.raises(IndexError, match="context length"):
        kernel.paged_decode(query, key_cache, value_cache, good, torch.tensor([5, 0]))
    with pytest.raises(ValueError, match=r"value_cache must be a contiguous CPU torch\.float32"):
        kernel.paged_decode(query, key_cache, value_cache.half(), good, ctx)
    with pytest.raises(ValueError, match="query"):
        kernel.paged_decode(query.transpose(0, 1), key_cache, value_cache, good, ctx)


# --- the kernel inside decode_attention ------------------------------------------------------


def _metadata(
    case: Case, backend: engine.torch_engine.attention.DecodeBackend
) -> engine.torch_engine.attention.AttentionMetadata:
    _, key_cache, _, tables, lens = case
    block_size = key_cache.shape[1]
    return build_attention_metadata(
        query_lens=[1] * len(lens),
        context_lens=lens,
        block_tables=tables,
        slot_mapping=[
            t[(c - 1) // block_size] * block_size + (c - 1) % block_size
            for t, c in zip(tables, lens)
        ],
        block_size=block_size,
        decode_backend=backend,
    )


def test_kernel_and_torch_paths_agree(kernel: CpuDecodeKernel) -> None:
    case = _case(7, 16, 4, [1 + (29 * i * i) % 400 for i in range(40)], head_dim=32)
    query, key_cache, value_cache, _, _ = case
    via_kernel = _metadata(case, "auto")
    via_torch = _metadata(case, "torch")
    assert via_kernel.decode_backend == "cpu_kernel" and via_kernel.decode_groups == ()
    assert via_torch.decode_backend == "torch" and via_torch.decode_groups
    torch.testing.assert_close(
        decode_attention(query, key_cache, value_cache, via_kernel),
        decode_attention(query, key_cache, value_cache, via_torch),
        atol=1e-5,
        rtol=1e-5,
    )


def test_kernel_path_refuses_autograd(kernel: CpuDecodeKernel) -> None:
    case = _case(8, 4, 2, [3])
    query, key_cache, value_cache, _, _ = case
    with pytest.raises(ValueError, match="no backward"):
        decode_attention(query.requires_grad_(), key_cache, value_cache, _metadata(case, "auto"))


def test_backend_choice_falls_back_to_torch_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case(9, 4, 2, [3, 6])
    one_half_step = dict(
        query_lens=[1],
        context_lens=[3],
        block_tables=[[0]],
        slot_mapping=[2],
        block_size=4,
        dtype=torch.float16,
    )
    assert build_attention_metadata(**one_half_step).decode_backend == "torch"
    with pytest.raises(ValueError, match="float32 on CPU"):
        build_attention_metadata(**one_half_step, decode_backend="cpu_kernel")
    with pytest.raises(ValueError, match="expected 'auto', 'torch' or 'cpu_kernel'"):
        _metadata(case, "gpu")  # type: ignore[arg-type]
    missing = CpuDecodeStatus(None, "no C compiler found ($CC, cc, gcc or clang)")
    monkeypatch.setattr(engine.torch_engine.attention, "load_cpu_decode", lambda: missing)
    assert _metadata(case, "auto").decode_backend == "torch"
    with pytest.raises(CpuKernelUnavailableError, match="no C compiler found"):
        _metadata(case, "cpu_kernel")


# --- building and caching --------------------------------------------------------------------


def test_no_compiler_or_disabled_leaves_the_kernel_out(monkeypatch: pytest.MonkeyPatch) -> None:
    build = load_cpu_decode.__wrapped__  # uncached
    monkeypatch.setenv("KVSIM_CPU_KERNEL", "0")
    assert build() == CpuDecodeStatus(None, "disabled by KVSIM_CPU_KERNEL=0")
    monkeypatch.delenv("KVSIM_CPU_KERNEL")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    assert build() == CpuDecodeStatus(None, "no C compiler found ($CC, cc, gcc or clang)")


def test_failed_build_says_why_and_leaves_no_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    compiler = tmp_path / "broken-cc"
    compiler.write_text("#!/bin/sh\necho 'broken-cc: cannot compile' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    status = load_cpu_decode.__wrapped__()
    assert status.kernel is None and status.reason is not None
    assert "failed (exit 1): broken-cc: cannot compile" in status.reason
    assert list((tmp_path / "cache").iterdir()) == []


def test_build_is_cached_on_disk(
    kernel: CpuDecodeKernel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    first = load_cpu_decode.__wrapped__()
    assert first.kernel is not None, first.reason
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.kernel.path.name]
    mtime = first.kernel.path.stat().st_mtime_ns
    second = load_cpu_decode.__wrapped__()  # found, not rebuilt
    assert second.kernel is not None and second.kernel.path == first.kernel.path
    assert first.kernel.path.stat().st_mtime_ns == mtime
