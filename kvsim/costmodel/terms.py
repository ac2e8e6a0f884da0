"""The fitted step-time terms: roofline physics per operator, with the latency floors, tile
quantisation and thread-block waves that measured kernels show (formulas: docs/costmodel.md).

Every function takes numpy arrays (or scalars) and returns seconds for ONE layer on ONE GPU, except
all-reduce (one call). The fitter evaluates these same functions, so what is fitted is exactly what
the simulator prices.
"""

from __future__ import annotations

import numpy as np

from kvsim.costmodel.coefficients import (
    AllReduceCoefficients,
    DecodeAttentionCoefficients,
    ElementwiseCoefficients,
    GemmCoefficients,
    PrefillAttentionCoefficients,
    StepCoefficients,
)
from kvsim.costmodel.custom_allreduce import custom_allreduce_time
from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.layer_shapes import (
    ELEMENTWISE_OPS,
    GEMM_OPS,
    LINEAR_OPS,
    LayerShapes,
    layer_ops,
)
from kvsim.costmodel.moe import MOE_BLOCK_ROWS, MoEShapes, expected_experts_touched
from kvsim.costmodel.specio import CostModelError

Array = np.ndarray | float | int

# FlashAttention splits a decode context across thread blocks when (sequence, KV head) blocks
# fill less than this fraction of the SMs (flash_fwd_launch_template.h, num_splits_heuristic).
SPLIT_KV_OCCUPANCY = 0.8


def operand_bytes(
    weights: Array, inputs: Array, outputs: Array, dtype_bytes: Array, weight_bytes: int | None
) -> Array:
    """Bytes a GEMM moves: ``weights`` weight, ``inputs`` input and ``outputs`` output
    elements at ``dtype_bytes``, or the weights at ``weight_bytes`` where that differs (FP8
    experts). The equal case keeps the one-product form, summed in the same order, so a model
    without narrow weights gets the same bits as before ``weight_bytes`` existed."""
    if weight_bytes is None or weight_bytes == dtype_bytes:
        return (weights + inputs + outputs) * dtype_bytes
    return weights * weight_bytes + (inputs + outputs) * dtype_bytes


def gemm_time(
    co: GemmCoefficients,
    gpu: GPUSpec,
    m: Array,
    k: Array,
    n: Array,
    dtype_bytes: Array,
    *,
    weight_bytes: int | None = None,
) -> np.ndarray:
    """(m x k) @ (k x n): floor + max(operand bytes / bandwidth, tiled FLOPs / FLOP rate).

    ``weight_bytes``: bytes of one (k x n) weight when narrower than ``dtype_bytes`` (FP8);
    FLOPs stay priced at the GPU's bf16 peak (no FP8 tensor-core rate is modelled)."""
    m = np.asarray(m, dtype=float)
    moved = operand_bytes(k * n, m * k, m * n, dtype_bytes, weight_bytes)
    memory = moved / (gpu.hbm_bandwidth * co.bw_efficiency)
    tile = co.m_tile_tokens
    rows = np.ceil(m / tile) * tile + co.m_half_tokens
    compute = 2.0 * k * n * rows / (gpu.peak_flops * co.flops_efficiency)
    return co.latency_s + np.maximum(memory, compute)


def elementwise_time(
    co: ElementwiseCoefficients, gpu: GPUSpec, m: Array, bytes_per_token: Array
) -> np.ndarray:
    """A memory-bound kernel over m tokens."""
    m = np.asarray(m, dtype=float)
    return co.latency_s + m * bytes_per_token / (gpu.hbm_bandwidth * co.bw_efficiency)


def linear_op_times(
    co: StepCoefficients, gpu: GPUSpec, shapes: LayerShapes, num_tokens: Array
) -> dict[str, np.ndarray]:
    """Each non-attention operator of one layer for ``num_tokens`` tokens (s): the nine of
    LINEAR_OPS, or for an MoE layer ``layer_ops(shapes)`` (its MLP priced by moe_op_times)."""
    times: dict[str, np.ndarray] = {}
    for op, (k, n) in shapes.gemm_shapes().items():
        times[op] = gemm_time(co.gemm, gpu, num_tokens, k, n, shapes.dtype_bytes)
    for op, per_token in shapes.elementwise_bytes_per_token().items():
        times[op] = elementwise_time(co.elementwise(op), gpu, num_tokens, per_token)
    assert set(times) == set(GEMM_OPS) | set(ELEMENTWISE_OPS) == set(LINEAR_OPS)
    if shapes.moe is not None:
        for op in ("mlp_up_proj", "mlp_act", "mlp_down_proj"):
            del times[op]
        times.update(moe_op_times(co, gpu, shapes.moe, num_tokens))
        assert set(times) == set(layer_ops(shapes))
    return times


