"""Mixture-of-experts models: spec, parameter counts, memory plan, routing counts, step prices,
Hugging Face config reading and what is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.costmodel import (
    MODEL_PRESETS,
    BatchShape,
    CostModel,
    CostModelError,
    ModelSpec,
    estimate_num_params,
    model_spec_from_hf_config,
    plan_num_blocks,
    resolve_gpu,
    shard_model,
)
from kvsim.costmodel.moe import expected_experts_touched

MIXTRAL = MODEL_PRESETS["mixtral-8x7b"]
QWEN3_MOE = MODEL_PRESETS["qwen3-30b-a3b"]
H100 = resolve_gpu("h100-sxm")

# mistralai/Mixtral-8x7B-v0.1's config.json (the keys kvsim reads, as published).
MIXTRAL_CONFIG = {
    "_name_or_path": "mistralai/Mixtral-8x7B-v0.1",
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rope_theta": 1e6,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

# Qwen/Qwen3-30B-A3B's config.json (the keys kvsim reads).
QWEN3_MOE_CONFIG = {
    "_name_or_path": "Qwen/Qwen3-30B-A3B",
    "model_type": "qwen3_moe",
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

# Qwen/Qwen1.5-MoE-A2.7B: 60 experts of 1408, top 4, and a shared expert of 5632.
QWEN2_MOE_CONFIG = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "max_position_embeddings": 8192,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "shared_expert_intermediate_size": 5632,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}


def _write(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _dense(model: ModelSpec, experts: int, name: str) -> ModelSpec:
    """``model`` with its MoE MLP replaced by one dense MLP as wide as ``experts`` experts."""
    width = experts * model.moe_intermediate_size
    return dataclasses.replace(
        model,
        name=name,
        intermediate_size=width,
        num_experts=0,
        num_experts_per_tok=0,
        moe_intermediate_size=0,
        num_params=estimate_num_params(
            num_layers=model.num_layers,
            hidden_size=model.hidden_size,
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            intermediate_size=width,
            vocab_size=model.vocab_size,
        ),
    )


# --- spec and memory -----------------------------------------------------------------------


def test_mixtral_counts_46_7b_parameters_12_9b_active_and_llama_sized_kv() -> None:
    assert MIXTRAL.num_params == 46_702_792_704  # model card: 46.7B
    assert MIXTRAL.active_params == 12_879_925_248  # model card: 12.9B per token
    assert MIXTRAL.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2  # layers x kv heads x dim x K,V x 2 B
    assert MIXTRAL.expert_params == 32 * 8 * 3 * 4096 * 14336
    # The architecture formula (what a config.json gets) reproduces the checkpoint's count.
    fields = ("num_experts", "moe_intermediate_size", "shared_expert_intermediate_size")
    estimate = estimate_num_params(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=32000, **{f: getattr(MIXTRAL, f) for f in fields},
    )  # fmt: skip
    assert estimate == MIXTRAL.num_params


def test_qwen3_moe_counts_30_5b_parameters_3_3b_active() -> None:
    assert QWEN3_MOE.num_params == 30_532_122_624
    assert QWEN3_MOE.active_params == 3_353_032_704
    assert QWEN3_MOE.kv_bytes_per_token == 48 * 4 * 128 * 2 * 2


def test_memory_plan_holds_every_expert_split_over_tp() -> None:
    plan = plan_num_blocks(MIXTRAL, H100, 16, tp=2)
    # All 46.7B parameters resident: half of each expert, attention and embeddings per GPU; the
    # KV projections split (8 heads over 2) and the 1M router weights replicated.
    router = 32 * 4096 * 8
    assert plan.weight_bytes == ((MIXTRAL.num_params - router) // 2 + router) * 2
    assert plan.weight_bytes > 0.49 * MIXTRAL.weight_bytes  # not the 12.9B active ones
    assert plan.block_bytes == 16 * MIXTRAL.kv_bytes_per_token // 2
    assert plan.num_blocks > 0
    # 93 GB of weights do not fit one H100; the message names the tp that does.
    with pytest.raises(CostModelError, match="use --tp 2"):
        plan_num_blocks(MIXTRAL, H100, 16, tp=1)
    # Qwen3-30B-A3B's 61 GB fit one.
    assert plan_num_blocks(QWEN3_MOE, H100, 16, tp=1).num_blocks > 0


def test_tp_shards_experts_like_a_dense_mlp() -> None:
    one, two = shard_model(MIXTRAL, 1), shard_model(MIXTRAL, 2)
    assert one.weight_bytes_per_gpu == MIXTRAL.weight_bytes
    assert two.weight_bytes_per_gpu == pytest.approx(MIXTRAL.weight_bytes / 2, rel=1e-4)


# --- routing counts ------------------------------------------------------------------------


def test_expected_experts_touched_matches_uniform_routing() -> None:
    assert expected_experts_touched(8, 2, 0) == 0.0
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts_touched(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))
    assert expected_experts_touched(8, 2, 64) == pytest.approx(8.0, abs=1e-6)
    counts = np.arange(0, 300)
    touched = np.asarray(expected_experts_touched(128, 8, counts))
    assert np.all(np.diff(touched) > 0) and touched[-1] < 128
    # Against sampled routing: each token picks k distinct experts uniformly at random.
    rng = np.random.default_rng(7)
    trials = 4000
    for experts, k, n in ((8, 2, 3), (128, 8, 20), (60, 4, 40)):
        # each of n tokens of each trial: the k first of a random order of the experts
        choices = rng.random((trials, n, experts)).argsort(axis=2)[:, :, :k]
        touched_in_trial = np.zeros((trials, experts), dtype=bool)
        np.put_along_axis(touched_in_trial, choices.reshape(trials, n * k), True, axis=1)
        picks = touched_in_trial.sum(axis=1)
        assert expected_experts_touched(experts, k, n) == pytest.approx(np.mean(picks), rel=0.01)


# --- step prices ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_small_decode_costs_between_the_active_and_the_whole_dense_model(batch: int) -> None:
    active = CostModel(_dense(MIXTRAL, 2, "dense-active"), H100, tp=2)
    whole = CostModel(_dense(MIXTRAL, 8, "dense-all"), H100, tp=2)
    moe = CostModel(MIXTRAL, H100, tp=2)
    shape = BatchShape.decode(batch, batch * 1000, batch * 63)
    assert active.step_time(shape) < moe.step_time(shape) < whole.step_time(shape)


def test_decode_weight_reads_grow_with_the_experts_a_batch_touches() -> None:
    moe = CostModel(MIXTRAL, H100, tp=2)
    linear = [moe.linear_time_s(n) for n in (1, 2, 4, 8, 16)]
    assert linear == sorted(linear)
    # From 1 token (2 experts read) to 16 (all 8 read): expert reads grow ~4x, the rest stays.
    assert linear[-1] / linear[0] > 2.5
    whole = CostModel(_dense(MIXTRAL, 8, "dense-all"), H100, tp=2)
    # Once every expert is touched, a decode reads what the dense model of all experts reads.
    assert moe.linear_time_s(64) == pytest.approx(whole.linear_time_s(64), rel=0.1)


def test_prefill_pays_the_active_flops_not_all_experts() -> None:
    active = CostModel(_dense(MIXTRAL, 2, "dense-active"), H100, tp=2)
    whole = CostModel(_dense(MIXTRAL, 8, "dense-all"), H100, tp=2)
    moe = CostModel(MIXTRAL, H100, tp=2)
    shape = BatchShape.of(prefill_chunks=[(4096, 0)])
    assert active.step_time(shape) < moe.step_time(shape) < 0.5 * whole.step_time(shape)
    assert moe.step_time(shape) == pytest.approx(active.step_time(shape), rel=0.15)


def test_moe_decode_closure_prices_as_step_time_of() -> None:
    moe = CostModel(QWEN3_MOE, H100, tp=2)
    closure = moe.decode_step_time_fn()
    for n in (1, 7, 300, 1500):
        assert closure(n, n * 900, n * 57) == moe.step_time_of(n, n, n, n * 900, 0, 0, 0, n * 57)


# --- Hugging Face configs ------------------------------------------------------------------


def test_mixtral_config_json_reads_as_the_preset(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, MIXTRAL_CONFIG))
    assert spec == dataclasses.replace(MIXTRAL, name="Mixtral-8x7B-v0.1")


def test_qwen3_moe_config_json_reads_its_experts(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, QWEN3_MOE_CONFIG))
    expected = dataclasses.replace(QWEN3_MOE, name="Qwen3-30B-A3B", num_params=spec.num_params)
    assert spec == expected
    # The estimate leaves out the per-head q/k norms (48 x 2 x 128 weights).
    assert QWEN3_MOE.num_params - spec.num_params == 48 * 2 * 128


def test_qwen2_moe_config_json_counts_its_shared_expert(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, QWEN2_MOE_CONFIG))
    assert (spec.num_experts, spec.num_experts_per_tok) == (60, 4)
    assert spec.shared_expert_intermediate_size == 5632
    # Qwen1.5-MoE-A2.7B's 14,315,784,192 parameters, less its QKV biases (24 x 3 x 2048).
    assert spec.num_params == 14_315_784_192 - 24 * 3 * 2048
    cost = CostModel(spec, H100, tp=1)
    assert cost.linear_time_s(8) > 0
    plain = dataclasses.replace(spec, shared_expert_intermediate_size=0)
    assert cost.linear_time_s(8) > CostModel(plain, H100, tp=1).linear_time_s(8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_experts_per_tok": 9}, "'num_experts_per_tok' \\(9\\) must be at most"),
        ({"num_experts_per_tok": 0}, "'num_experts_per_tok' must be a positive integer"),
        ({"num_experts_per_tok": None}, "missing key 'num_experts_per_tok'"),
        ({"num_local_experts": None}, "missing key 'num_local_experts'"),
        ({"num_local_experts": 2.5}, "'num_local_experts' must be a positive integer"),
        ({"model_type": "deepseek_v3", "n_routed_experts": 256}, "'deepseek_v3' is not model"),
        ({"model_type": "qwen3_moe", "decoder_sparse_step": 2}, "'decoder_sparse_step' must be 1"),
        ({"model_type": "qwen3_moe", "mlp_only_layers": [0]}, "'mlp_only_layers' must be empty"),
        ({"model_type": "qwen2_moe"}, "missing key 'shared_expert_intermediate_size'"),
    ],
)
def test_bad_moe_configs_are_refused_in_one_line(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    config = {**MIXTRAL_CONFIG, "num_experts": 8, "moe_intermediate_size": 14336}
    config.update(change)
    config = {key: value for key, value in config.items() if value is not None}
    with pytest.raises(CostModelError, match=message) as info:
        model_spec_from_hf_config(_write(tmp_path, config))
    assert "\n" not in str(info.value)
    assert "config.json" in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_experts_per_tok": 2}, "num_experts_per_tok \\(2\\) needs num_experts > 0"),
        ({"num_experts": 4, "num_experts_per_tok": 5, "moe_intermediate_size": 8}, "in 1..num"),
        ({"num_experts": 4, "num_experts_per_tok": 1}, "moe_intermediate_size must be a positive"),
        ({"num_experts": -1}, "num_experts must be an integer >= 0"),
        ({"num_experts": True}, "num_experts must be an integer >= 0"),
    ],
)
def test_bad_moe_specs_are_refused(fields: dict[str, object], message: str) -> None:
    dense = MODEL_PRESETS["mistral-7b"]
    with pytest.raises(CostModelError, match=message):
        dataclasses.replace(dense, **fields)  # type: ignore[arg-type]


# --- the CLI -------------------------------------------------------------------------------


def test_kvsim_run_mixtral_on_two_h100s_runs_the_default_trace(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvsim.cli import app

    out = tmp_path / "run"
    args = ["run", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--tp", "2", "--no-plots"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == summary["num_requests"] == 456
    resolved = json.loads((out / "config.json").read_text())["resolved"]
    assert resolved["cost_model"]["model"]["num_experts"] == 8
    plan = resolved["memory_plan"]
    assert plan["weight_bytes"] == shard_model(MIXTRAL, 2).weight_bytes_per_gpu
    assert plan["block_bytes"] == 16 * MIXTRAL.kv_bytes_per_token // 2
    # Tens of ms per output token, as two H100s decode Mixtral (vLLM PR #2979: 12-33 ms).
    assert 5e-3 < summary["tpot_s"]["mean"] < 0.1
    # One GPU cannot hold it: one line, exit 2, the tp that fits named.
    refused = CliRunner().invoke(app, [*args[:-3], "--tp", "1", "--out", str(tmp_path / "x")])
    assert refused.exit_code == 2
    assert "use --tp 2" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
