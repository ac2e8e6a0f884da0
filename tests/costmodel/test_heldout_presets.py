"""The presets for the sim-to-real study's other deployments (docs/costmodel.md, "Held-out
runs"): CodeLlama-34B, Qwen3-14B, Mixtral-8x22B, Llama 4 Scout (FP8 experts) and the L40S.

Every expected number below is written out from the model's config.json (cited in
kvsim/costmodel/modelspec.py), not computed by the code under test."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.costmodel import (
    GPU_PRESETS,
    MODEL_PRESETS,
    CostModel,
    CostModelError,
    model_spec_from_hf_config,
    plan_num_blocks,
)
from kvsim.costmodel.coefficients import preset_coefficients

H100 = GPU_PRESETS["h100-sxm"]
# The study's limits (benchmarks/data/heldout_real_runs.json): they size the activation reserve.
LIMITS = {"max_num_batched_tokens": 2048, "max_num_seqs": 128}


def _llama_params(layers: int, hidden: int, heads: int, kv: int, head: int, mlp: int) -> int:
    """One dense llama-style stack's matrices and norms (no embeddings)."""
    return layers * (
        2 * hidden * heads * head + 2 * hidden * kv * head + 3 * hidden * mlp + 2 * hidden
    )


def test_codellama_34b_from_its_config() -> None:
    # 48 layers, hidden 8192, 64 heads / 8 KV heads of 128, MLP 22016, vocab 32000, untied.
    spec = MODEL_PRESETS["codellama-34b"]
    params = 2 * 32000 * 8192 + _llama_params(48, 8192, 64, 8, 128, 22016) + 8192
    assert spec.num_params == params == 33_743_970_304
    assert spec.weight_bytes == 2 * params
    assert spec.kv_bytes_per_token == 2 * 48 * 8 * 128 * 2 == 196_608
    plan = plan_num_blocks(spec, H100, 16, tp=2, **LIMITS)
    assert plan.weight_bytes == params  # half of the bf16 bytes: everything splits 2 ways
    assert plan.block_bytes == 16 * 196_608 // 2
    # Real vLLM 0.15.1 logged 425,648 tokens = 26,603 blocks for this deployment.
    assert plan.num_blocks == pytest.approx(26_603, rel=0.02)


def test_codellama_34b_preset_is_the_heldout_figures_config(tmp_path: Path) -> None:
    # benchmarks/data/heldout_real_runs.json describes CodeLlama-34B by its config.json (it
    # predates the preset); the two must be the same model, so either prices the same runs.
    figures = Path(__file__).parents[2] / "benchmarks" / "data" / "heldout_real_runs.json"
    config = json.loads(figures.read_text(encoding="utf-8"))["model_configs"]["codellama-34b"]
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert (
        model_spec_from_hf_config(tmp_path, name="codellama-34b")
        == (MODEL_PRESETS["codellama-34b"])
    )


def test_qwen3_14b_from_its_config() -> None:
    # 40 layers, hidden 5120, 40 heads / 8 KV heads, head_dim 128 (given), MLP 17408,
    # vocab 151936, untied; per-head q/k RMSNorm weights (2 x 128 a layer).
    spec = MODEL_PRESETS["qwen3-14b"]
    params = 2 * 151936 * 5120 + _llama_params(40, 5120, 40, 8, 128, 17408) + 40 * 256 + 5120
    assert spec.num_params == params == 14_768_307_200
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (40, 8, 128)
    assert not spec.tie_word_embeddings
    assert spec.weight_bytes == 2 * params
    assert spec.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2 == 163_840
    plan = plan_num_blocks(spec, GPU_PRESETS["l40s"], 16, **LIMITS)
    assert plan.weight_bytes == 2 * params
    assert plan.block_bytes == 16 * 163_840
    assert plan.num_blocks > 4096 // 16  # a 4,096-token sequence fits one L40S


