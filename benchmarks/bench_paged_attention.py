"""Decode attention: paged (K/V gathered through block tables) vs dense SDPA on contiguous K/V.

Both sides attend one query token per sequence to `--context` keys with the same shapes; the
dense side reads K/V stored contiguously as [batch, kv_heads, context, head_dim] (the best case
for torch's SDPA), the paged side reads them from a pool of shuffled physical blocks.
Prints the median time per call over several repeats and the ratio paged / dense (target <= 1.5).

    python benchmarks/bench_paged_attention.py [--device cuda] [--batch 32 --context 1024]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.attention import GatherWorkspace, build_attention_metadata, decode_attention
from engine.loader import resolve_dtype


def _median_seconds(fn: Callable[[], object], device: str, repeats: int, iters: int) -> float:
    """Median over `repeats` of the mean seconds per call of `iters` calls (after a warm-up)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = args.device, resolve_dtype(args.dtype)
    batch, ctx, bs = args.batch, args.context, args.block_size
    heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    gen = torch.Generator().manual_seed(0)

    # dense: contiguous K/V [B, KVH, L, D], queries folded per KV group [B, KVH, G, D]
    k_dense = torch.randn(batch, kv_heads, ctx, dim, generator=gen).to(device, dtype)
    v_dense = torch.randn(batch, kv_heads, ctx, dim, generator=gen).to(device, dtype)
    query = torch.randn(batch, heads, dim, generator=gen).to(device, dtype)
    q_dense = query.view(batch, kv_heads, heads // kv_heads, dim)

    # paged: the same K/V scattered over shuffled physical blocks
    blocks_per_seq = -(-ctx // bs)
    num_blocks = batch * blocks_per_seq
    order = torch.randperm(num_blocks, generator=gen)
    tables = order.view(batch, blocks_per_seq).tolist()
    k_cache = torch.zeros(num_blocks, bs, kv_heads, dim, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    pad = blocks_per_seq * bs - ctx
    for cache, dense in ((k_cache, k_dense), (v_cache, v_dense)):
        tokens = F.pad(dense.transpose(1, 2), (0, 0, 0, 0, 0, pad))  # [B, nb*bs, KVH, D]
        cache[order.to(device)] = tokens.reshape(num_blocks, bs, kv_heads, dim)
    meta = build_attention_metadata(
        query_lens=[1] * batch,
        context_lens=[ctx] * batch,
        block_tables=tables,
        slot_mapping=[t[(ctx - 1) // bs] * bs + (ctx - 1) % bs for t in tables],
        block_size=bs,
        device=device,
        dtype=dtype,
        workspace=GatherWorkspace(),  # as the engine does
    )

    with torch.inference_mode():
        dense_out = F.scaled_dot_product_attention(q_dense, k_dense, v_dense)
        paged_out = decode_attention(query, k_cache, v_cache, meta)
        torch.testing.assert_close(paged_out, dense_out.reshape(batch, heads, dim))
        dense_s = _median_seconds(
            lambda: F.scaled_dot_product_attention(q_dense, k_dense, v_dense),
            device,
            args.repeats,
            args.iters,
        )
        paged_s = _median_seconds(
            lambda: decode_attention(query, k_cache, v_cache, meta),
            device,
            args.repeats,
            args.iters,
        )
    print(
        f"decode attention on {device} ({args.dtype}, threads={torch.get_num_threads()}): "
        f"batch={batch} context={ctx} heads={heads} kv_heads={kv_heads} head_dim={dim}"
    )
    print(f"  dense SDPA, contiguous K/V: {dense_s * 1e6:9.1f} us/call (median of {args.repeats})")
    print(f"  paged, block_size={bs:<3}    : {paged_s * 1e6:9.1f} us/call")
    print(f"  ratio paged / dense       : {paged_s / dense_s:9.2f}  (target <= 1.5)")


if __name__ == "__main__":
    main()
