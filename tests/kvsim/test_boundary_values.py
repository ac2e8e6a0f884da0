"""Issue 31: values vLLM (or kvsim's own clock) gives no meaning to are refused at the
boundary with one line naming the option, exit code 2, and nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.errors import KvsimError

QUICK = ("--until", "1", "--no-plots")


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result: Result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--rate", "1e308"], ["rate must be at most", "1e+308"]),
        (["--rate", "2e6"], ["rate must be at most"]),
        (["--max-num-batched-tokens", "100", "--max-model-len", "4096",
          "--no-enable-chunked-prefill"],
         ["--max-num-batched-tokens 100 is below --max-model-len 4096", "chunked prefill"]),
        # vLLM's SchedulerConfig.verify_max_model_len: both given, or the GPU's default budget
        (["--max-num-batched-tokens", "100", "--max-num-seqs", "101"],
         ["--max-num-batched-tokens 100 is below --max-num-seqs 101"]),
        (["--max-num-seqs", "4096"],
         ["--max-num-batched-tokens 2,048 (the default for this GPU) is below --max-num-seqs"]),
        (["--long-prefill-token-threshold", "5000"],
         ["--long-prefill-token-threshold 5,000 is above max_model_len 4,096"]),
        (["--long-prefill-token-threshold", "600", "--max-model-len", "512"],
         ["--long-prefill-token-threshold 600 is above --max-model-len 512"]),
    ],
)  # fmt: skip
def test_meaningless_run_options_are_refused(
    args: list[str], fragments: list[str], tmp_path: Path
) -> None:
    one_error_line(kvsim("run", *QUICK, *args, "--out", tmp_path / "r"), *fragments)
    assert os.listdir(tmp_path) == []


def test_the_same_limits_with_chunked_prefill_or_room_are_accepted() -> None:
    t = "azure_llm_2023_conv"
    RunConfig(trace=t, max_num_batched_tokens=100, max_model_len=4096)  # chunks fit any budget
    RunConfig(trace=t, max_num_batched_tokens=4096, max_model_len=4096,
              enable_chunked_prefill=False)  # fmt: skip
    RunConfig(trace=t, rate=1e6)
    with pytest.raises(KvsimError, match="below --max-model-len"):
        RunConfig(trace=t, max_num_batched_tokens=4095, max_model_len=4096,
                  enable_chunked_prefill=False)  # fmt: skip


def test_a_max_model_len_past_the_model_is_refused_unless_allowed(tmp_path: Path) -> None:
    """vLLM 0.33 refuses max_model_len above the model's derived context unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vllm/config/model.py, _get_and_verify_max_len);
    --allow-long-max-model-len is kvsim's opt-in, kept in config.json for --config reruns."""
    line = one_error_line(
        kvsim("run", *QUICK, "--max-model-len", "4097", "--out", tmp_path / "r"),
        "--max-model-len 4,097 is beyond the model's context of 4,096 tokens",
        "--allow-long-max-model-len",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
    )
    assert line and os.listdir(tmp_path) == []
    at_limit = kvsim("run", *QUICK, "--max-model-len", "4096", "--out", tmp_path / "r")
    assert at_limit.exit_code == 0 and "what-if" not in at_limit.output, at_limit.output
    allowed = tmp_path / "a"
    result = kvsim("run", *QUICK, "--max-model-len", "4097", "--allow-long-max-model-len",
                   "--out", allowed)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "beyond the model's context of 4,096 tokens: simulated as a what-if" in result.output
    config = json.loads((allowed / "config.json").read_text())
    assert config["options"]["allow_long_max_model_len"] is True
    assert config["resolved"]["max_model_len"] == 4097
    again = kvsim("run", "--config", allowed / "config.json", "--out", tmp_path / "b")
    assert again.exit_code == 0, again.output


def test_a_sweep_point_past_the_models_context_is_refused_before_any_runs(
    tmp_path: Path,
) -> None:
    args = ("--until", "1", "--param", "max_model_len=2048,9000", "--out", tmp_path / "s")
    one_error_line(
        kvsim("sweep", *args),
        "point max_model_len=9000: --max-model-len 9,000 is beyond the model's context",
    )
    assert os.listdir(tmp_path) == []


def test_max_model_len_1_is_accepted_as_vllm_accepts_it(tmp_path: Path) -> None:
    """vLLM's only floor is max_model_len >= 1 (ModelConfig's validator), so kvsim keeps
    accepting 1: every request is rejected (no room for one output token), each counted."""
    out = tmp_path / "r"
    result = kvsim("run", "--until", "5", "--no-plots", "--max-model-len", "1", "--out", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] > 0 and summary["num_finished"] == 0
    assert summary["num_rejected"] == summary["num_requests"]
    assert "leaves no room for an output token within max_model_len 1" in result.output
    with pytest.raises(KvsimError, match="max_model_len must be"):
        RunConfig(trace="azure_llm_2023_conv", max_model_len=0)


@pytest.mark.parametrize(
    "spec", ["linear:1_0:0.001", "linear:0.005:1_0", "linear:nan:1", "linear:infinity:0",
             "linear: 1:0"],
)  # fmt: skip
def test_step_time_takes_plain_decimal_numbers(spec: str, tmp_path: Path) -> None:
    one_error_line(kvsim("run", *QUICK, "--step-time", spec, "--out", tmp_path / "r"),
                   "step_time", "decimal numbers")  # fmt: skip
    assert RunConfig(trace="azure_llm_2023_conv", step_time="linear:0.005:2e-5")


