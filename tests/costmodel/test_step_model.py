"""CostModel on fitted coefficients: linear_time_s for any model and tp, monotone; the decode
closure's bits; mixed steps; the shipped files are what the fitter makes of the shipped profiles."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.costmodel import (
    GPU_PRESETS,
    MODEL_PRESETS,
    BatchShape,
    CostModel,
    ModelSpec,
    resolve_gpu,
    resolve_model,
)
from kvsim.costmodel.coefficients import StepCoefficients, load_coefficients, save_coefficients
from kvsim.costmodel.terms import linear_layer_time


def _heads_tps(model: ModelSpec) -> list[int]:
    """Every tp that divides the query heads (vLLM's KV-head rule not required)."""
    return [tp for tp in range(1, model.num_heads + 1) if model.num_heads % tp == 0]


def _assert_monotone(model: ModelSpec, gpu_name: str, tp: int) -> None:
    cost = CostModel(model, resolve_gpu(gpu_name), tp=tp)
    # The whole 1..16384 curve at once, and the public call at a few of its points.
    tokens = np.arange(1, 16385, dtype=np.float64)
    curve = model.num_layers * linear_layer_time(cost.coefficients, cost.gpu, cost.shapes, tokens)
    assert np.all(np.diff(curve) >= 0), f"{model.name} tp={tp} on {gpu_name}: not monotone"
    for n in (1, 2, 127, 128, 129, 4096, 16384):
        assert cost.linear_time_s(n) == pytest.approx(curve[n - 1], rel=1e-12)
    assert curve[-1] > curve[0] > 0


def test_linear_time_is_monotone_for_every_preset_gpu_and_tp() -> None:
    for gpu_name in GPU_PRESETS:
        for model in MODEL_PRESETS.values():
            for tp in _heads_tps(model):
                _assert_monotone(model, gpu_name, tp)


@settings(max_examples=40, deadline=None)
@given(
    heads_exp=st.integers(0, 7),
    kv_div_exp=st.integers(0, 7),
    head_dim=st.sampled_from([64, 80, 96, 128, 256]),
    inter=st.integers(128, 60000),
    gated=st.booleans(),
    tp_index=st.integers(0, 10),
    gpu=st.sampled_from(sorted(GPU_PRESETS)),
)
def test_linear_time_is_monotone_for_random_architectures(
    heads_exp: int, kv_div_exp: int, head_dim: int, inter: int, gated: bool, tp_index: int,
    gpu: str,
) -> None:  # fmt: skip
    heads = 2**heads_exp
    model = ModelSpec(
        name="random",
        num_layers=3,
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_kv_heads=max(1, heads // 2**kv_div_exp),
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=1000,
        dtype_bytes=2,
        num_params=10**9,
        max_model_len=4096,
        gated_mlp=gated,
    )
    tps = _heads_tps(model)
    _assert_monotone(model, gpu, tps[min(tp_index, len(tps) - 1)])


def test_linear_time_of_a_minimal_hf_config_and_of_a_model_too_big_for_the_gpu(
    tmp_path: Path,
) -> None:
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "intermediate_size": 1376,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    tiny = resolve_model(tmp_path / "config.json")
    for tp in (1, 2, 4, 8):
        assert 0 < CostModel(tiny, resolve_gpu("a100-80gb"), tp=tp).linear_time_s(64) < 1e-3
    # 138 GB of weights on one 24 GB L4: priced, not refused (memory planning is elsewhere).
    big = CostModel(resolve_model("llama-2-70b"), resolve_gpu("l4"))
    assert big.linear_time_s(1) > 128e9 / 300e9  # at least the layer weights read at peak
    # qwen2.5-7b at tp 7: the heads divide, the 4 KV heads do not (vLLM would refuse to start).
    assert CostModel(resolve_model("qwen2.5-7b"), resolve_gpu("h100-sxm"), tp=7).linear_time_s(8)


def test_linear_time_is_the_nine_operator_sum_times_layers(
    presets: dict[str, StepCoefficients],
) -> None:
    from kvsim.costmodel.layer_shapes import LayerShapes
    from kvsim.costmodel.terms import linear_op_times

    model, gpu = resolve_model("llama-3-70b"), resolve_gpu("h100-sxm")
    ops = linear_op_times(presets["h100-sxm"], gpu, LayerShapes.from_model(model, 4), 300.0)
    assert len(ops) == 9
    expected = model.num_layers * sum(float(t) for t in ops.values())
    assert CostModel(model, gpu, tp=4).linear_time_s(300) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="num_tokens must be >= 1"):
        CostModel(model, gpu, tp=4).linear_time_s(0)


def test_decode_closure_is_bit_identical_to_step_time_of() -> None:
    rng = random.Random(7)
    for gpu_name, model_name, tp in (
        ("a100-80gb", "llama-2-7b", 1),
        ("h100-sxm", "llama-3-70b", 8),
        ("l4", "qwen2.5-7b", 4),
        ("h200", "opt-13b", 2),
    ):
        cost = CostModel(resolve_model(model_name), resolve_gpu(gpu_name), tp=tp)
        decode = cost.decode_step_time_fn()
        for _ in range(3000):
            n = rng.choice([rng.randint(1, 300), rng.randint(1, 5000)])  # past the first table
            context = n * rng.randint(1, 8000)
            blocks = context // rng.choice([1, 16, 128]) + n
            expected = cost.step_time_of(n, n, n, context, 0, 0, 0, blocks)
            assert decode(n, context, blocks) == expected


@settings(max_examples=200, deadline=None)
@given(
    num_seqs=st.integers(1, 3000), context=st.integers(1, 10_000_000), blocks=st.integers(0, 10**6)
)
def test_decode_closure_bits_on_random_counts(num_seqs: int, context: int, blocks: int) -> None:
    cost = CostModel(MODEL_PRESETS["llama-2-70b"], GPU_PRESETS["h100-sxm"], tp=4)
    expected = cost.step_time_of(num_seqs, num_seqs, num_seqs, context, 0, 0, 0, blocks)
    assert cost.decode_step_time_fn()(num_seqs, context, blocks) == expected


def test_a_step_does_not_depend_on_what_was_priced_before() -> None:
    model, gpu = MODEL_PRESETS["llama-3-8b"], GPU_PRESETS["a100-80gb"]
    fresh, used = CostModel(model, gpu), CostModel(model, gpu)
    used.step_time_of(9000, 50_000, 9000, 10**7, 0, 0, 0, 10**6)  # grows the tables first
    for shape in (BatchShape.decode(3, 3000, 190), BatchShape.of(prefill_chunks=[(2048, 100)])):
        assert fresh.step_time(shape) == used.step_time(shape)


def test_mixed_step_prices_decodes_and_chunks_over_their_cache() -> None:
    cost = CostModel(MODEL_PRESETS["llama-2-70b"], GPU_PRESETS["a100-80gb"], tp=2)
    decodes = (1200, 800, 3000)
    chunk = (512, 4096)  # 512 new tokens after 4,096 already computed (or prefix hits)
    mixed = BatchShape.of(prefill_chunks=[chunk], decode_contexts=decodes, num_blocks_walked=600)
    assert mixed.num_seqs == 4 and mixed.num_batched_tokens == 515
    assert mixed.num_decode_seqs == 3 and mixed.decode_context_tokens == 5000
    assert mixed.prefill_causal_pairs == 512 * 513 // 2
    assert mixed.prefill_cached_pairs == 512 * 4096 and mixed.prefill_cached_tokens == 4096
    parts = cost.breakdown(mixed)
    assert parts["decode_attention"] > 0 and parts["prefill_attention"] > 0
    assert sum(parts.values()) == pytest.approx(cost.step_time(mixed), rel=1e-12)
    # A prefix hit is not computed: the same 512 new tokens cost more behind a longer cache
    # (attention reads it) but far less than computing the cached tokens too.
    cold = BatchShape.of(prefill_chunks=[(4608, 0)], num_blocks_walked=288)
    warm = BatchShape.of(prefill_chunks=[(512, 4096)], num_blocks_walked=288)
    alone = BatchShape.of(prefill_chunks=[(512, 0)], num_blocks_walked=32)
    assert cost.step_time(alone) < cost.step_time(warm) < cost.step_time(cold) / 3


def test_shipped_coefficient_files_are_what_the_fitter_makes_of_the_shipped_profiles(
    refitted: dict[str, StepCoefficients], presets: dict[str, StepCoefficients], tmp_path: Path
) -> None:
    assert set(refitted) == set(presets) == set(GPU_PRESETS)
    for name, co in refitted.items():
        assert co == presets[name], f"{name}: refit differs; regenerate with kvsim calibrate"
        save_coefficients(co, tmp_path / f"{name}.json")
        assert load_coefficients(tmp_path / f"{name}.json") == co
    assert presets["h200"].provenance["linear"].kind == "scaled"
    assert presets["h100-sxm"].provenance["linear"].kind == "fitted"
    assert presets["h100-sxm"].provenance["attention"].kind == "scaled"
    assert presets["a100-80gb"].provenance["overheads"].kind == "prior"
    assert np.isfinite(presets["l4"].gemm.flops_efficiency)
