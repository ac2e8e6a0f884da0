"""Paged attention (K/V read through block tables) vs dense SDPA on contiguous K/V.

Every sequence of the batch computes its last `--chunk` tokens of `--context` (1: a decode; more:
a prefill chunk over `context - chunk` cached tokens, as vLLM v1 schedules it), with the same
shapes on every side. The dense side reads K/V stored contiguously as [batch, kv_heads,
context, head_dim] (the best case for torch's SDPA; bottom-right causal for a chunk), the paged
sides read them from a pool of shuffled physical blocks through both backends: "torch" (gather,
then SDPA) and "cpu_kernel" (engine/torch_engine/cpu_decode.py's C kernel, the engine's choice on
CPU in float32; skipped where it is unavailable).
The sides are timed in turns, so machine noise hits them alike. Prints the median time per call
and the ratios paged / dense (target <= 1.5 for the backend the engine uses).

    python benchmarks/bench_paged_attention.py [--device cuda] [--batch 32 --context 1024]
    python benchmarks/bench_paged_attention.py --batch 1 --chunk 64 --context 2048
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from engine.torch_engine.attention import (
    AttentionMetadata,
    DecodeBackend,
    GatherWorkspace,
    build_attention_metadata,
    prefill_attention,
)
from engine.torch_engine.cpu_decode import load_cpu_decode
from engine.torch_engine.loader import resolve_dtype


def _median_seconds(
    fns: dict[str, Callable[[], object]], device: str, repeats: int, iters: int
) -> dict[str, float]:
    """Per function, the median over `repeats` of the mean seconds per call of `iters` calls
    (after a warm-up); each repeat times every function in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(3):
            fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / iters)
    return {name: statistics.median(t) for name, t in times.items()}


def _paged_pool(
    k_dense: torch.Tensor, v_dense: torch.Tensor, block_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """The dense K/V [B, KVH, L, D] scattered over shuffled physical blocks: (K, V, tables)."""
    batch, kv_heads, ctx, dim = k_dense.shape
    blocks_per_seq = -(-ctx // block_size)
    num_blocks = batch * blocks_per_seq
    order = torch.randperm(num_blocks, generator=gen)
    shape = (num_blocks, block_size, kv_heads, dim)
    k_cache = torch.zeros(shape, dtype=k_dense.dtype, device=k_dense.device)
    v_cache = torch.zeros_like(k_cache)
    pad = blocks_per_seq * block_size - ctx
    for cache, dense in ((k_cache, k_dense), (v_cache, v_dense)):
        tokens = F.pad(dense.transpose(1, 2), (0, 0, 0, 0, 0, pad))  # [B, nb*bs, KVH, D]
        cache[order.to(k_dense.device)] = tokens.reshape(shape)
    return k_cache, v_cache, order.view(batch, blocks_per_seq).tolist()


def _dense_attention(
    query: torch.Tensor, k_dense: torch.Tensor, v_dense: torch.Tensor, chunk: int
) -> Callable[[], torch.Tensor]:
    """SDPA on the contiguous K/V [B, KVH, L, D]: query [B * chunk, H, D] -> [B * chunk, H, D].

    A decode folds the query heads of each kv head into query rows ([B, KVH, G, D]: no K/V
    copy); a chunk is bottom-right causal with K/V shared by each GQA group (enable_gqa)."""
    batch, kv_heads, ctx, dim = k_dense.shape
    heads = query.shape[1]
    if chunk == 1:
        q_folded = query.view(batch, kv_heads, heads // kv_heads, dim)
        return lambda: F.scaled_dot_product_attention(q_folded, k_dense, v_dense).view(
            batch, heads, dim
        )
    q = query.view(batch, chunk, heads, dim).transpose(1, 2)  # [B, H, n, D]
    mask = causal_lower_right(chunk, ctx)

    def dense() -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k_dense, v_dense, attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch * chunk, heads, dim)

    return dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=1, help="new tokens per sequence (1: decode)")
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

    chunk = args.chunk
    if not 1 <= chunk <= ctx:
        parser.error(f"--chunk {chunk} must be in 1..--context {ctx}")
    k_dense = torch.randn(batch, kv_heads, ctx, dim, generator=gen).to(device, dtype)
    v_dense = torch.randn(batch, kv_heads, ctx, dim, generator=gen).to(device, dtype)
    query = torch.randn(batch * chunk, heads, dim, generator=gen).to(device, dtype)  # [T, H, D]
    key = k_dense[:, :, ctx - chunk :].transpose(1, 2).reshape(batch * chunk, kv_heads, dim)
    value = v_dense[:, :, ctx - chunk :].transpose(1, 2).reshape(batch * chunk, kv_heads, dim)
    k_cache, v_cache, tables = _paged_pool(k_dense, v_dense, bs, gen)
    dense_fn = _dense_attention(query, k_dense, v_dense, chunk)

    def metadata(backend: DecodeBackend) -> AttentionMetadata:
        return build_attention_metadata(
            query_lens=[chunk] * batch,
            context_lens=[ctx] * batch,
            block_tables=tables,
            slot_mapping=[
                t[p // bs] * bs + p % bs for t in tables for p in range(ctx - chunk, ctx)
            ],
            block_size=bs,
            device=device,
            dtype=dtype,
            workspace=GatherWorkspace(),  # as the engine does
            decode_backend=backend,
        )

    metas = {"torch": metadata("torch"), "cpu_kernel": metadata("auto")}
    if metas["cpu_kernel"].decode_backend != "cpu_kernel":
        del metas["cpu_kernel"]
    fns: dict[str, Callable[[], object]] = {"dense": dense_fn}
    for name, meta in metas.items():
        fns[name] = lambda meta=meta: prefill_attention(query, key, value, k_cache, v_cache, meta)
    with torch.inference_mode():
        dense_out = dense_fn()
        for meta in metas.values():
            paged_out = prefill_attention(query, key, value, k_cache, v_cache, meta)
            torch.testing.assert_close(paged_out, dense_out, atol=1e-4, rtol=1e-4)
        seconds = _median_seconds(fns, device, args.repeats, args.iters)

    what = "decode" if chunk == 1 else f"prefill-chunk ({chunk} new tokens per sequence)"
    print(
        f"{what} attention on {device} ({args.dtype}, threads={torch.get_num_threads()}): "
        f"batch={batch} context={ctx} heads={heads} kv_heads={kv_heads} head_dim={dim} "
        f"block_size={bs}; median of {args.repeats} x {args.iters} calls"
    )
    dense_s = seconds.pop("dense")
    print(f"  dense SDPA, contiguous K/V : {dense_s * 1e6:9.1f} us/call")
    for name, paged_s in seconds.items():
        ratio = paged_s / dense_s
        print(
            f"  paged, {name:<10} backend : {paged_s * 1e6:9.1f} us/call  paged/dense {ratio:5.2f}"
        )
    if "cpu_kernel" not in metas and device == "cpu":
        print(f"  (cpu_kernel unavailable: {load_cpu_decode().reason})")
    engine_uses = "cpu_kernel" if "cpu_kernel" in metas else "torch"
    print(f"  target: paged/dense <= 1.5 for the {engine_uses} backend (the engine's choice here)")


if __name__ == "__main__":
    main()
