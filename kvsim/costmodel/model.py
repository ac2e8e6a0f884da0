"""Step time of one engine step, from terms fitted to measured kernel profiles.

The simulator calls :meth:`CostModel.step_time_of` once per general step and the closure of
:meth:`CostModel.decode_step_time_fn` once per plain decode step, so both are a few list reads
and multiply-adds on Python floats: every term that depends on one count alone is tabulated
when the CostModel is built (about 1.4 ms), whatever the term's shape (max, ceil, waves):

    token_table[T]  = layers * linear_layer(T) + 2 * layers * allreduce(T * hidden * dtype)
    seq_table[S]    = seq_overhead * S + lm_head(S)
    decode_fixed[n] = layers * (the part of decode attention of n seqs not scaling with context)
    decode_slope[n] = layers * seconds per context token, less the block walk already inside
                      the profile (see block_walk_s)

Tables grow on demand (a count past the end extends them to the next power of two), always
from the same vectorised code, so a step's time does not depend on what was priced before.
Formulas, units and fitted error: docs/costmodel.md. Callers import it, with the specs, presets
and the memory planner, from ``kvsim.costmodel``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.costmodel.coefficients import StepCoefficients, preset_coefficients, to_json_dict
from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.layer_shapes import LayerShapes
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.sharding import shard_model
from kvsim.costmodel.terms import (
    SPLIT_KV_OCCUPANCY,
    allreduce_time,
    linear_layer_time,
    lm_head_time,
)

_INITIAL_TABLE = 1024  # tokens / sequences tabulated up front; more on first use


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one step processes, summed over its sequences (counts).

    A decode sequence computes one token over its cache; a prefill sequence (a whole prompt,
    or under v1 a chunk of one) computes n new tokens after c tokens already in the cache
    (computed in earlier chunks, or prefix-cache hits: those cost nothing to compute, only to
    read). A step may hold both kinds (vLLM v1's mixed batches).
    """

    num_seqs: int  # sequences in this step
    num_batched_tokens: int  # new tokens: 1 per decode sequence plus every prefill chunk's n
    num_decode_seqs: int  # sequences that decode (one token each)
    decode_context_tokens: int  # sum over decode seqs of context length (tokens of K/V read)
    prefill_causal_pairs: int  # sum over prefill seqs of n(n+1)/2 (new x new token pairs)
    prefill_cached_pairs: int  # sum over prefill seqs of n*c (new x cached token pairs)
    prefill_cached_tokens: int  # sum over prefill seqs of c (cached tokens whose K/V is read)
    num_blocks_walked: int  # sum over all seqs of block-table entries read

    @classmethod
    def decode(cls, num_seqs: int, context_tokens: int, num_blocks_walked: int) -> BatchShape:
        """A step of ``num_seqs`` decodes reading ``context_tokens`` tokens of K/V in all."""
        return cls(num_seqs, num_seqs, num_seqs, context_tokens, 0, 0, 0, num_blocks_walked)

    @classmethod
    def of(
        cls,
        *,
        prefill_chunks: tuple[tuple[int, int], ...] | list[tuple[int, int]] = (),
        decode_contexts: tuple[int, ...] | list[int] = (),
        num_blocks_walked: int = 0,
    ) -> BatchShape:
        """The shape of a step of prefill chunks ((n new tokens, c cached tokens) per sequence)
        and decodes (each sequence's context length, this step's token included)."""
        new = sum(n for n, _ in prefill_chunks)
        return cls(
            num_seqs=len(prefill_chunks) + len(decode_contexts),
            num_batched_tokens=new + len(decode_contexts),
            num_decode_seqs=len(decode_contexts),
            decode_context_tokens=sum(decode_contexts),
            prefill_causal_pairs=sum(n * (n + 1) // 2 for n, _ in prefill_chunks),
            prefill_cached_pairs=sum(n * c for n, c in prefill_chunks),
            prefill_cached_tokens=sum(c for _, c in prefill_chunks),
            num_blocks_walked=num_blocks_walked,
        )


def causal_pairs(num_new_tokens: int, num_cached_tokens: int = 0) -> int:
    """Query-key pairs of causal attention for n new tokens after c cached: n*c + n*(n+1)/2."""
    n, c = num_new_tokens, num_cached_tokens
    return n * c + n * (n + 1) // 2


class CostModel:
    """Predicted seconds per step for ``model`` on ``tp`` x ``gpu``.

    ``coefficients`` default to the shipped file of the GPU preset ``gpu.name`` (fitted to
    measured profiles, or scaled from a fitted GPU's by datasheet peaks: each file says which);
    a GPU without one needs coefficients (``kvsim calibrate``). Any ``tp`` that divides the
    query heads is priced, whether or not the weights fit the GPU (memory planning is
    kvsim.costmodel.memory_plan's question).
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        *,
        tp: int = 1,
        coefficients: StepCoefficients | None = None,
    ) -> None:
        co = coefficients if coefficients is not None else preset_coefficients(gpu.name)
        self.shapes = LayerShapes.from_model(model, tp)  # checks tp
        self.shard = shard_model(model, tp, strict=False)
        self.model, self.gpu, self.tp, self.coefficients = model, gpu, tp, co
        s, p, d = self.shapes, co.prefill_attention, co.decode_attention
        layers = float(model.num_layers)
        self._layers = model.num_layers
        self._overhead = co.overheads.step_overhead_s
        # Plain floats: one model's shapes are ints (LayerShapes also holds per-row arrays).
        flops_per_pair = float(4.0 * s.heads_per_gpu * s.head_dim / gpu.peak_flops)  # QK^T, PV
        kv_bytes = float(s.kv_heads_per_gpu * s.kv_bytes_per_token_per_kv_head)
        # Prefill attention, per unit of each BatchShape sum (times layers).
        self._pre_fixed = layers * p.latency_s
        self._pre_causal = layers * flops_per_pair / p.causal_flops_efficiency
        self._pre_cached = layers * flops_per_pair / p.cached_flops_efficiency
        self._pre_context = layers * kv_bytes / (gpu.hbm_bandwidth * p.context_bw_efficiency)
        self._pre_token = layers * p.per_token_s
        self._pre_seq = co.overheads.prefill_seq_overhead_s
        # Block walk relative to the profiled block size: the profile's own walk is in the fit.
        self._walk = float(co.overheads.block_walk_s * layers * s.kv_heads_per_gpu)
        self._walk_in_profile = self._walk / co.profiled_block_size
        self._decode_bw = layers * kv_bytes / (gpu.hbm_bandwidth * d.bw_efficiency)
        self._token_table: list[float] = []
        self._seq_table: list[float] = []
        self._decode_fixed: list[float] = []
        self._decode_slope: list[float] = []
        self._decode_base: list[float] = []
        self._grow_tokens(_INITIAL_TABLE)
        self._grow_seqs(_INITIAL_TABLE)

    # --- tables ----------------------------------------------------------------------------

    def _grow_tokens(self, size: int) -> None:
        tokens = np.arange(len(self._token_table), size, dtype=np.float64)
        m, layers = self.model, float(self._layers)
        linear = layers * linear_layer_time(self.coefficients, self.gpu, self.shapes, tokens)
        message = tokens * m.hidden_size * m.dtype_bytes
        allreduce = (
            2.0 * layers * allreduce_time(self.coefficients.allreduce, self.gpu, self.tp, message)
        )
        per_token = self.coefficients.overheads.token_overhead_s * tokens
        values = np.where(tokens > 0, linear + allreduce + per_token, 0.0)
        self._token_table.extend(values.tolist())

    def _grow_seqs(self, size: int) -> None:
        n = np.arange(len(self._seq_table), size, dtype=np.float64)
        co, m, s = self.coefficients, self.model, self.shapes
        d, sms = co.decode_attention, co.num_sms
        lm = lm_head_time(co, self.gpu, m.hidden_size, m.vocab_size // self.tp, n, m.dtype_bytes)
        seq = np.where(n > 0, co.overheads.seq_overhead_s * n + lm, 0.0)
        blocks = n * s.kv_heads_per_gpu
        split = blocks < SPLIT_KV_OCCUPANCY * sms
        splits = np.where(split, np.maximum(1.0, np.floor(sms / np.maximum(blocks, 1.0))), 1.0)
        waves = np.where(split, 1.0, np.ceil(blocks / sms))
        layers = float(self._layers)
        fixed = layers * (
            d.latency_s + d.split_latency_s * split + d.wave_latency_s * (waves - 1.0)
        )
        # One thread block reads c / splits tokens per wave; with c = context / n per sequence:
        rate = d.sm_bandwidth_share * self.gpu.hbm_bandwidth / sms
        per_block = (
            layers * waves / (np.maximum(n, 1.0) * splits) * s.kv_bytes_per_token_per_kv_head / rate
        )
        slope = np.maximum(self._decode_bw, per_block) - self._walk_in_profile
        start = len(self._seq_table)
        self._seq_table.extend(seq.tolist())
        self._decode_fixed.extend(np.where(n > 0, fixed, 0.0).tolist())
        self._decode_slope.extend(np.where(n > 0, slope, 0.0).tolist())
        self._token_at(size - 1)  # base[n] reads token_table[n]
        tokens = self._token_table
        for i in range(start, size):  # Python floats, summed exactly as step_time_of sums them
            self._decode_base.append(
                self._overhead + self._seq_table[i] + tokens[i] + self._decode_fixed[i]
            )

    def _token_at(self, num_tokens: int) -> float:
        if num_tokens >= len(self._token_table):
            self._grow_tokens(1 << max(num_tokens, 1).bit_length())
        return self._token_table[num_tokens]

    def _grow_seqs_to(self, num_seqs: int) -> None:
        if num_seqs >= len(self._seq_table):
            self._grow_seqs(1 << num_seqs.bit_length())

    # --- public ----------------------------------------------------------------------------

    def linear_time_s(self, num_tokens: int) -> float:
        """Per-GPU seconds of all layers' non-attention work for a step of ``num_tokens``
        tokens: the nine operators of a profile's mlp.csv row (attn_pre_proj, attn_rope,
        attn_post_proj, mlp_up_proj, mlp_act, mlp_down_proj, input_layernorm,
        post_attention_layernorm, add) times num_layers; no embedding, LM head or all-reduce.
        For an MoE model the three MLP operators are its MoE block (terms.moe_op_times).
        Never decreases as tokens grow."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int | np.integer):
            raise TypeError(f"num_tokens must be an integer, got {num_tokens!r}")
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens!r}")
        layer = linear_layer_time(self.coefficients, self.gpu, self.shapes, float(num_tokens))
        return float(self._layers * layer)

    def step_time(self, shape: BatchShape) -> float:
        """Predicted wall time of one step (seconds)."""
        return self.step_time_of(*dataclasses.astuple(shape))

    def step_time_of(
        self,
        num_seqs: int,
        num_batched_tokens: int,
        num_decode_seqs: int,
        decode_context_tokens: int,
        prefill_causal_pairs: int,
        prefill_cached_pairs: int,
        prefill_cached_tokens: int,
        num_blocks_walked: int,
    ) -> float:
        """:meth:`step_time` from the eight BatchShape counts, in its field order, without
        building a BatchShape (a frozen dataclass costs about a microsecond to construct)."""
        if num_seqs >= len(self._seq_table):
            self._grow_seqs_to(num_seqs)
        t = self._overhead + self._seq_table[num_seqs] + self._token_at(num_batched_tokens)
        if num_decode_seqs:
            t = t + self._decode_fixed[num_decode_seqs]
            t = t + self._decode_slope[num_decode_seqs] * decode_context_tokens
        prefill_tokens = num_batched_tokens - num_decode_seqs
        if prefill_tokens:
            t = t + (
                self._pre_fixed
                + self._pre_seq * (num_seqs - num_decode_seqs)
                + self._pre_causal * prefill_causal_pairs
                + self._pre_cached * prefill_cached_pairs
                + self._pre_context * prefill_cached_tokens
                + self._pre_token * prefill_tokens
                - self._walk_in_profile * (prefill_cached_tokens + prefill_tokens)
            )
        return t + self._walk * num_blocks_walked

    def decode_step_time_fn(self) -> Callable[[int, int, int], float]:
        """``f(num_seqs, context_tokens, num_blocks_walked)``: the simulator's per-step price
        of a plain decode step, bit-identical to ``step_time_of(n, n, n, context_tokens, 0, 0,
        0, blocks)`` (the same table entries, summed in the same order)."""
        base, slope, walk = self._decode_base, self._decode_slope, self._walk
        grow = self._grow_seqs_to

        def decode_step_time(num_seqs: int, context_tokens: int, num_blocks_walked: int) -> float:
            try:
                return base[num_seqs] + slope[num_seqs] * context_tokens + walk * num_blocks_walked
            except IndexError:  # past the tables: extend them, once per power of two
                grow(num_seqs)
                return base[num_seqs] + slope[num_seqs] * context_tokens + walk * num_blocks_walked

        return decode_step_time

    def step_price_terms(self, max_num_seqs: int, max_num_batched_tokens: int) -> dict[str, Any]:
        """What ``step_time_of`` and ``decode_step_time_fn`` read, for the compiled core's
        step prices (engine/compiled/csrc/step_prices.hpp sums them in the same order): the
        per-sequence and per-token tables, grown to cover ``max_num_seqs`` sequences and
        ``max_num_batched_tokens`` tokens (seconds), and the scalar terms (seconds per unit)."""
        self._grow_seqs_to(max_num_seqs)
        self._token_at(max_num_batched_tokens)
        return {
            "seq_table": list(self._seq_table),
            "token_table": list(self._token_table),
            "decode_fixed": list(self._decode_fixed),
            "decode_slope": list(self._decode_slope),
            "decode_base": list(self._decode_base),
            "overhead": self._overhead,
            "walk": self._walk,
            "walk_in_profile": self._walk_in_profile,
            "pre_fixed": self._pre_fixed,
            "pre_seq": self._pre_seq,
            "pre_causal": self._pre_causal,
            "pre_cached": self._pre_cached,
            "pre_context": self._pre_context,
            "pre_token": self._pre_token,
        }

    def breakdown(self, shape: BatchShape) -> dict[str, float]:
        """The terms of :meth:`step_time`, by name (seconds); they sum to step_time (up to
        rounding): overhead, linear, lm_head, allreduce, decode_attention, prefill_attention
        (both without the block-table walk their profile contains) and block_walk (every
        entry walked, at ``block_walk_s``)."""
        co, m = self.coefficients, self.model
        tokens, seqs, decodes = shape.num_batched_tokens, shape.num_seqs, shape.num_decode_seqs
        self._grow_seqs_to(max(seqs, decodes))
        linear = 0.0
        if tokens:
            layer = linear_layer_time(co, self.gpu, self.shapes, float(tokens))
            linear = float(self._layers * layer)
        lm_head = 0.0
        if seqs:
            vocab = m.vocab_size // self.tp
            lm = lm_head_time(co, self.gpu, m.hidden_size, vocab, seqs, m.dtype_bytes)
            lm_head = float(lm)
        decode = 0.0
        if decodes:
            decode = (
                self._decode_fixed[decodes]
                + self._decode_slope[decodes] * shape.decode_context_tokens
            )
        prefill = 0.0
        prefill_tokens = tokens - decodes
        if prefill_tokens:
            prefill = (
                self._pre_fixed
                + self._pre_seq * (seqs - decodes)
                + self._pre_causal * shape.prefill_causal_pairs
                + self._pre_cached * shape.prefill_cached_pairs
                + self._pre_context * shape.prefill_cached_tokens
                + self._pre_token * prefill_tokens
                - self._walk_in_profile * (shape.prefill_cached_tokens + prefill_tokens)
            )
        per_token = co.overheads.token_overhead_s * tokens
        return {
            "overhead": self._overhead + co.overheads.seq_overhead_s * seqs + per_token,
            "linear": linear,
            "lm_head": lm_head,
            "allreduce": self._token_at(tokens) - linear - per_token if tokens else 0.0,
            "decode_attention": decode,
            "prefill_attention": prefill,
            "block_walk": self._walk * shape.num_blocks_walked,
        }

    def describe(self) -> dict[str, object]:
        """Resolved model, GPU, tp, per-GPU sizes and the coefficients (their file's JSON,
        provenance included) with where they were read from; JSON-serializable."""
        shard = dataclasses.asdict(self.shard)
        del shard["model"]
        model = dataclasses.asdict(self.model)
        if not model["expert_weight_bytes"]:
            # Absent means as dtype_bytes: run folders of every model stored at one width read
            # as they did before the field existed.
            del model["expert_weight_bytes"]
        return {
            "model": model,
            "gpu": dataclasses.asdict(self.gpu),
            "tp": self.tp,
            "coefficients_source": self.coefficients.source or "in memory",
            "coefficients": to_json_dict(self.coefficients),
            "per_gpu": shard,
        }

    def __repr__(self) -> str:
        return f"CostModel(model={self.model.name!r}, gpu={self.gpu.name!r}, tp={self.tp})"
