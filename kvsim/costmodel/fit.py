"""Fit one GPU's step-time coefficients from measured profiles, on relative error.

Terms that are linear in their coefficients (elementwise operators, prefill attention) are fitted
by non-negative least squares on relative error: each row is divided by its measured time, so a
4 µs kernel counts as much as a 4 ms one, and efficiencies are constrained to at most 1 by fitting
``1/efficiency = 1 + a`` with ``a >= 0``. Terms with a max() or a ceil() (GEMMs, decode attention,
all-reduce) are fitted by bounded nonlinear least squares (scipy ``least_squares``, trust-region)
on the same relative residuals with a soft-L1 loss: residuals beyond ~5% count linearly, so a
kernel-selection spike at one token count does not drag the whole curve. GEMM coefficients are
fitted on the error of the nine-operator sum, the quantity ``linear_time_s`` predicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from kvsim.costmodel.coefficients import (
    AllReduceCoefficients,
    AllReduceProtocol,
    DecodeAttentionCoefficients,
    ElementwiseCoefficients,
    GemmCoefficients,
    PrefillAttentionCoefficients,
)
from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.layer_shapes import ELEMENTWISE_OPS, GEMM_OPS, LINEAR_OPS, LayerShapes
from kvsim.costmodel.profile_checks import ProfileError
from kvsim.costmodel.terms import (
    allreduce_time,
    decode_attention_time,
    elementwise_time,
    gemm_time,
)

M_TILE_CANDIDATES = (1, 16, 32, 64, 128, 256)
_SOFT_L1_SCALE = 0.05  # relative error beyond which a residual counts linearly


class FitError(ProfileError):
    """Profiles that cannot determine a coefficient (too few rows, or no rows of a kind)."""


def _relative_nnls(features: np.ndarray, measured: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """argmin_{x >= 0} sum(((fixed + features @ x) / measured - 1)^2)."""
    a = features / measured[:, None]
    b = 1.0 - fixed / measured
    x, _ = nnls(a, b, maxiter=50 * a.shape[1])
    return np.asarray(x, dtype=np.float64)


def _robust_fit(
    residuals: Callable[[np.ndarray], np.ndarray],
    starts: Sequence[Sequence[float]],
    lower: Sequence[float],
    upper: Sequence[float],
) -> np.ndarray:
    """Best of several bounded soft-L1 least-squares fits (by mean absolute residual)."""
    best: tuple[float, np.ndarray] | None = None
    for start in starts:
        x0 = np.clip(np.asarray(start, dtype=float), lower, upper)
        result = least_squares(
            residuals, x0, bounds=(lower, upper), loss="soft_l1", f_scale=_SOFT_L1_SCALE
        )
        score = float(np.mean(np.abs(residuals(result.x))))
        if best is None or score < best[0]:
            best = (score, result.x)
    assert best is not None
    return best[1]


def _require_rows(frame: pd.DataFrame, minimum: int, what: str) -> None:
    if len(frame) < minimum:
        raise FitError(
            f"profiles: {len(frame)} rows of {what}, at least {minimum} are needed to fit it"
        )


# --- non-attention operators ---------------------------------------------------------------------


def fit_elementwise(
    compute: pd.DataFrame, gpu: GPUSpec, max_efficiency: float = 1.0
) -> dict[str, ElementwiseCoefficients]:
    """latency + tokens * bytes / (B * eff) per elementwise operator (NNLS on relative error)."""
    shapes = LayerShapes.from_frame(compute)
    tokens = compute["num_tokens"].to_numpy(dtype=float)
    fitted = {}
    for op, per_token in shapes.elementwise_bytes_per_token().items():
        fastest = tokens * per_token / (gpu.hbm_bandwidth * max_efficiency)  # at the cap
        measured = compute[op].to_numpy()
        # t = latency + fastest * (1 + a):  features [1, fastest], fixed part fastest.
        latency, extra = _relative_nnls(
            np.column_stack([np.ones_like(tokens), fastest]), measured, fastest
        )
        efficiency = max_efficiency / (1.0 + float(extra))
        fitted[op] = ElementwiseCoefficients(latency_s=float(latency), bw_efficiency=efficiency)
    return fitted


def _gemm_from(x: np.ndarray, tile: int) -> GemmCoefficients:
    return GemmCoefficients(
        latency_s=float(x[0]) * 1e-6,
        bw_efficiency=1.0 / float(x[1]),
        flops_efficiency=1.0 / float(x[2]),
        m_tile_tokens=tile,
        m_half_tokens=float(x[3]),
    )


def fit_gemm(
    compute: pd.DataFrame,
    gpu: GPUSpec,
    elementwise: dict[str, ElementwiseCoefficients],
    m_tiles: Sequence[int] = M_TILE_CANDIDATES,
    max_efficiency: float = 1.0,
) -> GemmCoefficients:
    """One GEMM term for the four weight GEMMs, fitted on the relative error of the layer sum."""
    shapes = LayerShapes.from_frame(compute)
    tokens = compute["num_tokens"].to_numpy(dtype=float)
    measured = compute[list(LINEAR_OPS)].sum(axis=1).to_numpy()
    fixed = np.zeros_like(measured)
    for op, per_token in shapes.elementwise_bytes_per_token().items():
        fixed = fixed + elementwise_time(elementwise[op], gpu, tokens, per_token)
    gemms = shapes.gemm_shapes()

    best: tuple[float, GemmCoefficients] | None = None
    for tile in m_tiles:

        def residuals(x: np.ndarray, tile: int = tile) -> np.ndarray:
            co = _gemm_from(x, tile)
            total = fixed.copy()
            for k, n in gemms.values():
                total += gemm_time(co, gpu, tokens, k, n, shapes.dtype_bytes)
            return np.asarray(total / measured - 1.0, dtype=np.float64)

        # x = [latency µs, 1/bw_eff, 1/flops_eff, m_half tokens]
        low = 1.0 / max_efficiency
        x = _robust_fit(
            residuals,
            [
                (5, 1.25 * low, 1.4 * low, 64),
                (2, 1.1 * low, 1.3 * low, 16),
                (8, 1.5 * low, 1.6 * low, 128),
            ],
            [0, low, low, 0],
            [1e4, 1e3, 1e3, 1e5],
        )
        score = float(np.mean(np.abs(residuals(x))))
        if best is None or score < best[0]:
            best = (score, _gemm_from(x, tile))
    assert best is not None
    return best[1]


def fit_linear(
    compute: pd.DataFrame, gpu: GPUSpec, *, max_tokens: int = 4096, max_efficiency: float = 1.0
) -> dict[str, GemmCoefficients | ElementwiseCoefficients]:
    """All non-attention coefficients from compute profiles (rows up to ``max_tokens``).

    max_efficiency: 1 for GPUs (datasheet peaks); a CPU's cache-resident operands run faster
    than its measured DRAM bandwidth, so CPU fits lift the cap (e.g. 100).
    """
    rows = compute[compute["num_tokens"] <= max_tokens]
    _require_rows(rows, 8, f"compute profiles up to {max_tokens} tokens")
    elementwise = fit_elementwise(rows, gpu, max_efficiency)
    return {"gemm": fit_gemm(rows, gpu, elementwise, max_efficiency=max_efficiency), **elementwise}


# --- attention -----------------------------------------------------------------------------------


def _decode_from(x: np.ndarray) -> DecodeAttentionCoefficients:
    return DecodeAttentionCoefficients(
        latency_s=float(x[0]) * 1e-6,
        split_latency_s=float(x[1]) * 1e-6,
        wave_latency_s=float(x[2]) * 1e-6,
        bw_efficiency=1.0 / float(x[3]),
        sm_bandwidth_share=float(x[4]),
    )


def fit_decode_attention(
    attention: pd.DataFrame, gpu: GPUSpec, num_sms: int, max_efficiency: float = 1.0
) -> DecodeAttentionCoefficients:
    """The decode attention term (bounded soft-L1 least squares on relative error)."""
    rows = attention[~attention["is_prefill"]]
    _require_rows(rows, 8, "decode attention")
    shapes = LayerShapes.from_frame(rows)
    batch, context = rows["batch_size"].to_numpy(), rows["context_len"].to_numpy()
    measured = rows["time_s"].to_numpy()

    def residuals(x: np.ndarray) -> np.ndarray:
        co = _decode_from(x)
        predicted = decode_attention_time(co, gpu, num_sms, shapes, batch, context)
        return np.asarray(predicted / measured - 1.0, dtype=np.float64)

    # x = [latency µs, split µs, wave µs, 1/bw_eff, SM bandwidth share]
    low = 1.0 / max_efficiency
    x = _robust_fit(
        residuals,
        [(8, 4, 3, 1.25 * low, 1.0), (12, 2, 6, 1.25 * low, 0.5), (5, 8, 8, 1.4 * low, 1.5)],
        [0, 0, 0, low, 1e-3],
        [1e4, 1e4, 1e4, 1e3, 1e3 * max_efficiency],
    )
    return _decode_from(x)


def fit_block_walk(
    attention: pd.DataFrame,
    gpu: GPUSpec,
    num_sms: int,
    decode: DecodeAttentionCoefficients,
    reference_block_size: int,
) -> float:
    """``block_walk_s`` from decode rows at several block sizes: each row's time is the decode
    term (fitted at ``reference_block_size``) plus block_walk_s per (block-table entry, KV
    head) beyond those of the reference size. NNLS on relative error."""
    rows = attention[~attention["is_prefill"]]
    _require_rows(rows, 8, "decode attention at several block sizes")
    shapes = LayerShapes.from_frame(rows)
    batch, context = rows["batch_size"].to_numpy(), rows["context_len"].to_numpy()
    block_size = rows["block_size"].to_numpy()
    kernels = decode_attention_time(decode, gpu, num_sms, shapes, batch, context)
    walked = batch * -(-context // block_size) - batch * context / reference_block_size
    feature = np.asarray(shapes.kv_heads_per_gpu * walked, dtype=np.float64)
    measured = rows["time_s"].to_numpy(dtype=np.float64)
    (walk,) = _relative_nnls(feature[:, None], measured, kernels)
    return float(walk)


def prefill_features(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per prefill row (one sequence): the sums prefill_attention_time takes."""
    n = rows["chunk_size"].to_numpy(dtype=float)
    c = rows["context_len"].to_numpy(dtype=float)
    return {
        "causal_pairs": n * (n + 1) / 2,
        "cached_pairs": n * c,
        "cached_tokens": c,
        "new_tokens": n,
    }


