"""The cost model: what one engine step costs on one GPU, and what it is built from.

``model`` predicts step times (terms fitted to measured kernel profiles: ``terms``,
``coefficients``, ``layer_shapes``; fitted by ``profiles``, ``fit``, ``calibrate`` and checked
by ``validate``, which import pandas and scipy and are not imported here); ``modelspec``,
``hf_config`` and ``gpuspec`` describe the model and the GPU (presets, a Hugging Face
config.json, a GPU spec file); ``sharding`` splits a model over tensor-parallel GPUs;
``memory_plan`` sizes the KV pool as vLLM does; ``specio`` holds their shared error type and
field checks. Import everything from here: ``from kvsim.costmodel import CostModel,
resolve_gpu, resolve_model``.

Names are imported on first use (PEP 562), so a module that needs only the GPU presets (the
CLI's option table, via kvsim.config) does not pay for numpy and the fitted step model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsim.costmodel.coefficients import (
        StepCoefficients,
        load_coefficients,
        preset_coefficient_names,
        preset_coefficients,
        save_coefficients,
    )
    from kvsim.costmodel.gpuspec import GPU_PRESETS, GPUSpec, load_gpu_spec, resolve_gpu
    from kvsim.costmodel.hf_config import model_spec_from_hf_config, resolve_model
    from kvsim.costmodel.memory_plan import MemoryPlan, default_activation_reserve, plan_num_blocks
    from kvsim.costmodel.model import BatchShape, CostModel, causal_pairs
    from kvsim.costmodel.model_presets import MODEL_PRESETS
    from kvsim.costmodel.modelspec import ModelSpec, estimate_num_params
    from kvsim.costmodel.sharding import ShardedModel, shard_model
    from kvsim.costmodel.specio import CostModelError

_EXPORTS = {
    "kvsim.costmodel.coefficients": (
        "StepCoefficients",
        "load_coefficients",
        "preset_coefficient_names",
        "preset_coefficients",
        "save_coefficients",
    ),
    "kvsim.costmodel.gpuspec": ("GPU_PRESETS", "GPUSpec", "load_gpu_spec", "resolve_gpu"),
    "kvsim.costmodel.hf_config": ("model_spec_from_hf_config", "resolve_model"),
    "kvsim.costmodel.memory_plan": ("MemoryPlan", "default_activation_reserve", "plan_num_blocks"),
    "kvsim.costmodel.model": ("BatchShape", "CostModel", "causal_pairs"),
    "kvsim.costmodel.model_presets": ("MODEL_PRESETS",),
    "kvsim.costmodel.modelspec": ("ModelSpec", "estimate_num_params"),
    "kvsim.costmodel.sharding": ("ShardedModel", "shard_model"),
    "kvsim.costmodel.specio": ("CostModelError",),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kvsim.costmodel' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "BatchShape",
    "CostModel",
    "CostModelError",
    "GPUSpec",
    "MemoryPlan",
    "ModelSpec",
    "ShardedModel",
    "StepCoefficients",
    "causal_pairs",
    "default_activation_reserve",
    "estimate_num_params",
    "load_coefficients",
    "load_gpu_spec",
    "model_spec_from_hf_config",
    "plan_num_blocks",
    "preset_coefficient_names",
    "preset_coefficients",
    "resolve_gpu",
    "resolve_model",
    "save_coefficients",
    "shard_model",
]