def test_mixtral_8x22b_from_its_config() -> None:
    # 56 layers, hidden 6144, 48 heads / 8 KV heads, 8 experts of 16384, top 2, vocab 32768.
    spec = MODEL_PRESETS["mixtral-8x22b"]
    router = 56 * 6144 * 8
    per_layer = 2 * 6144 * 6144 + 2 * 6144 * 1024 + 8 * 3 * 6144 * 16384 + 6144 * 8 + 2 * 6144
    params = 2 * 32768 * 6144 + 56 * per_layer + 6144
    assert spec.num_params == params == 140_630_071_296
    assert spec.active_params == params - 56 * 6 * 3 * 6144 * 16384
    assert spec.kv_bytes_per_token == 2 * 56 * 8 * 128 * 2 == 229_376
    plan = plan_num_blocks(spec, H100, 16, tp=8, **LIMITS)
    assert plan.weight_bytes == ((params - router) // 8 + router) * 2  # router replicated
    assert plan.block_bytes == 16 * 229_376 // 8
    # 281 GB of bf16 weights: four H100s hold them (65.5 GiB each), two do not.
    assert plan_num_blocks(spec, H100, 16, tp=4, **LIMITS).num_blocks > 0
    with pytest.raises(CostModelError, match="use --tp 4"):
        plan_num_blocks(spec, H100, 16, tp=2, **LIMITS)


def test_llama_4_scout_fp8_experts_from_its_config() -> None:
    # text_config: 48 layers, hidden 5120, 40 heads / 8 KV heads of 128, 16 routed experts of
    # 8192, top 1, a shared expert of 8192 (no gate), vocab 202048, untied.
    fp8, bf16 = MODEL_PRESETS["llama-4-scout-17b-16e"], MODEL_PRESETS["llama-4-scout-17b-16e-bf16"]
    experts = 48 * 17 * 3 * 5120 * 8192  # routed and shared, stored in FP8 (1 byte)
    router = 48 * 5120 * 16
    per_layer = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 17 * 3 * 5120 * 8192 + 5120 * 16 + 2 * 5120
    text = 2 * 202048 * 5120 + 48 * per_layer + 5120
    # vision_config: 34 layers of hidden 1408 (attention and MLP of 5632, with biases, two
    # LayerNorms), patch 14 of 336 px images (577 positions), pixel-shuffle adapter to 4096,
    # projector 4096 -> 5120; all bf16.
    vision_layer = 4 * (1408 * 1408 + 1408) + 2 * 1408 * 5632 + 5632 + 1408 + 4 * 1408
    vision = 34 * vision_layer + 3 * 14 * 14 * 1408 + 1408 + 577 * 1408 + 4 * 1408
    vision += 4 * 1408 * 4096 + 4096 * 4096 + 4096 * 5120
    params = text + vision
    assert (text, vision) == (107_769_861_120, 871_932_416)
    assert fp8.num_params == bf16.num_params == params == 108_641_793_536  # the checkpoint's
    assert fp8.active_params == params - 48 * 15 * 3 * 5120 * 8192  # 17.2B text + the tower
    assert bf16.weight_bytes == 2 * params
    assert fp8.weight_bytes == 2 * (params - experts) + experts == 114_607_025_152
    assert fp8.kv_bytes_per_token == 2 * 48 * 8 * 128 * 2 == 196_608  # the cache stays bf16
    plan = plan_num_blocks(fp8, H100, 16, tp=2, **LIMITS)
    assert plan.weight_bytes == ((params - router) // 2 + router) * 2 - experts // 2
    assert plan.block_bytes == 16 * 196_608 // 2
    # FP8 fits two H100s; the bf16 checkpoint needs four.
    with pytest.raises(CostModelError, match="use --tp 4"):
        plan_num_blocks(bf16, H100, 16, tp=2, **LIMITS)


def test_fp8_experts_read_half_the_bytes_of_bf16_ones() -> None:
    fp8, bf16 = MODEL_PRESETS["llama-4-scout-17b-16e"], MODEL_PRESETS["llama-4-scout-17b-16e-bf16"]
    a, b = CostModel(fp8, H100, tp=4), CostModel(bf16, H100, tp=4)
    decode = (4, 4, 4, 4000, 0, 0, 0, 250)  # four sequences of 1,000 tokens
    assert a.step_time_of(*decode) < b.step_time_of(*decode)
    # Only the expert reads shrink: attention and the LM head are the same.
    assert a.linear_time_s(1) < b.linear_time_s(1)
    assert a.linear_time_s(1) > 0.5 * b.linear_time_s(1)


def test_l40s_is_a_pcie_card_with_its_datasheet_peaks() -> None:
    l40s = GPU_PRESETS["l40s"]
    assert l40s.memory_bytes == 46068 << 20  # nvidia-smi's total
    assert (l40s.hbm_bandwidth, l40s.peak_flops) == (864e9, 362.05e12)  # dense bf16
    assert l40s.interconnect_bandwidth == GPU_PRESETS["l4"].interconnect_bandwidth == 32e9
    co = preset_coefficients("l40s")
    assert co.num_sms == 142
    assert all(p.kind == "scaled" for p in (co.provenance[k] for k in ("linear", "attention")))
    assert co.allreduce.custom is None  # NCCL lines over PCIe: no custom all-reduce priced


@pytest.mark.parametrize(
    ("model", "gpu", "tp"),
    [
        ("codellama-34b", "h100-sxm", 2),
        ("qwen3-14b", "h100-sxm", 1),
        ("qwen3-14b", "l40s", 1),
        ("llama-3.1-8b", "l40s", 1),
        ("mixtral-8x22b", "h100-sxm", 8),
        ("llama-4-scout-17b-16e", "h100-sxm", 2),
    ],
)
def test_each_preset_runs_a_tiny_trace(tmp_path: Path, model: str, gpu: str, tp: int) -> None:
    trace = tmp_path / "tiny.jsonl"
    rows = (
        {"request_id": str(i), "arrival_time_s": i * 0.05, "prompt_tokens": 600, "output_tokens": 8}
        for i in range(4)
    )
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    args = ["run", str(trace), "--model", model, "--gpu", gpu, "--tp", str(tp)]
    args += ["--max-model-len", "4096", "--max-num-batched-tokens", "2048", "--no-plots"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == summary["num_requests"] == 4
    assert 1e-3 < summary["tpot_s"]["mean"] < 0.2
    resolved = json.loads((out / "config.json").read_text())["resolved"]
    assert resolved["cost_model"]["model"]["name"] == model


@pytest.mark.parametrize(
    ("model", "value", "message"),
    [
        ("qwen3-14b", 1, "expert_weight_bytes \\(1\\) needs num_experts > 0"),
        ("mixtral-8x22b", 3, "expert_weight_bytes must be 0 \\(as dtype_bytes\\), 1, 2 or 4"),
        ("mixtral-8x22b", -1, "expert_weight_bytes must be an integer >= 0"),
    ],
)
def test_bad_expert_weight_bytes_are_refused(model: str, value: int, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        dataclasses.replace(MODEL_PRESETS[model], expert_weight_bytes=value)


def test_run_folders_name_expert_weight_bytes_only_where_set() -> None:
    described = CostModel(MODEL_PRESETS["llama-4-scout-17b-16e"], H100, tp=2).describe()
    assert described["model"]["expert_weight_bytes"] == 1  # type: ignore[index]
    dense = CostModel(MODEL_PRESETS["qwen3-14b"], H100).describe()
    assert "expert_weight_bytes" not in dense["model"]  # type: ignore[operator]
