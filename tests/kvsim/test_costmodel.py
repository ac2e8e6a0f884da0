"""Step time: sanity magnitudes, monotonicity, paging and TP costs, coefficient files.

The fitter, the error bounds on measured profiles and linear_time_s: tests/costmodel/."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.costmodel import (
    GPU_PRESETS,
    MODEL_PRESETS,
    BatchShape,
    CostModel,
    CostModelError,
    GPUSpec,
    ModelSpec,
    causal_pairs,
    load_coefficients,
    preset_coefficients,
    save_coefficients,
)
from kvsim.costmodel.coefficients import coefficients_from_json_dict
from kvsim.costmodel.terms import allreduce_time

LLAMA7 = MODEL_PRESETS["llama-2-7b"]
A100_80 = GPU_PRESETS["a100-80gb"]


def decode_shape(num_seqs: int, context: int, block_size: int = 16) -> BatchShape:
    return BatchShape.decode(
        num_seqs, num_seqs * context, num_seqs * math.ceil(context / block_size)
    )


def prefill_shape(prompt: int, block_size: int = 16) -> BatchShape:
    return BatchShape.of(
        prefill_chunks=[(prompt, 0)], num_blocks_walked=math.ceil(prompt / block_size)
    )


def test_causal_pairs() -> None:
    assert causal_pairs(3) == 6  # 1 + 2 + 3
    assert causal_pairs(2, 5) == 2 * 5 + 3
    assert causal_pairs(0, 100) == 0


# Bounds: the lower bound is physics, what the GPU needs at 100% of its datasheet peak
# (decode: 13.5 GB of weights + 33.6 GB of K/V at 2.04 TB/s = 23 ms; prefill: 2.6e13 FLOPs at
# 312 TFLOP/s = 83 ms), so a model that beats it is wrong. The upper bound allows about 3x over
# measured vLLM figures (30-45 ms TPOT at this batch, ~15k prompt tokens/s on an A100) so that
# recalibrating a coefficient does not break the test, while a unit slip (ms vs s, bits vs bytes,
# a missing layer factor) still does.
def test_llama_2_7b_decode_64_seqs_1000_context_is_tens_of_ms() -> None:
    seconds = CostModel(LLAMA7, A100_80).step_time(decode_shape(64, 1000))
    assert 0.023 < seconds < 0.1


def test_llama_2_7b_prefill_2000_tokens_is_100_to_200_ms() -> None:
    seconds = CostModel(LLAMA7, A100_80).step_time(prefill_shape(2000))
    assert 0.083 < seconds < 0.25
    assert 0.1 < seconds < 0.2  # the fitted A100 terms: 150 ms (docs/costmodel.md)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(["llama-2-7b", "llama-2-70b", "llama-3-8b"]),
    tp=st.sampled_from([1, 2, 4]),
    num_seqs=st.integers(1, 1024),
    context=st.integers(1, 10_000_000),
    blocks=st.integers(0, 1_000_000),
)
def test_the_decode_step_timer_is_bit_identical_to_step_time_of(
    model: str, tp: int, num_seqs: int, context: int, blocks: int
) -> None:
    # the simulator times plain decode steps with it, the general path with step_time_of:
    # a run's results must not depend on which path a step took
    cm = CostModel(MODEL_PRESETS[model], GPU_PRESETS["h100-sxm"], tp=tp)
    timer = cm.decode_step_time_fn()
    assert timer(num_seqs, context, blocks) == cm.step_time_of(
        num_seqs, num_seqs, num_seqs, context, 0, 0, 0, blocks
    )


def test_breakdown_sums_to_step_time() -> None:
    model = CostModel(MODEL_PRESETS["llama-2-70b"], A100_80, tp=4)
    mixed = BatchShape.of(
        prefill_chunks=[(300, 0), (212, 5000)], decode_contexts=(1000,) * 8, num_blocks_walked=900
    )
    for shape in (decode_shape(64, 1000), prefill_shape(2000), mixed):
        parts = model.breakdown(shape)
        assert sum(parts.values()) == pytest.approx(model.step_time(shape), rel=1e-12)
        assert model.step_time_of(*dataclasses.astuple(shape)) == model.step_time(shape)
        assert all(value >= 0 for value in parts.values())


@pytest.mark.parametrize("field", [0, 1, 3, 4, 5, 6, 7])
def test_step_time_is_monotone_in_every_count(field: int) -> None:
    # every count but num_decode_seqs (more decodes at the same token count is fewer prefill
    # tokens, not more work)
    model = CostModel(LLAMA7, A100_80, tp=2)
    base = [8, 256, 4, 8_000, 10_000, 50_000, 2_000, 600]
    times = []
    for scale in (1, 2, 4, 8, 64):
        values = list(base)
        values[field] *= scale
        times.append(model.step_time(BatchShape(*values)))
    assert times == sorted(times)
    assert times[-1] > times[0]


def test_compute_bound_prefill_grows_linearly_in_tokens() -> None:
    model = CostModel(LLAMA7, A100_80)
    small = model.breakdown(prefill_shape(2048))["linear"]
    large = model.breakdown(prefill_shape(4096))["linear"]
    assert large == pytest.approx(2 * small, rel=0.02)  # the fixed per-kernel costs aside


def test_memory_bound_decode_reads_weights_once_per_step() -> None:
    model = CostModel(LLAMA7, A100_80)
    one = model.breakdown(decode_shape(1, 1000))["linear"]
    many = model.breakdown(decode_shape(32, 1000))["linear"]
    assert many == pytest.approx(one, rel=0.05)
    at_peak = LLAMA7.layer_matmul_params * 2 / 2.039e12  # weights read at datasheet bandwidth
    assert at_peak < one < 2 * at_peak  # plus ~1.4 ms of measured per-kernel latency


def test_prefill_attention_is_quadratic_in_prompt_length() -> None:
    model = CostModel(LLAMA7, A100_80)
    t = [model.breakdown(prefill_shape(n))["prefill_attention"] for n in (1000, 2000, 4000)]
    # n(n+1)/2 pairs plus a per-token cost: doubling the prompt more than doubles the time,
    # and more so as the pairs dominate
    assert 2 < t[1] / t[0] < t[2] / t[1] < 4


def test_cached_context_costs_attention_but_no_compute() -> None:
    model = CostModel(LLAMA7, A100_80)
    alone = model.breakdown(prefill_shape(512))
    warm = model.breakdown(
        BatchShape.of(prefill_chunks=[(512, 3000)], num_blocks_walked=220)
    )  # 512 new tokens behind 3,000 cached (earlier chunks or prefix hits)
    assert warm["linear"] == alone["linear"]  # nothing recomputed
    assert warm["prefill_attention"] > 2 * alone["prefill_attention"]  # n*c pairs, c read


def test_smaller_blocks_walk_more_entries_and_cost_more() -> None:
    model = CostModel(LLAMA7, A100_80)
    times = [model.step_time(decode_shape(64, 1000, bs)) for bs in (1, 8, 16, 32, 128)]
    assert times == sorted(times, reverse=True)
    assert len(set(times)) == len(times)
    # At block size 16 paging costs a noticeable but minor share of decode attention (the vLLM
    # paper measured 20-26% kernel overhead); at block size 1 it dominates.
    parts16 = model.breakdown(decode_shape(64, 1000, 16))
    parts1 = model.breakdown(decode_shape(64, 1000, 1))
    assert 0.1 < parts16["block_walk"] / parts16["decode_attention"] < 0.5
    assert parts1["block_walk"] > parts1["decode_attention"]


def test_tp_splits_compute_and_adds_allreduce() -> None:
    one = CostModel(LLAMA7, A100_80, tp=1)
    two = CostModel(LLAMA7, A100_80, tp=2)
    shape = prefill_shape(2000)
    parts1, parts2 = one.breakdown(shape), two.breakdown(shape)
    assert parts1["allreduce"] == 0.0
    assert parts2["linear"] == pytest.approx(parts1["linear"] / 2, rel=0.05)
    # 2 all-reduces per layer of tokens x hidden x 2 bytes, by the fitted DGX A100 protocols.
    message = 2000 * 4096 * 2
    fitted = float(allreduce_time(two.coefficients.allreduce, A100_80, 2, message))
    assert parts2["allreduce"] == pytest.approx(2 * 32 * fitted, rel=1e-9)
    assert 2 * 32 * message / 300e9 < parts2["allreduce"]  # slower than the link's peak
    decode = decode_shape(64, 1000)
    assert two.breakdown(decode)["allreduce"] > 0
    assert two.step_time(decode) < one.step_time(decode)


def test_faster_gpus_are_faster() -> None:
    shape = decode_shape(64, 1000)
    times = {name: CostModel(LLAMA7, gpu).step_time(shape) for name, gpu in GPU_PRESETS.items()}
    assert times["l4"] > times["a100-40gb"] > times["a100-80gb"] > times["h100-sxm"] > times["h200"]


def test_gqa_reads_less_kv_than_mha() -> None:
    mha = CostModel(LLAMA7, A100_80).breakdown(decode_shape(64, 1000))
    gqa = CostModel(MODEL_PRESETS["llama-3-8b"], A100_80).breakdown(decode_shape(64, 1000))
    # a quarter of the K/V bytes (8 KV heads, not 32); fewer thread blocks too
    assert 0.2 * mha["decode_attention"] < gqa["decode_attention"] < 0.35 * mha["decode_attention"]


def test_presets_use_their_shipped_coefficients_and_say_so() -> None:
    model = CostModel(LLAMA7, A100_80)
    assert model.coefficients == preset_coefficients("a100-80gb")
    described = model.describe()
    assert described["coefficients_source"] == (
        "kvsim/costmodel/gpu_coefficients/a100-80gb.json (shipped preset)"
    )
    coefficients = described["coefficients"]
    assert isinstance(coefficients, dict)
    assert coefficients["provenance"]["linear"]["kind"] == "fitted"
    h200 = CostModel(LLAMA7, GPU_PRESETS["h200"]).describe()["coefficients"]
    assert isinstance(h200, dict) and h200["provenance"]["linear"]["kind"] == "scaled"


def test_coefficients_from_a_file(tmp_path: Path) -> None:
    data = json.loads(json.dumps(CostModel(LLAMA7, A100_80).describe()["coefficients"]))
    data["overheads"]["step_overhead_s"] = 0.01
    path = tmp_path / "coefficients.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    coefficients = load_coefficients(path)
    shape = decode_shape(64, 1000)
    default = CostModel(LLAMA7, A100_80).step_time(shape)
    tuned = CostModel(LLAMA7, A100_80, coefficients=coefficients)
    assert tuned.step_time(shape) - default == pytest.approx(0.01 - 0.003)
    assert tuned.describe()["coefficients_source"] == str(path)
    save_coefficients(coefficients, tmp_path / "again.json")
    assert load_coefficients(tmp_path / "again.json") == coefficients


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["overheads"].update(step_overhead=0.01), "unknown key 'step_overhead'"),
        (lambda d: d["linear"]["gemm"].update(flops_efficiency=0), "flops_efficiency"),
        (lambda d: d["overheads"].update(block_walk_s=-1e-9), "overheads.block_walk_s"),
        (lambda d: d["overheads"].update(seq_overhead_s="20us"), "overheads.seq_overhead_s"),
        (lambda d: d.pop("allreduce"), "missing key 'allreduce'"),
    ],
)
def test_coefficient_files_are_strict(tmp_path: Path, edit: Any, message: str) -> None:
    data = json.loads(json.dumps(CostModel(LLAMA7, A100_80).describe()["coefficients"]))
    edit(data)
    path = tmp_path / "coefficients.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CostModelError, match=message) as info:
        load_coefficients(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_an_old_override_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"step_overhead_s": 0.01, "mfu_efficiency": 1}), encoding="utf-8")
    with pytest.raises(CostModelError, match=r"no 'format' key.*kvsim calibrate"):
        load_coefficients(path)


def test_a_gpu_without_shipped_coefficients_needs_a_file() -> None:
    custom = GPUSpec(
        name="my-gpu",
        memory_bytes=80 << 30,
        hbm_bandwidth=3e12,
        peak_flops=900e12,
        interconnect_bandwidth=400e9,
    )
    with pytest.raises(CostModelError, match="'my-gpu' has no shipped step-time coefficients"):
        CostModel(LLAMA7, custom)
    # Named after a preset, a spec file gets that preset's efficiencies on its own peaks.
    faster = dataclasses.replace(A100_80, hbm_bandwidth=2 * A100_80.hbm_bandwidth)
    shape = decode_shape(64, 1000)
    assert CostModel(LLAMA7, faster).step_time(shape) < CostModel(LLAMA7, A100_80).step_time(shape)


def test_describe_is_json_and_rebuilds_the_same_model() -> None:
    model = CostModel(MODEL_PRESETS["llama-2-70b"], A100_80, tp=2)
    described = json.loads(json.dumps(model.describe()))
    assert described["tp"] == 2
    assert described["model"]["name"] == "llama-2-70b"
    assert described["gpu"]["name"] == "a100-80gb"
    assert described["per_gpu"]["kv_heads_per_gpu"] == 4
    rebuilt = CostModel(
        ModelSpec(**described["model"]),
        GPUSpec(**described["gpu"]),
        tp=described["tp"],
        coefficients=coefficients_from_json_dict(described["coefficients"], "config.json"),
    )
    shape = decode_shape(100, 700)
    assert rebuilt.step_time(shape) == model.step_time(shape)


def test_cost_model_rejects_incompatible_tp() -> None:
    with pytest.raises(CostModelError, match="tp=3"):
        CostModel(LLAMA7, A100_80, tp=3)


def test_batch_shape_is_immutable() -> None:
    shape = decode_shape(1, 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.num_seqs = 2  # type: ignore[misc]
