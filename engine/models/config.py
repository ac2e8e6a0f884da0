"""Model configuration: a Llama-family decoder described by a Hugging Face config.json dict.

Llama, Mistral and Qwen2 share one architecture here; they differ only in configuration
(Qwen2 adds a bias to the q/k/v projections). This module knows nothing of weights or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.errors import EngineError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ModelConfigError(EngineError, ValueError):
    """A config.json (or preset) the engine cannot build a model from; names the bad field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeConfig:
    """Rotary embedding parameters (Hugging Face `rope_parameters` / `rope_scaling`)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelConfigError(
                f"rope_type={self.rope_type!r} is not supported (one of {SUPPORTED_ROPE_TYPES})"
            )
        if self.theta <= 0 or self.factor <= 0:
            raise ModelConfigError(f"rope theta={self.theta}, factor={self.factor} must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Shape and options of a Llama-family decoder. Sizes are counts, not bytes."""

    model_type: str = "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"{name}={getattr(self, name)} must be > 0")
        if self.num_attention_heads <= 0 or self.num_key_value_heads <= 0 or self.head_dim <= 0:
            raise ModelConfigError(
                f"num_attention_heads={self.num_attention_heads}, "
                f"num_key_value_heads={self.num_key_value_heads}, head_dim={self.head_dim} "
                "must all be > 0"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def num_queries_per_kv(self) -> int:
        """GQA group size: query heads sharing one K/V head."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def num_parameters(self) -> int:
        """Parameter count (weights and biases), counting tied embeddings once."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        attn = h * (q + 2 * kv) + q * h
        attn += (q + 2 * kv) * self.qkv_bias + h * self.o_proj_bias
        mlp = 3 * h * self.intermediate_size + (2 * self.intermediate_size + h) * self.mlp_bias
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embed + h

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any]) -> ModelConfig:
        """Build from a Hugging Face config.json dict (Llama, Mistral or Qwen2)."""
        model_type = str(hf.get("model_type", "llama"))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(
                f"model_type={model_type!r} is not supported (one of {SUPPORTED_MODEL_TYPES})"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act={hf['hidden_act']!r}: only 'silu' is supported")
        try:
            hidden = int(hf["hidden_size"])
            heads = int(hf["num_attention_heads"])
            head_dim = hf.get("head_dim") or hidden // heads
            attention_bias = bool(hf.get("attention_bias", False))
            return cls(
                model_type=model_type,
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(hf["intermediate_size"]),
                num_hidden_layers=int(hf["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
                rope=_rope_from_hf(hf),
                qkv_bias=attention_bias or model_type == "qwen2",
                o_proj_bias=attention_bias and model_type != "qwen2",
                mlp_bias=bool(hf.get("mlp_bias", False)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                initializer_range=float(hf.get("initializer_range", 0.02)),
                eos_token_ids=_eos_ids(hf.get("eos_token_id")),
            )
        except KeyError as err:
            raise ModelConfigError(f"config.json lacks the field {err.args[0]!r}") from err


def _rope_from_hf(hf: Mapping[str, Any]) -> RopeConfig:
    """Read transformers 5 `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params: Mapping[str, Any] = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
        ),
    )


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


# --- presets -----------------------------------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    # Random weights for tests, demos and the default engine-mode run (~1.3 M parameters).
    "tiny-llama": {
        "model_type": "llama",
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "initializer_range": 0.02,
    },
    # The shape of Llama-3.2-1B (~1.24 B parameters), random weights: GPU benchmarks.
    "llama-1b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_theta": 500000.0,
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
}


def preset_config(name: str) -> ModelConfig:
    """The ModelConfig of a named preset; raises ModelConfigError for an unknown name."""
    if name not in PRESETS:
        raise ModelConfigError(f"unknown model preset {name!r} (one of {sorted(PRESETS)})")
    return ModelConfig.from_hf_config(PRESETS[name])
