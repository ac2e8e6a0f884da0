"""Tensor parallelism: what one of ``tp`` GPUs holds and computes (Megatron-style, as vLLM does).

Attention heads, the MLP's intermediate dimension, the embedding and the LM head are split ``tp``
ways. KV heads are split too while ``tp <= num_kv_heads``; beyond that vLLM replicates them so each
GPU holds exactly one KV head (its K/V projections and cache are copied ``tp / num_kv_heads``
times). Norm weights are replicated; they are ignored (a few hidden-size vectors). An MoE model's
experts are each split like a dense MLP (tensor parallelism of experts); its routers are
replicated. Expert parallelism (whole experts per GPU) is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.specio import CostModelError


@dataclass(frozen=True, slots=True)
class ShardedModel:
    """Per-GPU sizes of ``model`` under tensor parallelism ``tp`` (counts, parameters, bytes)."""

    model: ModelSpec
    tp: int
    heads_per_gpu: int
    kv_heads_per_gpu: int
    weight_bytes_per_gpu: int
    layer_matmul_params_per_gpu: int
    lm_head_params_per_gpu: int
    kv_bytes_per_token_per_gpu: int


def check_tp(model: ModelSpec, tp: object) -> int:
    """Validate ``tp`` for ``model`` with vLLM's rules; return it as an int."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CostModelError(f"tp must be an integer >= 1, got {tp!r}")
    if model.num_heads % tp != 0:
        raise CostModelError(f"tp={tp} must divide {model.name}'s num_heads ({model.num_heads})")
    kv = model.num_kv_heads
    if (tp <= kv and kv % tp != 0) or (tp > kv and tp % kv != 0):
        raise CostModelError(
            f"tp={tp} must divide {model.name}'s num_kv_heads ({kv}) or be a multiple of it"
        )
    return tp


def check_heads_divide(model: ModelSpec, tp: object) -> int:
    """``tp`` as an int if it divides ``model``'s query heads (the only split a step-time
    prediction needs); vLLM's KV-head rule is :func:`check_tp`'s."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CostModelError(f"tp must be an integer >= 1, got {tp!r}")
    if model.num_heads % tp != 0:
        raise CostModelError(f"tp={tp} must divide {model.name}'s num_heads ({model.num_heads})")
    return tp


def kv_heads_on_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU holds: an even split, or one replicated head when tp exceeds them.

    For a tp vLLM refuses (one that neither divides num_kv_heads nor is a multiple of it) this
    is the busiest GPU's count, ceil(num_kv_heads / tp): what a step waits for."""
    return -(-model.num_kv_heads // tp)


def shard_model(model: ModelSpec, tp: int = 1, *, strict: bool = True) -> ShardedModel:
    """Split ``model`` over ``tp`` GPUs; raises CostModelError for an incompatible ``tp``.

    ``strict=False`` (the step-time model) only asks that tp divides the query heads."""
    if strict:
        check_tp(model, tp)
    else:
        check_heads_divide(model, tp)
    kv_heads_per_gpu = kv_heads_on_gpu(model, tp)
    # K/V projections are sized by the KV heads a GPU holds (replicated when tp > num_kv_heads);
    # an MoE router is replicated (vLLM's ReplicatedLinear gate); everything else, every
    # expert's intermediate dimension included, is an even split of the parameter count.
    kv_proj_per_gpu = model.kv_proj_params * kv_heads_per_gpu // model.num_kv_heads
    replicated = kv_proj_per_gpu + model.router_params
    split = model.kv_proj_params + model.router_params
    other_params_per_gpu = (model.num_params - split) // tp
    # Experts stored narrower than dtype_bytes (FP8) save their share of the bytes; 0 otherwise.
    saved_per_weight = model.dtype_bytes - model.expert_bytes_per_weight
    saved_bytes = model.all_expert_params // tp * saved_per_weight
    return ShardedModel(
        model=model,
        tp=tp,
        heads_per_gpu=model.num_heads // tp,
        kv_heads_per_gpu=kv_heads_per_gpu,
        weight_bytes_per_gpu=(other_params_per_gpu + replicated) * model.dtype_bytes - saved_bytes,
        layer_matmul_params_per_gpu=(model.layer_matmul_params - split) // tp + replicated,
        lm_head_params_per_gpu=model.lm_head_params // tp,
        kv_bytes_per_token_per_gpu=2
        * model.num_layers
        * kv_heads_per_gpu
        * model.head_dim
        * model.dtype_bytes,
    )