def linear_layer_time(
    co: StepCoefficients, gpu: GPUSpec, shapes: LayerShapes, num_tokens: Array
) -> np.ndarray:
    """Sum of the layer's operators (fixed order, so every caller gets the same bits)."""
    times = linear_op_times(co, gpu, shapes, num_tokens)
    ops = layer_ops(shapes)
    total = times[ops[0]]
    for op in ops[1:]:
        total = total + times[op]
    return total


def grouped_gemm_time(
    co: GemmCoefficients,
    gpu: GPUSpec,
    routed_rows: Array,
    experts: Array,
    k: int,
    n: int,
    dtype_bytes: int,
    *,
    weight_bytes: int | None = None,
) -> np.ndarray:
    """One grouped GEMM (vLLM's fused MoE kernel, one launch): ``routed_rows`` token copies,
    each multiplied by its expert's (k x n) matrix, spread evenly over ``experts`` experts.

    The fitted GEMM term with the weights of the experts touched read once each (at
    ``weight_bytes`` each where given), and each expert's rows padded to whole MOE_BLOCK_ROWS
    blocks (moe_align_block_size)."""
    rows = np.asarray(routed_rows, dtype=float)
    touched = np.asarray(experts, dtype=float)
    memory = operand_bytes(touched * k * n, rows * k, rows * n, dtype_bytes, weight_bytes)
    memory = memory / (gpu.hbm_bandwidth * co.bw_efficiency)
    per_expert = rows / np.maximum(touched, 1e-12)
    padded = touched * np.ceil(per_expert / MOE_BLOCK_ROWS) * MOE_BLOCK_ROWS + co.m_half_tokens
    compute = 2.0 * k * n * padded / (gpu.peak_flops * co.flops_efficiency)
    return np.asarray(co.latency_s + np.maximum(memory, compute), dtype=np.float64)


def moe_op_times(
    co: StepCoefficients, gpu: GPUSpec, moe: MoEShapes, num_tokens: Array
) -> dict[str, np.ndarray]:
    """The operators of one MoE MLP for ``num_tokens`` tokens (s), MOE_OPS then (with a shared
    expert) SHARED_EXPERT_OPS. Expected counts under uniform routing: ``num_tokens * top_k``
    routed rows over ``expected_experts_touched`` experts."""
    tokens = np.asarray(num_tokens, dtype=float)
    h, d, k, w = moe.hidden_size, moe.dtype_bytes, moe.top_k, moe.weight_bytes
    rows = tokens * k
    touched = np.asarray(expected_experts_touched(moe.num_experts, k, tokens))
    add = co.elementwise("add")
    times = {
        # Replicated router: every token's logits over all experts.
        "moe_router": gemm_time(co.gemm, gpu, tokens, h, moe.num_experts, d),
        # topk-softmax over the logits, then the sort into expert groups (a second launch).
        "moe_routing": elementwise_time(add, gpu, tokens, moe.num_experts * d + 2 * k * 4)
        + add.latency_s,
        "moe_up_proj": grouped_gemm_time(
            co.gemm, gpu, rows, touched, h, moe.expert_up_width, d, weight_bytes=w
        ),
        "moe_act": elementwise_time(
            co.elementwise("mlp_act"), gpu, rows, (moe.expert_up_width + moe.expert_width) * d
        ),
        "moe_down_proj": grouped_gemm_time(
            co.gemm, gpu, rows, touched, moe.expert_width, h, d, weight_bytes=w
        ),
        # Each token's k expert outputs, weighted and summed.
        "moe_combine": elementwise_time(add, gpu, tokens, (k + 1) * h * d),
    }
    if moe.shared_width:
        times["shared_up_proj"] = gemm_time(
            co.gemm, gpu, tokens, h, moe.shared_up_width, d, weight_bytes=w
        )
        times["shared_act"] = elementwise_time(
            co.elementwise("mlp_act"), gpu, tokens, (moe.shared_up_width + moe.shared_width) * d
        )
        times["shared_down_proj"] = gemm_time(
            co.gemm, gpu, tokens, moe.shared_width, h, d, weight_bytes=w
        )
        times["shared_gate"] = gemm_time(co.gemm, gpu, tokens, h, 1, d)
    return times


def lm_head_time(
    co: StepCoefficients,
    gpu: GPUSpec,
    hidden_size: int,
    vocab_per_gpu: int,
    num_seqs: Array,
    dtype_bytes: int,
) -> np.ndarray:
    """Logits of each sequence's last position: one more GEMM, priced by the fitted GEMM term."""
    return gemm_time(co.gemm, gpu, num_seqs, hidden_size, vocab_per_gpu, dtype_bytes)