def fit_prefill_attention(
    attention: pd.DataFrame, gpu: GPUSpec, max_efficiency: float = 1.0
) -> PrefillAttentionCoefficients:
    """NNLS on relative error; every coefficient enters linearly (efficiencies at most
    ``max_efficiency``)."""
    rows = attention[attention["is_prefill"]]
    _require_rows(rows, 8, "prefill attention")
    shapes = LayerShapes.from_frame(rows)
    f = prefill_features(rows)
    # Times at the efficiency cap; 1/eff = (1 + a) / cap with a >= 0 keeps eff <= cap.
    flops_per_pair = (
        4.0 * shapes.heads_per_gpu * shapes.head_dim / (gpu.peak_flops * max_efficiency)
    )
    kv_read = (
        shapes.kv_heads_per_gpu
        * shapes.kv_bytes_per_token_per_kv_head
        / (gpu.hbm_bandwidth * max_efficiency)
    )
    peak = [
        f["causal_pairs"] * flops_per_pair,
        f["cached_pairs"] * flops_per_pair,
        f["cached_tokens"] * kv_read,
    ]
    fixed = peak[0] + peak[1] + peak[2]  # each at the cap; NNLS adds the shortfall
    features = np.column_stack([np.ones_like(fixed), *peak, f["new_tokens"]])
    latency, causal, cached, context, per_token = _relative_nnls(
        features, rows["time_s"].to_numpy(), fixed
    )
    return PrefillAttentionCoefficients(
        latency_s=float(latency),
        causal_flops_efficiency=max_efficiency / (1.0 + float(causal)),
        cached_flops_efficiency=max_efficiency / (1.0 + float(cached)),
        context_bw_efficiency=max_efficiency / (1.0 + float(context)),
        per_token_s=float(per_token),
    )


