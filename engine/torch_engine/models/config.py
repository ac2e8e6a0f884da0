"""Model configuration: a Llama-family decoder described by a Hugging Face config.json dict.

Llama, Mistral and Qwen2 share one architecture here; they differ only in configuration
(Qwen2 adds a bias to the q/k/v projections). This module knows nothing of weights or torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import EngineError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ModelConfigError(EngineError, ValueError):
    """A config.json (or preset) the engine cannot build a model from; names the bad field."""


_MAX_SIZE = 2**31 - 1  # a size past int32 is a typo, not a model
_MAX_SHOWN_CHARS = 60
_REQUIRED = object()


class LongInteger:
    """An integer literal of more digits than ``int()`` takes (4,300), kept as its length so
    the field holding it can be named (see ``engine.torch_engine.loader``)."""

    __slots__ = ("digits",)

    def __init__(self, literal: str) -> None:
        self.digits = len(literal.lstrip("-"))


def _show_value(value: object) -> str:
    """A config value as JSON writes it (``null``, ``"x"``, ``[1, 2]``), shortened; never raises."""
    if isinstance(value, LongInteger):
        return f"an integer of {value.digits:,} digits"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= _MAX_SHOWN_CHARS else text[: _MAX_SHOWN_CHARS - 3] + "..."


def _bad(name: str, rule: str, value: object) -> ModelConfigError:
    return ModelConfigError(f"{name} must be {rule}, got {_show_value(value)}")


def _check_size(name: str, value: object) -> int:
    """``value`` if it is an integer from 1 to 2^31 - 1 (JSON integers only: no bool, no 4.0)."""
    if type(value) is not int or not 1 <= value <= _MAX_SIZE:
        raise _bad(name, f"a positive integer (at most {_MAX_SIZE})", value)
    return value


def _check_number(name: str, value: object, *, positive: bool = True) -> float:
    rule = "a finite number > 0" if positive else "a finite number >= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, rule, value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise _bad(name, rule, value)
    return float(value)


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
                f"rope_type={_show_value(self.rope_type)} is not supported "
                f"(one of {SUPPORTED_ROPE_TYPES})"
            )
        _check_number("rope_theta", self.theta)
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            _check_number(name, getattr(self, name))
        _check_size("original_max_position_embeddings", self.original_max_position_embeddings)
        if self.rope_type == "llama3" and not self.low_freq_factor < self.high_freq_factor:
            # layers.rope_inv_freq divides by their difference
            raise ModelConfigError(
                f"llama3 rope needs low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )


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
        for name in _SIZE_FIELDS:
            _check_size(name, getattr(self, name))
        _check_number("rms_norm_eps", self.rms_norm_eps)
        _check_number("initializer_range", self.initializer_range, positive=False)
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
    def from_hf_config(cls, hf: object) -> ModelConfig:
        """Build from a Hugging Face config.json object (Llama, Mistral or Qwen2).

        JSON types are strict: sizes are integers (not ``4096.0``, not ``true``), flags are
        booleans; ``null`` means "not given" where Hugging Face allows that (``head_dim``,
        ``num_key_value_heads``, ``rope_scaling``, ``eos_token_id``, ...). Raises
        ModelConfigError naming the field.
        """
        if not isinstance(hf, Mapping):
            raise ModelConfigError(f"expected a JSON object, got {_json_type(hf)}")
        model_type = _get(hf, "model_type", "llama", str)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(
                f"model_type={_show_value(model_type)} is not supported "
                f"(one of {SUPPORTED_MODEL_TYPES})"
            )
        hidden_act = _get(hf, "hidden_act", "silu", str)
        if hidden_act != "silu":
            raise ModelConfigError(
                f"hidden_act={_show_value(hidden_act)}: only 'silu' is supported"
            )
        hidden = _check_size("hidden_size", _get(hf, "hidden_size"))
        heads = _check_size("num_attention_heads", _get(hf, "num_attention_heads"))
        attention_bias = _get(hf, "attention_bias", False, bool)
        return cls(
            model_type=model_type,
            vocab_size=_get(hf, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_get(hf, "intermediate_size"),
            num_hidden_layers=_get(hf, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=_get(hf, "num_key_value_heads", heads),
            head_dim=_get(hf, "head_dim", hidden // heads),
            rms_norm_eps=_get(hf, "rms_norm_eps", 1e-6),
            max_position_embeddings=_get(hf, "max_position_embeddings", 4096),
            rope=_rope_from_hf(hf),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_proj_bias=attention_bias and model_type != "qwen2",
            mlp_bias=_get(hf, "mlp_bias", False, bool),
            tie_word_embeddings=_get(hf, "tie_word_embeddings", False, bool),
            initializer_range=_get(hf, "initializer_range", 0.02),
            eos_token_ids=_eos_ids(hf.get("eos_token_id")),
        )


_SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _get(
    hf: Mapping[str, Any], key: str, default: Any = _REQUIRED, kind: type | None = None
) -> Any:
    """``hf[key]``, or ``default`` when it is absent or null; with ``kind``, of that exact type.

    A required field (no default) that is null is returned as None for its check to refuse;
    numbers are checked by the dataclasses they go into (their messages name the field).
    """
    if key not in hf:
        if default is _REQUIRED:
            raise ModelConfigError(f"missing field {key!r}")
        return default
    value = hf[key]
    if value is None and default is not _REQUIRED:
        return default
    if kind is not None and type(value) is not kind:
        rule = {str: "a string", bool: "true or false"}.get(kind, kind.__name__)
        raise _bad(key, rule, value)
    return value


def _rope_from_hf(hf: Mapping[str, Any]) -> RopeConfig:
    """Read transformers 5 `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    key = "rope_parameters" if hf.get("rope_parameters") is not None else "rope_scaling"
    params = hf.get(key)
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise _bad(key, "an object or null", params)
    rope_type = _get(params, "rope_type", _get(params, "type", "default", str), str)
    return RopeConfig(
        theta=_get(params, "rope_theta", _get(hf, "rope_theta", 10000.0)),
        rope_type=rope_type,
        factor=_get(params, "factor", 1.0),
        low_freq_factor=_get(params, "low_freq_factor", 1.0),
        high_freq_factor=_get(params, "high_freq_factor", 4.0),
        original_max_position_embeddings=_get(
            params, "original_max_position_embeddings", _get(hf, "max_position_embeddings", 8192)
        ),
    )


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if any(type(v) is not int or not 0 <= v <= _MAX_SIZE for v in ids):
        raise _bad("eos_token_id", "a token id, a list of token ids or null", value)
    return tuple(ids)


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