def decode_attention_time(
    co: DecodeAttentionCoefficients,
    gpu: GPUSpec,
    num_sms: int,
    shapes: LayerShapes,
    batch_size: Array,
    context_len: Array,
) -> np.ndarray:
    """Paged decode attention, one layer: ``batch_size`` seqs of ``context_len`` tokens (mean).

    One thread block per (sequence, KV head). Fewer blocks than SPLIT_KV_OCCUPANCY x SMs: the
    context is split so the GPU fills (one wave, plus the split's combine cost). Otherwise the
    blocks run in waves of num_sms, and a block cannot read faster than its share of the
    bandwidth.
    """
    b = np.asarray(batch_size, dtype=float)
    c = np.asarray(context_len, dtype=float)
    blocks = b * shapes.kv_heads_per_gpu
    split = blocks < SPLIT_KV_OCCUPANCY * num_sms
    splits = np.where(split, np.maximum(1.0, np.floor(num_sms / np.maximum(blocks, 1.0))), 1.0)
    waves = np.where(split, 1.0, np.ceil(blocks / num_sms))
    per_token = shapes.kv_bytes_per_token_per_kv_head
    bandwidth = b * c * shapes.kv_heads_per_gpu * per_token / (gpu.hbm_bandwidth * co.bw_efficiency)
    block_rate = co.sm_bandwidth_share * gpu.hbm_bandwidth / num_sms
    per_block = waves * (c / splits) * per_token / block_rate
    time = (
        co.latency_s
        + co.split_latency_s * split
        + co.wave_latency_s * (waves - 1.0)
        + np.maximum(bandwidth, per_block)
    )
    return np.asarray(time, dtype=np.float64)


def prefill_attention_time(
    co: PrefillAttentionCoefficients,
    gpu: GPUSpec,
    shapes: LayerShapes,
    causal_pairs: Array,
    cached_pairs: Array,
    cached_tokens: Array,
    new_tokens: Array,
) -> np.ndarray:
    """Prefill attention, one layer: sums over the step's prefill sequences of n(n+1)/2 (causal
    pairs), n*c (pairs against c cached tokens), c and n."""
    flops_per_pair = 4.0 * shapes.heads_per_gpu * shapes.head_dim  # QK^T and PV
    compute = (
        flops_per_pair
        * (
            np.asarray(causal_pairs, dtype=float) / co.causal_flops_efficiency
            + np.asarray(cached_pairs, dtype=float) / co.cached_flops_efficiency
        )
        / gpu.peak_flops
    )
    kv_bytes = shapes.kv_heads_per_gpu * shapes.kv_bytes_per_token_per_kv_head
    context = (
        np.asarray(cached_tokens, dtype=float)
        * kv_bytes
        / (gpu.hbm_bandwidth * co.context_bw_efficiency)
    )
    return co.latency_s + compute + context + co.per_token_s * np.asarray(new_tokens, dtype=float)


def allreduce_time(
    co: AllReduceCoefficients, gpu: GPUSpec, num_workers: int, size_bytes: Array
) -> np.ndarray:
    """One all-reduce of ``size_bytes`` over ``num_workers`` GPUs: the engine's custom kernel
    where ``co.custom`` takes the message (a serving stack's), else the fastest NCCL protocol.

    A worker count with no NCCL fit uses the nearest fitted one below it (else the smallest),
    with the ring factor 2(w-1)/w of the real count.
    """
    size = np.asarray(size_bytes, dtype=float)
    if num_workers <= 1:
        return np.zeros_like(size)
    fitted = sorted(co.by_num_workers)
    if not fitted:
        raise CostModelError(
            f"the {gpu.name} coefficients have no all-reduce fit (system {co.system!r}): "
            f"tp must be 1, got {num_workers}"
        )
    below = [w for w in fitted if w <= num_workers]
    protocols = co.by_num_workers[below[-1] if below else fitted[0]]
    ring = 2.0 * (num_workers - 1) / num_workers * size / gpu.interconnect_bandwidth
    best = protocols[0].latency_s + ring / protocols[0].bw_efficiency
    for protocol in protocols[1:]:
        best = np.minimum(best, protocol.latency_s + ring / protocol.bw_efficiency)
    if co.custom is None:
        return best
    custom, taken = custom_allreduce_time(co.custom, gpu.interconnect_bandwidth, num_workers, size)
    return np.where(taken, custom, best)
