"""Step time of one engine step, predicted by a roofline over one GPU's share of the work.

The simulator calls :meth:`CostModel.step_time` once per step, so it is plain float arithmetic on
five integers: every per-model, per-GPU constant is folded in ``__init__``. The model is a sum of
independent terms, each a roofline max(FLOPs / achieved FLOP/s, bytes / achieved bytes/s) where
both apply (formulas, units and sources: docs/costmodel.md).

Callers import it, with the specs, presets and the memory planner, from ``kvsim.costmodel``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.sharding import shard_model
from kvsim.costmodel.specio import (
    check_keys,
    fraction,
    nonnegative_float,
    read_json_object,
)

_EFFICIENCIES = (
    "mfu_efficiency",
    "bw_efficiency",
    "attention_mfu_efficiency",
    "attention_bw_efficiency",
    "allreduce_bw_efficiency",
)
_TIMES = ("step_overhead_s", "seq_overhead_s", "block_walk_s", "allreduce_latency_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class CostCoefficients:
    """Every tunable number of the step-time model (justification: docs/costmodel.md).

    Efficiencies are fractions of the GPU's peak in (0, 1]; times are seconds.
    """

    mfu_efficiency: float = 0.6  # linear layers + LM head: achieved / peak dense FLOP/s
    bw_efficiency: float = 0.8  # weight streaming: achieved / peak HBM bytes/s
    attention_mfu_efficiency: float = 0.5  # prefill attention kernels (FlashAttention-class)
    attention_bw_efficiency: float = 0.7  # paged decode attention reading K/V
    allreduce_bw_efficiency: float = 0.7  # NCCL ring bus bandwidth / link bandwidth
    step_overhead_s: float = 3e-3  # CPU scheduling, input prep, launches, sampling per step
    seq_overhead_s: float = 20e-6  # per scheduled sequence per step (Python-side bookkeeping)
    block_walk_s: float = 1.5e-9  # per block-table entry, per layer, per KV head on the GPU
    allreduce_latency_s: float = 10e-6  # fixed latency of one all-reduce

    def __post_init__(self) -> None:
        for field in _EFFICIENCIES:
            fraction(getattr(self, field), field, "coefficients")
        for field in _TIMES:
            nonnegative_float(getattr(self, field), field, "coefficients")


def load_coefficients(
    path: str | Path, *, base: CostCoefficients | None = None
) -> CostCoefficients:
    """``base`` (default: the defaults) with the values of a JSON object of overrides.

    Any subset of the CostCoefficients fields; an unknown key is rejected by name (a typo must not
    silently leave the default in place).
    """
    source = str(path)
    data = read_json_object(path)
    check_keys(data, allowed=_EFFICIENCIES + _TIMES, required=(), source=source)
    values: dict[str, float] = {}
    for key, value in data.items():
        check = fraction if key in _EFFICIENCIES else nonnegative_float
        values[key] = check(value, key, source)
    return dataclasses.replace(base or CostCoefficients(), **values)


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one step processes, summed over its sequences (counts)."""

    num_seqs: int  # sequences in this step
    num_batched_tokens: int  # new tokens (prefill: prompt tokens; decode: 1 per seq)
    prefill_attention_pairs: int  # sum of causal_pairs(n, c) over prefill sequences
    decode_context_tokens: int  # sum over decode seqs of context length (tokens of K/V read)
    num_blocks_walked: int  # sum over all seqs of block-table entries read


def causal_pairs(num_new_tokens: int, num_cached_tokens: int = 0) -> int:
    """Query-key pairs of causal attention for n new tokens after c cached: n*c + n*(n+1)/2."""
    n, c = num_new_tokens, num_cached_tokens
    return n * c + n * (n + 1) // 2


