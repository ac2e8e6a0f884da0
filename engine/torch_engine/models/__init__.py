"""Model definitions: a Llama-family decoder over the paged KV cache, and its configuration."""

from engine.torch_engine.models.config import (
    PRESETS,
    ModelConfig,
    ModelConfigError,
    RopeConfig,
    preset_config,
)
from engine.torch_engine.models.llama import LlamaForCausalLM

__all__ = [
    "PRESETS",
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelConfigError",
    "RopeConfig",
    "preset_config",
]
