"""The cost model: what one engine step costs on one GPU, and what it is built from.

``model`` predicts step times (terms fitted to measured kernel profiles: ``terms``,
``coefficients``, ``layer_shapes``; fitted by ``profiles``, ``fit``, ``calibrate`` and checked
by ``validate``, which import pandas and scipy and are not imported here); ``modelspec``,
``hf_config`` and ``gpuspec`` describe the model and the GPU (presets, a Hugging Face
config.json, a GPU spec file); ``sharding`` splits a model over tensor-parallel GPUs;
``memory_plan`` sizes the KV pool as vLLM does; ``specio`` holds their shared error type and
field checks. Import everything from here: ``from kvsim.costmodel import CostModel,
resolve_gpu, resolve_model``.
"""

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
from kvsim.costmodel.modelspec import MODEL_PRESETS, ModelSpec, estimate_num_params
from kvsim.costmodel.sharding import ShardedModel, shard_model
from kvsim.costmodel.specio import CostModelError

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
