"""ModelSpec, its presets, and reading Hugging Face config.json files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvsim.costmodel import (
    MODEL_PRESETS,
    CostModelError,
    ModelSpec,
    estimate_num_params,
    model_spec_from_hf_config,
    resolve_model,
)
from kvsim.errors import KvsimError

# Parameter counts as published (model cards / papers), in parameters.
PUBLIC_PARAMS = {
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "llama-2-70b": 69.0e9,
    "llama-3-8b": 8.03e9,
    "llama-3.1-8b": 8.03e9,
    "llama-3-70b": 70.6e9,
    "mistral-7b": 7.24e9,
    "qwen2.5-7b": 7.61e9,
    "opt-13b": 13.0e9,
    "mixtral-8x7b": 46.7e9,
    "qwen3-30b-a3b": 30.5e9,
    "codellama-34b": 33.7e9,
    "qwen3-14b": 14.8e9,
    "mixtral-8x22b": 141e9,
    # Both counts include the vision tower (0.87B), as the checkpoint does.
    "llama-4-scout-17b-16e": 109e9,
    "llama-4-scout-17b-16e-bf16": 109e9,
}

MAX_MODEL_LEN = {
    "llama-2-7b": 4096,
    "llama-2-13b": 4096,
    "llama-2-70b": 4096,
    "llama-3-8b": 8192,
    "llama-3.1-8b": 131072,
    "llama-3-70b": 8192,
    "mistral-7b": 32768,
    "qwen2.5-7b": 32768,
    "opt-13b": 2048,
    "mixtral-8x7b": 32768,
    "qwen3-30b-a3b": 40960,
    "codellama-34b": 16384,
    "qwen3-14b": 40960,
    "mixtral-8x22b": 65536,
    "llama-4-scout-17b-16e": 10485760,
    "llama-4-scout-17b-16e-bf16": 10485760,
}

LLAMA_2_7B_CONFIG = {
    "_name_or_path": "meta-llama/Llama-2-7b-hf",
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}

OPT_13B_CONFIG = {
    "_name_or_path": "facebook/opt-13b",
    "model_type": "opt",
    "hidden_size": 5120,
    "ffn_dim": 20480,
    "max_position_embeddings": 2048,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "torch_dtype": "float16",
    "vocab_size": 50272,
    "word_embed_proj_dim": 5120,
}


def _estimate(spec: ModelSpec) -> int:
    return estimate_num_params(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        vocab_size=spec.vocab_size,
        gated_mlp=spec.gated_mlp,
        tie_word_embeddings=spec.tie_word_embeddings,
        num_experts=spec.num_experts,
        moe_intermediate_size=spec.moe_intermediate_size,
        shared_expert_intermediate_size=spec.shared_expert_intermediate_size,
    )


def _write(tmp_path: Path, config: dict[str, object], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_opt_13b_kv_bytes_per_token_is_819200() -> None:
    assert MODEL_PRESETS["opt-13b"].kv_bytes_per_token == 819_200


def test_gqa_shrinks_kv_bytes_per_token() -> None:
    # llama-3-8b: 32 layers x 8 KV heads x 128 x 2 (K,V) x 2 bytes.
    assert MODEL_PRESETS["llama-3-8b"].kv_bytes_per_token == 131_072
    assert MODEL_PRESETS["llama-2-7b"].kv_bytes_per_token == 524_288


def test_presets_cover_the_issue_list_with_their_context_lengths() -> None:
    assert {name: spec.max_model_len for name, spec in MODEL_PRESETS.items()} == MAX_MODEL_LEN


@pytest.mark.parametrize("name", sorted(PUBLIC_PARAMS))
def test_preset_parameter_counts_match_public_figures(name: str) -> None:
    spec = MODEL_PRESETS[name]
    assert spec.num_params == pytest.approx(PUBLIC_PARAMS[name], rel=0.03)
    # The architecture formula (used for HF configs) must agree with the stored count too.
    assert _estimate(spec) == pytest.approx(spec.num_params, rel=0.01)
    if not spec.expert_weight_bytes:  # FP8 experts: tests/costmodel/test_heldout_presets.py
        assert spec.weight_bytes == spec.num_params * 2


def test_presets_are_read_only() -> None:
    with pytest.raises(TypeError):
        MODEL_PRESETS["x"] = MODEL_PRESETS["opt-13b"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODEL_PRESETS["opt-13b"].num_layers = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_layers", 0), ("hidden_size", -1), ("num_heads", 2.5), ("dtype_bytes", 3), ("name", "")],
)
def test_model_spec_rejects_bad_fields_by_name(field: str, value: object) -> None:
    with pytest.raises(CostModelError, match=field) as info:
        dataclasses.replace(MODEL_PRESETS["llama-2-7b"], **{field: value})  # type: ignore[arg-type]
    assert repr(value) in str(info.value)


def test_model_spec_rejects_kv_heads_not_dividing_heads() -> None:
    with pytest.raises(CostModelError, match="num_kv_heads"):
        dataclasses.replace(MODEL_PRESETS["llama-2-7b"], num_kv_heads=5)


def test_cost_model_error_is_a_kvsim_error() -> None:
    assert issubclass(CostModelError, KvsimError)


def test_hf_llama_config_round_trips_to_the_preset(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, LLAMA_2_7B_CONFIG))
    assert spec.name == "Llama-2-7b-hf"
    preset = MODEL_PRESETS["llama-2-7b"]
    assert dataclasses.replace(spec, name=preset.name) == preset


def test_hf_config_accepts_a_model_folder_and_explicit_num_params(tmp_path: Path) -> None:
    _write(tmp_path, LLAMA_2_7B_CONFIG)
    spec = model_spec_from_hf_config(tmp_path, name="mine", num_params=7_000_000_000)
    assert (spec.name, spec.num_params) == ("mine", 7_000_000_000)


def test_hf_opt_config_ties_embeddings_and_has_two_matrix_mlp(tmp_path: Path) -> None:
    spec = model_spec_from_hf_config(_write(tmp_path, OPT_13B_CONFIG))
    assert spec.tie_word_embeddings and not spec.gated_mlp
    assert spec.kv_bytes_per_token == 819_200
    assert spec.num_params == pytest.approx(MODEL_PRESETS["opt-13b"].num_params, rel=0.002)


def test_hf_config_gqa_head_dim_and_bf16(tmp_path: Path) -> None:
    config = {
        **LLAMA_2_7B_CONFIG,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192,
    }
    spec = model_spec_from_hf_config(_write(tmp_path, config))
    assert (spec.num_kv_heads, spec.head_dim, spec.dtype_bytes) == (8, 64, 2)
    assert spec.kv_bytes_per_token == 2 * 32 * 8 * 64 * 2
    assert spec.max_model_len == 8192


def test_hf_config_defaults_kv_heads_and_dtype_when_absent(tmp_path: Path) -> None:
    config = {
        k: v
        for k, v in LLAMA_2_7B_CONFIG.items()
        if k not in ("num_key_value_heads", "torch_dtype")
    }
    spec = model_spec_from_hf_config(_write(tmp_path, config))
    assert (spec.num_kv_heads, spec.dtype_bytes) == (32, 2)


@pytest.mark.parametrize(
    "key",
    [
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ],
)
def test_hf_config_missing_key_is_named_with_the_file(tmp_path: Path, key: str) -> None:
    path = _write(tmp_path, {k: v for k, v in LLAMA_2_7B_CONFIG.items() if k != key})
    with pytest.raises(CostModelError, match=f"missing key '{key}'") as info:
        model_spec_from_hf_config(path)
    assert str(path) in str(info.value)


def test_hf_opt_config_needs_ffn_dim(tmp_path: Path) -> None:
    path = _write(tmp_path, {k: v for k, v in OPT_13B_CONFIG.items() if k != "ffn_dim"})
    with pytest.raises(CostModelError, match="ffn_dim"):
        model_spec_from_hf_config(path)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden_size", "4096"),
        ("num_hidden_layers", 0),
        ("vocab_size", 3.5),
        ("torch_dtype", "float64"),
        ("tie_word_embeddings", "no"),
        ("num_key_value_heads", 5),
    ],
)
def test_hf_config_bad_value_is_named(tmp_path: Path, key: str, value: object) -> None:
    path = _write(tmp_path, {**LLAMA_2_7B_CONFIG, key: value})
    with pytest.raises(CostModelError, match=key) as info:
        model_spec_from_hf_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "invalid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"hidden_size": NaN}', "invalid JSON"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_hf_config_unreadable_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(CostModelError, match=message):
        model_spec_from_hf_config(path)


def test_resolve_model_by_preset_path_or_error(tmp_path: Path) -> None:
    assert resolve_model("opt-13b") is MODEL_PRESETS["opt-13b"]
    path = _write(tmp_path, LLAMA_2_7B_CONFIG)
    assert resolve_model(path).num_layers == 32
    assert resolve_model(str(tmp_path)).num_layers == 32
    with pytest.raises(CostModelError, match=r"unknown model 'gpt-5'.*llama-2-7b"):
        resolve_model("gpt-5")


@pytest.mark.parametrize(
    ("extra", "context"),
    [
        ({}, 4096),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, 8192),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 1.5}}, 6144),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 4096),  # already scaled
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 4096),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "model_type": "gemma3"}, 4096),
        ({"model_max_length": 16384}, 16384),
    ],
)
def test_hf_context_is_the_one_vllm_derives(
    tmp_path: Path, extra: dict[str, object], context: int
) -> None:
    """vLLM 0.33's _get_and_verify_max_len: the limit --max-model-len may not pass without
    --allow-long-max-model-len (and the default max_model_len)."""
    spec = model_spec_from_hf_config(_write(tmp_path, {**LLAMA_2_7B_CONFIG, **extra}))
    assert spec.max_model_len == context