class CostModel:
    """Predicted seconds per step for ``model`` on ``tp`` x ``gpu`` with ``coefficients``."""

    __slots__ = (
        "_ar_fixed",
        "_ar_per_token",
        "_block",
        "_ctx",
        "_lin_bytes",
        "_lin_flop",
        "_lm_bytes",
        "_lm_flop",
        "_overhead",
        "_pair",
        "_seq",
        "coefficients",
        "gpu",
        "model",
        "shard",
        "tp",
    )

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        *,
        tp: int = 1,
        coefficients: CostCoefficients | None = None,
    ) -> None:
        co = coefficients or CostCoefficients()
        shard = shard_model(model, tp)
        self.model, self.gpu, self.tp, self.coefficients, self.shard = model, gpu, tp, co, shard
        flops = gpu.peak_flops * co.mfu_efficiency
        bw = gpu.hbm_bandwidth * co.bw_efficiency
        attn_flops = gpu.peak_flops * co.attention_mfu_efficiency
        attn_bw = gpu.hbm_bandwidth * co.attention_bw_efficiency
        dtype = model.dtype_bytes
        # 1. linear layers: 2 FLOPs per weight per token; weights streamed once per step.
        self._lin_flop = 2.0 * shard.layer_matmul_params_per_gpu / flops
        self._lin_bytes = shard.layer_matmul_params_per_gpu * dtype / bw
        # 2. LM head: only each sequence's last position produces logits.
        self._lm_flop = 2.0 * shard.lm_head_params_per_gpu / flops
        self._lm_bytes = shard.lm_head_params_per_gpu * dtype / bw
        # 3. prefill attention: QK^T and PV, 2 FLOPs each per pair per head dim, per head.
        attn_flop_per_pair = 4.0 * model.num_layers * shard.heads_per_gpu * model.head_dim
        self._pair = attn_flop_per_pair / attn_flops
        # 4. decode attention: each context token's K/V read once; the FLOPs rarely dominate
        #    (only when heads/kv_heads is large), but take the roofline max anyway.
        self._ctx = max(shard.kv_bytes_per_token_per_gpu / attn_bw, attn_flop_per_pair / attn_flops)
        # 5. block-table walk: each layer's attention kernel visits every entry once per KV head
        #    it holds (one thread block per head and sequence), paying a fixed latency per visit.
        self._block = co.block_walk_s * model.num_layers * shard.kv_heads_per_gpu
        # 6. all-reduce after attention and after the MLP of every layer (ring: 2(tp-1)/tp of
        #    the message crosses each link); nothing when tp == 1.
        num_allreduce = 2 * model.num_layers if tp > 1 else 0
        link = gpu.interconnect_bandwidth * co.allreduce_bw_efficiency
        ring_bytes_per_token = 2.0 * (tp - 1) / tp * model.hidden_size * dtype
        self._ar_fixed = num_allreduce * co.allreduce_latency_s
        self._ar_per_token = num_allreduce * ring_bytes_per_token / link
        # 7. CPU-side overheads.
        self._overhead = co.step_overhead_s + self._ar_fixed
        self._seq = co.seq_overhead_s

    def step_time(self, shape: BatchShape) -> float:
        """Predicted wall time of one step (seconds)."""
        return self.step_time_of(
            shape.num_seqs,
            shape.num_batched_tokens,
            shape.prefill_attention_pairs,
            shape.decode_context_tokens,
            shape.num_blocks_walked,
        )

    def step_time_of(
        self,
        num_seqs: int,
        num_batched_tokens: int,
        prefill_attention_pairs: int,
        decode_context_tokens: int,
        num_blocks_walked: int,
    ) -> float:
        """:meth:`step_time` from the five BatchShape counts, without building a BatchShape.

        For hot loops (e.g. predicting several decode steps ahead): a frozen dataclass costs
        about a microsecond to construct, more than this arithmetic.
        """
        linear = self._lin_flop * num_batched_tokens
        if linear < self._lin_bytes:
            linear = self._lin_bytes
        lm_head = self._lm_flop * num_seqs
        if lm_head < self._lm_bytes:
            lm_head = self._lm_bytes
        return (
            self._overhead
            + self._seq * num_seqs
            + linear
            + lm_head
            + self._pair * prefill_attention_pairs
            + self._ctx * decode_context_tokens
            + self._block * num_blocks_walked
            + self._ar_per_token * num_batched_tokens
        )

    def decode_step_time_fn(self) -> Callable[[int, int, int], float]:
        """``step_time_of`` for decode steps, ``f(num_seqs, context_tokens,
        num_blocks_walked)``, as a closure over the coefficients: the simulator calls it once
        per step. Bit-identical to ``step_time_of(n, n, 0, context_tokens, blocks)`` (the
        same operations in the same order; the prefill-attention term is an exact 0)."""
        overhead, per_seq, ctx, block = self._overhead, self._seq, self._ctx, self._block
        lin_flop, lin_bytes, lm_flop, lm_bytes = (
            self._lin_flop,
            self._lin_bytes,
            self._lm_flop,
            self._lm_bytes,
        )
        ar_per_token = self._ar_per_token

        def decode_step_time(num_seqs: int, context_tokens: int, num_blocks_walked: int) -> float:
            linear = lin_flop * num_seqs
            if linear < lin_bytes:
                linear = lin_bytes
            lm_head = lm_flop * num_seqs
            if lm_head < lm_bytes:
                lm_head = lm_bytes
            return (
                overhead
                + per_seq * num_seqs
                + linear
                + lm_head
                + ctx * context_tokens
                + block * num_blocks_walked
                + ar_per_token * num_seqs
            )

        return decode_step_time

    def breakdown(self, shape: BatchShape) -> dict[str, float]:
        """The terms of :meth:`step_time`, by name (seconds); they sum to step_time."""
        tokens, seqs = shape.num_batched_tokens, shape.num_seqs
        return {
            "overhead": self.coefficients.step_overhead_s + self._seq * seqs,
            "linear": max(self._lin_flop * tokens, self._lin_bytes),
            "lm_head": max(self._lm_flop * seqs, self._lm_bytes),
            "prefill_attention": self._pair * shape.prefill_attention_pairs,
            "decode_attention": self._ctx * shape.decode_context_tokens,
            "block_walk": self._block * shape.num_blocks_walked,
            "allreduce": self._ar_fixed + self._ar_per_token * tokens,
        }

    def describe(self) -> dict[str, object]:
        """Resolved model, GPU, tp, coefficients and per-GPU sizes, JSON-serializable."""
        shard = dataclasses.asdict(self.shard)
        del shard["model"]
        return {
            "model": dataclasses.asdict(self.model),
            "gpu": dataclasses.asdict(self.gpu),
            "tp": self.tp,
            "coefficients": dataclasses.asdict(self.coefficients),
            "per_gpu": shard,
        }

    def __repr__(self) -> str:
        return f"CostModel(model={self.model.name!r}, gpu={self.gpu.name!r}, tp={self.tp})"
