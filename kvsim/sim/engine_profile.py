"""Engine mode as a second source of truth: ``kvsim profile --mode engine`` times the torch
engine into a profile folder in the layout kvsim calibrate reads (kvsim.costmodel.profiles).

What is timed is the engine's own code:

- ``compute/cpu__MODEL__mlp.csv``: one decoder layer's nine non-attention operators, called as
  LlamaDecoderLayer calls them, per token count (``add`` is the layer's two residual adds);
- ``attention/cpu__MODEL__tp1__attention.csv``: ``paged_attention`` of one layer with real
  metadata, decode batches (batch x context) at every block size of the grid, prefill chunks
  (chunk x cached) at the first one;
- ``steps/cpu__MODEL__steps.csv``: whole steps (``LLMEngine.execute_model``, what engine mode
  times) of n prompts of p tokens and the decode steps after them, with each step's BatchShape;
- ``device.json``: a GPU spec of this CPU with its measured peaks (matmul FLOP/s, copy bytes/s);
- ``profile.json``: threads, repeats, grid, and how noisy the machine was (engine_timing).

Timing discipline (kvsim.sim.engine_timing): threads pinned, warm-up then ``repeats`` timed
calls per point in interleaved rounds (each visits every point in a fresh seeded order), medians
fitted, so a slow spell of the machine lands on all points alike.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from engine import LLMEngine, SamplingParams
from engine.torch_engine.attention import build_attention_metadata, paged_attention
from engine.torch_engine.models.config import ModelConfig, preset_config
from engine.torch_engine.models.layers import RotaryEmbedding, apply_rotary
from engine.torch_engine.models.llama import LlamaDecoderLayer
from kvsim.atomic import FolderKind, check_target, output_folder
from kvsim.costmodel.layer_shapes import LINEAR_OPS
from kvsim.costmodel.profiles import PROFILE_META_FORMAT
from kvsim.sim.engine_timing import (
    CLOCKS,
    engine_clock,
    interleaved,
    load_average,
    measure_peaks,
    pin_threads,
    spread,
    stats,
    time_ms,
)
from kvsim.sim.executor import step_shape

DEVICE = "cpu"  # the profile's device prefix, and the GPU spec's name in device.json
ROUNDS = 3  # operator and attention points: their repeats split over this many rounds
# profile.json's "kvsim_profile" key marks the folder as kvsim's (kvsim.atomic).
PROFILE_FOLDER = FolderKind(
    what="engine profile",
    marker_file="profile.json",
    marker_key="kvsim_profile",
    entries=frozenset({"compute", "attention", "steps", "device.json", "profile.json"}),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineProfileGrid:
    """Where the engine is timed (token counts; batch sizes in sequences)."""

    tokens: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512,
                               768, 1024, 1536, 2048)  # fmt: skip
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_contexts: tuple[int, ...] = (16, 64, 256, 1024, 2048)
    prefill_chunks: tuple[int, ...] = (16, 64, 256, 1024)
    prefill_cached: tuple[int, ...] = (0, 256, 1024)
    block_sizes: tuple[int, ...] = (16, 8, 32)  # the first is the reference
    step_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    step_prompts: tuple[int, ...] = (16, 64, 256)
    step_decodes: int = 12  # decode steps timed after each prefill


# Enough points for every fit, in seconds rather than minutes: smoke tests, not calibration.
QUICK_GRID = EngineProfileGrid(
    tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    decode_batches=(1, 4, 16),
    decode_contexts=(16, 128, 512),
    prefill_chunks=(16, 64, 256),
    prefill_cached=(0, 128, 512),
    block_sizes=(16, 32),
    step_batches=(1, 4, 16),
    step_prompts=(16, 64),
    step_decodes=4,
)


def _config(model: str) -> ModelConfig:
    return preset_config(model)


def _linear_calls(
    layer: LlamaDecoderLayer, rotary: RotaryEmbedding, n: int, dtype: torch.dtype
) -> dict[str, Any]:
    """Each operator of ``layer`` as a call on random inputs for ``n`` tokens."""
    attn, mlp = layer.self_attn, layer.mlp
    heads, kv_heads, head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    inter = mlp.intermediate_size
    x = torch.randn(n, layer.input_layernorm.weight.numel(), dtype=dtype)
    q = torch.randn(n, heads, head_dim, dtype=dtype)
    k = torch.randn(n, kv_heads, head_dim, dtype=dtype)
    cos, sin = rotary(torch.arange(n), dtype)
    attn_out = torch.randn(n, heads * head_dim, dtype=dtype)
    gate_up = torch.randn(n, 2 * inter, dtype=dtype)
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    act = torch.randn(n, inter, dtype=dtype)
    return {
        "input_layernorm": lambda: layer.input_layernorm(x),
        "attn_pre_proj": lambda: attn.qkv_proj(x),
        "attn_rope": lambda: (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)),
        "attn_post_proj": lambda: attn.o_proj(attn_out),
        "post_attention_layernorm": lambda: layer.post_attention_layernorm(x),
        "mlp_up_proj": lambda: mlp.gate_up_proj(x),
        "mlp_act": lambda: F.silu(gate) * up,
        "mlp_down_proj": lambda: mlp.down_proj(act),
        "add": lambda: (x + x, x + x),  # the layer's two residual adds
    }


def _model_columns(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "n_layer": config.num_hidden_layers,
        "n_head": config.num_attention_heads,
        "n_kv_head": config.num_key_value_heads,
        "n_embd": config.hidden_size,
        "n_expanded_embd": config.intermediate_size,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "use_gated_mlp": True,
        "dtype_bytes": torch.finfo(dtype).bits // 8,
    }


def profile_linear(
    model: str,
    tokens: tuple[int, ...],
    repeats: int,
    dtype: torch.dtype,
    seed: int = 0,
    clock: Callable[[], int] = CLOCKS["wall"],
) -> tuple[pd.DataFrame, list[float]]:
    """The nine operators of one decoder layer per token count (Vidur's mlp.csv columns, ms)."""
    config = _config(model)
    torch.manual_seed(seed)
    layer = LlamaDecoderLayer(config).to(dtype).eval()
    rotary = RotaryEmbedding(config.rope, config.head_dim)
    calls = {n: _linear_calls(layer, rotary, n, dtype) for n in tokens}
    per_round = -(-repeats // ROUNDS)
    with torch.inference_mode():
        samples = interleaved(
            [(n, op) for n in tokens for op in LINEAR_OPS],
            lambda point: time_ms(calls[point[0]][point[1]], per_round, 2, clock),
            ROUNDS,
            seed,
        )
    columns = _model_columns(config, dtype)
    rows = []
    for n in tokens:
        row: dict[str, Any] = {**columns, "num_tokens": n, "num_tensor_parallel_workers": 1}
        for op in LINEAR_OPS:
            row.update(stats(op, samples[n, op]))
        rows.append(row)
    return pd.DataFrame(rows), [spread(v) for v in samples.values()]


def _attention_points(grid: EngineProfileGrid) -> list[tuple[bool, int, int, int, int]]:
    """(is_prefill, batch, chunk, context, block_size) of every attention point."""
    points = [
        (True, 1, n, c, grid.block_sizes[0])
        for n in grid.prefill_chunks
        for c in grid.prefill_cached
    ]
    points += [
        (False, b, 0, c, bs)
        for bs in grid.block_sizes
        for b in grid.decode_batches
        for c in grid.decode_contexts
    ]
    return points


def _attention_call(
    config: ModelConfig, point: tuple[bool, int, int, int, int], dtype: torch.dtype
) -> Callable[[], object]:
    """paged_attention of one layer at ``point`` (is_prefill, batch, chunk, context, block)."""
    hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    is_prefill, batch, chunk, context, block_size = point
    new = chunk if is_prefill else 1
    total = context + new if is_prefill else context
    per_seq = -(-total // block_size)
    key_cache = torch.randn(batch * per_seq + 1, block_size, hkv, d, dtype=dtype)
    value_cache = torch.randn_like(key_cache)
    tables = [list(range(1 + s * per_seq, 1 + (s + 1) * per_seq)) for s in range(batch)]
    slots = [
        tables[s][(total - new + i) // block_size] * block_size + (total - new + i) % block_size
        for s in range(batch)
        for i in range(new)
    ]
    meta = build_attention_metadata(
        query_lens=[new] * batch, context_lens=[total] * batch, block_tables=tables,
        slot_mapping=slots, block_size=block_size, dtype=dtype,
    )  # fmt: skip
    q = torch.randn(batch * new, hq, d, dtype=dtype)
    k = torch.randn(batch * new, hkv, d, dtype=dtype)
    return partial(paged_attention, q, k, torch.randn_like(k), key_cache, value_cache, meta)


def profile_attention(
    model: str,
    grid: EngineProfileGrid,
    repeats: int,
    dtype: torch.dtype,
    seed: int = 0,
    clock: Callable[[], int] = CLOCKS["wall"],
) -> tuple[pd.DataFrame, list[float]]:
    """paged_attention of one layer at every point of ``grid`` (Vidur's attention.csv, ms)."""
    config = _config(model)
    per_round = -(-repeats // ROUNDS)

    def sample(point: tuple[bool, int, int, int, int]) -> np.ndarray:
        return time_ms(_attention_call(config, point, dtype), per_round, 2, clock)

    with torch.inference_mode():
        samples = interleaved(_attention_points(grid), sample, ROUNDS, seed)
    rows = []
    for (is_prefill, batch, chunk, context, block_size), values in samples.items():
        measured, other = ("attn_prefill", "attn_decode")[:: 1 if is_prefill else -1]
        rows.append({
            **stats(measured, values),
            **dict.fromkeys(stats(other, values)),  # the other kind's columns, empty
            "n_embd": config.hidden_size, "n_q_head": config.num_attention_heads,
            "n_kv_head": config.num_key_value_heads, "head_dim": config.head_dim,
            "dtype_bytes": torch.finfo(dtype).bits // 8, "block_size": block_size,
            "num_tensor_parallel_workers": 1, "batch_size": batch,
            "prefill_chunk_size": chunk, "kv_cache_size": context, "is_prefill": is_prefill,
        })  # fmt: skip
    return pd.DataFrame(rows), [spread(v) for v in samples.values()]


def _scenario_steps(
    model: str,
    num_seqs: int,
    prompt: int,
    decodes: int,
    block_size: int,
    dtype: str,
    seed: int,
    clock: Callable[[], int],
) -> list[tuple[tuple[int, ...], float]]:
    """One run of ``num_seqs`` prompts of ``prompt`` tokens generating ``decodes + 1`` tokens
    each: every step's BatchShape counts and ``execute_model`` seconds."""
    blocks = num_seqs * -(-(prompt + decodes + 2) // block_size) + 8
    llm = LLMEngine(
        model, block_size=block_size, num_blocks=blocks, dtype=dtype, max_num_seqs=num_seqs,
        max_num_batched_tokens=max(4096, prompt), seed=seed,
    )  # fmt: skip
    rng = np.random.default_rng([seed, num_seqs, prompt])
    vocab = llm.model_config.vocab_size
    params = SamplingParams(max_tokens=decodes + 1, ignore_eos=True)
    for _ in range(num_seqs):
        llm.add_request(rng.integers(3, vocab, size=prompt).tolist(), params)
    scheduler, measured = llm.scheduler, []
    while llm.has_unfinished():
        out = scheduler.schedule()
        if not out.seqs:
            scheduler.update(out, [])
            continue
        shape = step_shape(out, sum(len(seq.block_table) for seq in out.seqs))
        start = clock()
        tokens = llm.execute_model(out)
        measured.append((tuple(int(v) for v in asdict(shape).values()), (clock() - start) * 1e-9))
        scheduler.update(out, tokens)
    return measured


def profile_steps(
    model: str,
    grid: EngineProfileGrid,
    repeats: int,
    dtype: torch.dtype,
    seed: int = 0,
    clock: Callable[[], int] = CLOCKS["wall"],
) -> tuple[pd.DataFrame, list[float]]:
    """Whole steps of every (batch, prompt) scenario, each run ``repeats`` times in interleaved
    rounds (after one warm-up run each); one row per step with its BatchShape counts and the
    median time (ms)."""
    config = _config(model)
    block_size = grid.block_sizes[0]
    dtype_name = str(dtype).removeprefix("torch.")
    scenarios = [(n, p) for n in grid.step_batches for p in grid.step_prompts]
    shapes: dict[tuple[int, int], list[tuple[int, ...]]] = {}

    def sample(scenario: tuple[int, int]) -> np.ndarray:
        n, p = scenario
        decodes = grid.step_decodes
        steps = _scenario_steps(model, n, p, decodes, block_size, dtype_name, seed, clock)
        counts = [c for c, _ in steps]
        if shapes.setdefault(scenario, counts) != counts:
            raise RuntimeError(f"scenario {n} x {p}: runs scheduled different steps")
        return np.array([seconds for _, seconds in steps])

    for scenario in scenarios:
        sample(scenario)  # warm-up: allocator, first-call costs
    runs = interleaved(scenarios, sample, repeats, seed)  # one run per scenario per round
    rows, spreads = [], []
    for scenario in scenarios:
        per_step = runs[scenario].reshape(repeats, -1) * 1e3  # rounds x steps, ms
        for i, counts in enumerate(shapes[scenario]):
            spreads.append(spread(per_step[:, i]))
            rows.append({
                **_model_columns(config, dtype), "block_size": block_size,
                **dict(zip(_SHAPE_FIELDS, counts)), **stats("step", per_step[:, i]),
            })  # fmt: skip
    return pd.DataFrame(rows), spreads


_SHAPE_FIELDS = (
    "num_seqs", "num_batched_tokens", "num_decode_seqs", "decode_context_tokens",
    "prefill_causal_pairs", "prefill_cached_pairs", "prefill_cached_tokens", "num_blocks_walked",
)  # fmt: skip


def write_engine_profile(
    out: Path,
    model: str,
    *,
    threads: int,
    repeats: int,
    dtype: str = "float32",
    grid: EngineProfileGrid | None = None,
    seed: int = 0,
    timer: str = "wall",
    force: bool = False,
) -> dict[str, Any]:
    """Profile ``model`` into folder ``out`` (all or nothing; an existing one only if kvsim
    wrote it, with ``force``); return profile.json's record.

    ``timer``: "wall" or "thread" (engine_timing.CLOCKS; "thread" needs ``threads == 1``)."""
    check_target(out, PROFILE_FOLDER, force=force)  # before a minute of measuring, not after
    grid = grid or EngineProfileGrid()
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    clock = engine_clock(timer, threads)
    pin_threads(threads)
    load_before, started = load_average(), time.perf_counter()
    peaks_before = measure_peaks(torch_dtype, clock=clock)
    linear, linear_spread = profile_linear(model, grid.tokens, repeats, torch_dtype, seed, clock)
    attention, attention_spread = profile_attention(model, grid, repeats, torch_dtype, seed, clock)
    step_rounds = max(3, repeats // 3)
    steps, steps_spread = profile_steps(model, grid, step_rounds, torch_dtype, seed, clock)
    peaks_after = measure_peaks(torch_dtype, clock=clock)
    drift = {k: peaks_after[k] / peaks_before[k] - 1.0 for k in peaks_before}
    device = {
        "name": DEVICE,
        "memory_bytes": 16 << 30,  # unused: engine-mode pools are sized by the engine
        "hbm_bandwidth": float(
            np.mean([peaks_before["hbm_bandwidth"], peaks_after["hbm_bandwidth"]])
        ),
        "peak_flops": float(np.mean([peaks_before["peak_flops"], peaks_after["peak_flops"]])),
        "interconnect_bandwidth": 1e9,  # unused: one device (tp 1)
    }
    noise = {
        "spread_median": float(np.median(steps_spread)),
        "spread_by_file": {
            "compute": float(np.median(linear_spread)),
            "attention": float(np.median(attention_spread)),
            "steps": float(np.median(steps_spread)),
        },
        "peak_drift": drift,
    }
    record: dict[str, Any] = {
        "format": PROFILE_META_FORMAT,
        "kvsim_profile": 1,
        "version": 1,
        "kind": "engine",
        "device": DEVICE,
        "model": model,
        "dtype": dtype,
        "threads": threads,
        "timer": timer,
        "repeats": repeats,
        "num_sms": threads,  # decode attention runs one (sequence, KV head) per thread at a time
        "max_efficiency": 100.0,  # cache-resident operands beat the measured DRAM bandwidth
        "grid": asdict(grid),
        "seconds": round(time.perf_counter() - started, 1),
        "load_average": {"before": load_before, "after": load_average()},
        "noise": noise,
        "machine": {
            "cpus": len(_cpus()),
            "processor": platform.processor(),
            "torch": torch.__version__,
        },
    }
    with output_folder(out, PROFILE_FOLDER, force=force) as tmp:
        for sub in ("compute", "attention", "steps"):
            (tmp / sub).mkdir()
        linear.to_csv(tmp / "compute" / f"{DEVICE}__{model}__mlp.csv", index=False)
        attention.to_csv(tmp / "attention" / f"{DEVICE}__{model}__tp1__attention.csv", index=False)
        steps.to_csv(tmp / "steps" / f"{DEVICE}__{model}__steps.csv", index=False)
        (tmp / "device.json").write_text(json.dumps(device, indent=2) + "\n", encoding="utf-8")
        (tmp / "profile.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))