def _coefficients_with(tmp_path: Path, path: tuple[str, ...], value: object) -> Path:
    import json

    root = Path(__file__).resolve().parents[2] / "kvsim" / "costmodel" / "gpu_coefficients"
    data = json.loads((root / "a100-80gb.json").read_text())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    out = tmp_path / f"{'.'.join(path)}-{len(str(value))}.json"
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (("overheads", "block_walk_s"), 1e308, "overheads.block_walk_s: must be at most 3600 s"),
        (("attention", "decode", "latency_s"), 1e308, "attention.decode.latency_s"),
        (("attention", "decode", "bw_efficiency"), 1e-308, "at least 1e-06"),
        (("linear", "gemm", "m_half_tokens"), 1e308, "linear.gemm.m_half_tokens"),
        (("allreduce", "system"), "a100 dgx", "allreduce.system must name"),
        (("allreduce", "system"), "../x", "allreduce.system must name"),
        (("allreduce", "system"), "b200_nvl", "allreduce.system 'b200_nvl' is unknown"),
    ],
)
def test_coefficient_terms_that_overflow_a_step_are_one_line(
    path: tuple[str, ...], value: object, fragment: str, tmp_path: Path
) -> None:
    co = _coefficients_with(tmp_path, path, value)
    result = kvsim("run", "azure_llm_2023_conv_first_2min", "--no-plots", "--coefficients", co,
                   "--out", tmp_path / "r")  # fmt: skip
    one_error_line(result, co.name, fragment)
    assert not (tmp_path / "r").exists()


def test_an_empty_sweep_axis_is_refused(tmp_path: Path) -> None:
    one_error_line(kvsim("sweep", "--block-size", "", "--until", "1", "--out", tmp_path / "s"),
                   "block_size", "empty value")  # fmt: skip
    assert os.listdir(tmp_path) == []


LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
         "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
         "max_position_embeddings": 2048}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"model_type": "bert"}, "'model_type' must name a decoder-only model"),
        ({"model_type": 7}, "'model_type'"),
        ({"rope_scaling": "linear"}, "'rope_scaling' must be an object"),
        ({"rope_scaling": {"factor": 2.0}}, "must name its 'rope_type'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2}}, "'rope_scaling.factor'"),
        ({"rope_scaling": {"type": "dynamic", "factor": True}}, "'rope_scaling.factor'"),
    ],
)
def test_a_hugging_face_config_vllm_would_not_serve_is_one_line(
    extra: dict[str, object], fragment: str, tmp_path: Path
) -> None:
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA, **extra}))
    one_error_line(kvsim("run", *QUICK, "--model", config, "--out", tmp_path / "r"),
                   "config.json", fragment)  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [{"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
     {"rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}},
     {"rope_scaling": None}, {"model_type": "qwen2"},
     {"head_dim": 128}],  # Gemma-like: head_dim x heads need not be hidden_size (vLLM too)
)  # fmt: skip
def test_hugging_face_configs_vllm_serves_are_accepted(
    extra: dict[str, object], tmp_path: Path
) -> None:
    import json

    from kvsim.costmodel.hf_config import model_spec_from_hf_config

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA, **extra}))
    assert model_spec_from_hf_config(config).num_layers == 2


def test_default_batch_limits_are_fitted_as_vllm_fits_them() -> None:
    """vLLM 0.33 (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args): without
    chunked prefill a defaulted budget rises to max_model_len, so every prompt that fits the
    model can run; a defaulted max_num_seqs is capped at the budget; given values stay."""
    from kvsim.config import scheduling_limits
    from kvsim.costmodel import resolve_gpu

    a100, t = resolve_gpu("a100-80gb"), "azure_llm_2023_conv"
    served = scheduling_limits(RunConfig(trace=t), a100, 4096)
    assert (served.max_num_batched_tokens, served.max_num_seqs) == (2048, 256)
    whole = scheduling_limits(RunConfig(trace=t, enable_chunked_prefill=False), a100, 4096)
    assert whole.max_num_batched_tokens == 4096
    given = RunConfig(trace=t, enable_chunked_prefill=False, max_num_batched_tokens=4096)
    assert scheduling_limits(given, a100, 8192).max_num_batched_tokens == 4096
    small = scheduling_limits(RunConfig(trace=t, max_num_batched_tokens=64), a100, 4096)
    assert small.max_num_seqs == 64
    short = scheduling_limits(RunConfig(trace=t, max_num_seqs=2), a100, 512)
    assert short.max_num_batched_tokens == 1024  # max_num_seqs x max_model_len


def test_a_run_without_chunked_prefill_admits_prompts_longer_than_the_default_budget() -> None:
    from kvsim.runner import run

    result = run(RunConfig(trace="azure_llm_2023_conv", until=60, enable_chunked_prefill=False))
    assert result.resolved["max_num_batched_tokens"] == 4096
    requests = result.requests
    assert ((requests.prompt_tokens > 2048) & requests.finish_time_s.notna()).sum() > 0
    assert not any("exceed max_num_batched_tokens" in w for w in result.resolved["warnings"])