# --- all-reduce ----------------------------------------------------------------------------------


def single_node_rows(allreduce: pd.DataFrame, system: str) -> pd.DataFrame:
    """Rows of ``system`` with every worker in one node (tensor parallelism never leaves a node)."""
    rows = allreduce[
        (allreduce["system"] == system)
        & (allreduce["num_workers"] == allreduce["devices_per_node"])
    ]
    return rows[rows["num_workers"] >= 2]


def _fit_protocols(
    gpu: GPUSpec, workers: int, size: np.ndarray, measured: np.ndarray, num_protocols: int
) -> tuple[AllReduceProtocol, ...]:
    """``num_protocols`` (latency, bandwidth) lines whose minimum fits ``measured``."""

    def build(x: np.ndarray) -> AllReduceCoefficients:
        protocols = tuple(
            AllReduceProtocol(
                latency_s=float(x[2 * i]) * 1e-6, bw_efficiency=1.0 / float(x[2 * i + 1])
            )
            for i in range(num_protocols)
        )
        return AllReduceCoefficients(system="fit", by_num_workers={workers: protocols})

    def residuals(x: np.ndarray) -> np.ndarray:
        predicted = allreduce_time(build(x), gpu, workers, size)
        return np.asarray(predicted / measured - 1.0, dtype=np.float64)

    # x = [latency µs, 1/efficiency] per protocol; starts spread small to large latencies.
    base_starts = [(10, 4, 60, 1.5), (30, 3, 100, 1.3), (40, 2, 200, 1.1)]
    starts = [
        tuple(float(s[i % 4] * (1 + i // 4)) for i in range(2 * num_protocols)) for s in base_starts
    ]
    x = _robust_fit(residuals, starts, [0, 1] * num_protocols, [1e5, 1e4] * num_protocols)
    return tuple(sorted(build(x).by_num_workers[workers], key=lambda p: p.latency_s))


def fit_allreduce(
    allreduce: pd.DataFrame, gpu: GPUSpec, system: str, num_protocols: int = 2
) -> AllReduceCoefficients:
    """Per worker count, ``num_protocols`` (latency, bandwidth) lines; the time is their minimum."""
    rows = single_node_rows(allreduce, system)
    _require_rows(rows, 8, f"single-node all-reduce of system {system!r}")
    by_workers: dict[int, tuple[AllReduceProtocol, ...]] = {}
    for workers, group in rows.groupby("num_workers"):
        _require_rows(group, 2 * num_protocols, f"all-reduce on {workers} workers of {system!r}")
        by_workers[int(workers)] = _fit_protocols(
            gpu,
            int(workers),
            group["size_bytes"].to_numpy(),
            group["time_s"].to_numpy(),
            num_protocols,
        )
    return AllReduceCoefficients(system=system, by_num_workers=by_workers)


__all__ = [
    "ELEMENTWISE_OPS",
    "GEMM_OPS",
    "FitError",
    "fit_allreduce",
    "fit_block_walk",
    "fit_decode_attention",
    "fit_elementwise",
    "fit_gemm",
    "fit_linear",
    "fit_prefill_attention",
    "prefill_features",
    "single_node_rows",
]
