"""Model configs, rotary embeddings and checkpoint loading against transformers' own models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.torch_engine.attention import build_attention_metadata
from engine.torch_engine.kv_cache import KVCache
from engine.torch_engine.loader import build_model, load_config, load_model
from engine.torch_engine.models import (
    LlamaForCausalLM,
    ModelConfig,
    ModelConfigError,
    preset_config,
)
from engine.torch_engine.models.layers import rope_inv_freq

transformers = pytest.importorskip("transformers")

SMALL = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def _prefill_logits(
    model: LlamaForCausalLM, tokens: list[int], block_size: int = 4
) -> torch.Tensor:
    """Logits [len(tokens), vocab] of one fresh sequence through the paged path."""
    config = model.config
    n = len(tokens)
    num_blocks = -(-n // block_size)
    cache = KVCache(
        num_layers=config.num_hidden_layers,
        num_blocks=num_blocks + 2,
        block_size=block_size,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
    )
    table = list(range(num_blocks + 1, 0, -1))[:num_blocks]  # scattered, descending
    meta = build_attention_metadata(
        query_lens=[n],
        context_lens=[n],
        block_tables=[table],
        slot_mapping=[table[i // block_size] * block_size + i % block_size for i in range(n)],
        block_size=block_size,
    )
    with torch.no_grad():
        hidden = model(torch.tensor(tokens), torch.arange(n), meta, cache)
        return model.compute_logits(hidden)


def _save(hf_model: Any, path: Path, **kwargs: Any) -> Path:
    hf_model.save_pretrained(path, **kwargs)
    return path


def test_config_reads_llama_qwen2_and_mistral_variants() -> None:
    llama = ModelConfig.from_hf_config({**SMALL, "model_type": "llama"})
    assert (llama.head_dim, llama.qkv_bias, llama.o_proj_bias) == (8, False, False)
    assert llama.num_queries_per_kv == 2
    qwen = ModelConfig.from_hf_config({**SMALL, "model_type": "qwen2", "tie_word_embeddings": True})
    assert (qwen.qkv_bias, qwen.o_proj_bias, qwen.tie_word_embeddings) == (True, False, True)
    biased = ModelConfig.from_hf_config({**SMALL, "attention_bias": True})
    assert (biased.qkv_bias, biased.o_proj_bias) == (True, True)
    legacy = ModelConfig.from_hf_config(
        {**SMALL, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert (legacy.rope.theta, legacy.rope.rope_type, legacy.rope.factor) == (5e5, "linear", 2.0)
    mistral = ModelConfig.from_hf_config({**SMALL, "model_type": "mistral", "eos_token_id": [2, 7]})
    assert mistral.eos_token_ids == (2, 7)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type"),
    ],
)
def test_bad_config_names_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelConfigError, match=field):
        ModelConfig.from_hf_config({**SMALL, **change})


def test_missing_field_and_unknown_preset_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="vocab_size"):
        ModelConfig.from_hf_config({k: v for k, v in SMALL.items() if k != "vocab_size"})
    with pytest.raises(ModelConfigError, match="preset"):
        load_config(str(tmp_path))
    with pytest.raises(ModelConfigError, match="unknown model preset"):
        preset_config("gpt-5")


@pytest.mark.parametrize("rope_type", ["default", "linear", "llama3"])
def test_rope_frequencies_equal_transformers(rope_type: str) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope: dict[str, Any] = {"rope_type": rope_type, "rope_theta": 500000.0}
    if rope_type != "default":
        rope.update(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
        rope["original_max_position_embeddings"] = 64
    hf_config = transformers.LlamaConfig(**{**SMALL, "hidden_size": 256}, rope_parameters=rope)
    config = ModelConfig.from_hf_config(hf_config.to_dict())
    ours = rope_inv_freq(config.rope, config.head_dim)
    if rope_type == "default":
        expected = 1.0 / (500000.0 ** (torch.arange(0, 64, 2).float() / 64))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    torch.testing.assert_close(ours, expected)


def test_llama_checkpoint_logits_equal_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0}
    rope.update(high_freq_factor=4.0, original_max_position_embeddings=32)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, rope_parameters=rope))
    model = load_model(str(_save(hf.eval(), tmp_path)))
    tokens = torch.randint(0, 96, (45,)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(_prefill_logits(model, tokens), expected, atol=1e-5, rtol=1e-5)


def test_sharded_qwen2_with_tied_embeddings_equals_transformers(tmp_path: Path) -> None:
    torch.manual_seed(1)
    config = transformers.Qwen2Config(**SMALL, tie_word_embeddings=True)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # non-zero biases, so loading them is checked
        for layer in hf.model.layers:
            layer.self_attn.q_proj.bias.normal_()
            layer.self_attn.k_proj.bias.normal_()
    path = _save(hf, tmp_path, max_shard_size="20KB")
    assert (path / "model.safetensors.index.json").is_file()
    model = load_model(str(path))
    assert model.lm_head is None and model.config.qkv_bias
    tokens = torch.randint(0, 96, (30,)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(_prefill_logits(model, tokens), expected, atol=1e-5, rtol=1e-5)


def test_mistral_checkpoint_equals_transformers(tmp_path: Path) -> None:
    torch.manual_seed(2)
    hf = transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, sliding_window=None))
    model = load_model(str(_save(hf.eval(), tmp_path)))
    tokens = torch.randint(0, 96, (20,)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(_prefill_logits(model, tokens, 16), expected, atol=1e-5, rtol=1e-5)


def test_checkpoint_missing_a_tensor_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL))
    path = _save(hf, tmp_path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.self_attn.v_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelConfigError, match="qkv_proj"):
        load_model(str(path))


def test_random_init_is_seeded_and_presets_count_parameters() -> None:
    config = preset_config("tiny-llama")
    first, again, other = (build_model(config, seed=s) for s in (5, 5, 6))
    for (name, a), b, c in zip(first.named_parameters(), again.parameters(), other.parameters()):
        assert torch.equal(a, b), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(a, c), name
    assert sum(p.numel() for p in first.parameters()) == config.num_parameters
    assert preset_config("llama-1b").num_parameters == pytest.approx(1.236e9, rel=0.01)


def test_half_precision_model_keeps_rope_in_float32() -> None:
    model = build_model(preset_config("tiny-llama"), dtype="bfloat16")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    logits = _prefill_logits(model.float(), [1, 2, 3])
    assert torch.isfinite(logits).all()


def test_config_json_round_trip(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "model_type": "qwen2"}))
    assert load_config(str(tmp_path)).model_type == "qwen2"
