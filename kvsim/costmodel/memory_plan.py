"""KV-cache memory planning like vLLM: how many blocks fit per GPU after weights and activations.

num_blocks = floor((memory_bytes * gpu_memory_utilization - weight bytes per GPU
                    - activation reserve) / (block_size * KV bytes per token per GPU))

Under tensor parallelism every GPU holds a slice of every block, so the count is per GPU and the
same on all of them. ``--num-blocks`` on the CLI bypasses this planner entirely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.sharding import check_tp, shard_model
from kvsim.costmodel.specio import CostModelError, fraction, positive_int

_GIB = float(1 << 30)
# Memory outside torch's activations that vLLM's profiling run also charges: cuBLAS workspaces,
# NCCL buffers, allocator slack. Half a GiB is what vLLM logs show as "non-torch memory" for a
# single GPU; CUDA graphs are captured later, inside the headroom that utilization 0.9 leaves.
NON_TORCH_RESERVE_BYTES = 512 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPlan:
    """The pieces of one GPU's memory budget (bytes unless named otherwise)."""

    tp: int
    block_size: int  # tokens per block
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    budget_bytes: int  # floor(gpu_memory_bytes * gpu_memory_utilization)
    weight_bytes: int  # this GPU's share of the weights
    activation_reserve_bytes: int
    kv_cache_bytes: int  # budget - weights - activation reserve: what the KV cache may use
    block_bytes: int  # block_size * KV bytes per token on this GPU
    num_blocks: int
    max_model_len: int  # tokens

    @property
    def token_capacity(self) -> int:
        """Tokens the whole cache holds (tokens)."""
        return self.num_blocks * self.block_size

    @property
    def max_model_len_fits(self) -> bool:
        """Whether one sequence of max_model_len tokens fits; vLLM refuses to start otherwise."""
        return self.token_capacity >= self.max_model_len


def default_activation_reserve(
    model: ModelSpec, *, tp: int = 1, max_num_batched_tokens: int = 2048, max_num_seqs: int = 256
) -> int:
    """Estimated peak activation memory of vLLM's profiling forward pass, per GPU (bytes).

    The peak is inside the MLP for a batch of ``max_num_batched_tokens``: residual, normed input
    and attention output (3 x hidden) plus gate/up output and activation (3 x intermediate / tp),
    at the serving dtype (an MoE layer: top-k x (3 x expert width / tp + hidden), plus 3 x the
    shared expert's width / tp); then fp32 logits and probabilities for ``max_num_seqs`` rows of the
    full vocabulary; plus NON_TORCH_RESERVE_BYTES.
    """
    positive_int(max_num_batched_tokens, "max_num_batched_tokens", "memory plan")
    positive_int(max_num_seqs, "max_num_seqs", "memory plan")
    widths = 3 * model.hidden_size + 3 * model.intermediate_size // tp
    if model.is_moe:
        # Each token's top-k copies: gate/up output, activation and expert output (vLLM's
        # fused-MoE intermediate caches), plus the shared expert's gate/up and activation.
        k, width = model.num_experts_per_tok, model.moe_intermediate_size // tp
        shared = model.shared_expert_intermediate_size // tp
        widths = 3 * model.hidden_size + k * (3 * width + model.hidden_size) + 3 * shared
    activations = max_num_batched_tokens * widths * model.dtype_bytes
    logits = 2 * max_num_seqs * model.vocab_size * 4
    return NON_TORCH_RESERVE_BYTES + activations + logits


def plan_num_blocks(
    model: ModelSpec,
    gpu: GPUSpec,
    block_size: int,
    *,
    gpu_memory_utilization: float = 0.9,
    tp: int = 1,
    activation_reserve_bytes: int | None = None,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
) -> MemoryPlan:
    """Plan the KV cache of ``model`` on ``tp`` x ``gpu`` with ``block_size``-token blocks.

    ``activation_reserve_bytes`` defaults to :func:`default_activation_reserve` for the given
    batch limits. Raises CostModelError, with what would fit instead, if no block fits.
    """
    positive_int(block_size, "block_size", "memory plan")
    utilization = fraction(gpu_memory_utilization, "gpu_memory_utilization", "memory plan")
    check_tp(model, tp)
    plan = _plan(
        model,
        gpu,
        block_size,
        utilization,
        tp,
        activation_reserve_bytes,
        max_num_batched_tokens,
        max_num_seqs,
    )
    if plan.num_blocks <= 0:
        raise CostModelError(
            _no_room_message(
                plan, model, gpu, activation_reserve_bytes, max_num_batched_tokens, max_num_seqs
            )
        )
    return plan


def _plan(
    model: ModelSpec,
    gpu: GPUSpec,
    block_size: int,
    utilization: float,
    tp: int,
    reserve: int | None,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> MemoryPlan:
    shard = shard_model(model, tp)
    if reserve is None:
        reserve = default_activation_reserve(
            model, tp=tp, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs
        )
    elif isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        raise CostModelError(
            f"memory plan: activation_reserve_bytes must be an integer >= 0, got {reserve!r}"
        )
    budget = math.floor(gpu.memory_bytes * utilization)
    kv_cache_bytes = budget - shard.weight_bytes_per_gpu - reserve
    block_bytes = block_size * shard.kv_bytes_per_token_per_gpu
    return MemoryPlan(
        tp=tp,
        block_size=block_size,
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_memory_utilization=utilization,
        budget_bytes=budget,
        weight_bytes=shard.weight_bytes_per_gpu,
        activation_reserve_bytes=reserve,
        kv_cache_bytes=kv_cache_bytes,
        block_bytes=block_bytes,
        num_blocks=max(0, kv_cache_bytes // block_bytes),
        max_model_len=model.max_model_len,
    )


def _no_room_message(
    plan: MemoryPlan,
    model: ModelSpec,
    gpu: GPUSpec,
    reserve: int | None,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> str:
    util = plan.gpu_memory_utilization
    head = (
        f"{model.name} does not fit on {gpu.name} with tp={plan.tp}: usable memory "
        f"{plan.budget_bytes / _GIB:.2f} GiB ({gpu.memory_bytes / _GIB:.2f} GiB x {util:g}) - "
        f"weights {plan.weight_bytes / _GIB:.2f} GiB - activation reserve "
        f"{plan.activation_reserve_bytes / _GIB:.2f} GiB leaves no room for one "
        f"{plan.block_size}-token KV block ({plan.block_bytes / _GIB:.4f} GiB)"
    )
    for tp in range(plan.tp + 1, model.num_heads + 1):
        try:
            check_tp(model, tp)
        except CostModelError:
            continue
        bigger = _plan(
            model, gpu, plan.block_size, util, tp, reserve, max_num_batched_tokens, max_num_seqs
        )
        if bigger.num_blocks > 0:
            return f"{head}; use --tp {tp} or more, or a GPU with more memory"
    return f"{head}; use a GPU with more memory or a smaller model"


def serving_batch_defaults(gpu: GPUSpec) -> tuple[int, int]:
    """vLLM 0.33's online-serving defaults for ``gpu``: (max_num_batched_tokens, max_num_seqs).

    As ``EngineArgs.get_batch_defaults`` (OPENAI_API_SERVER): 16,384 / 1,024 from 160 GiB of
    memory up (B200-class), 8,192 / 1,024 from 70 GiB for GPUs that are not A100s
    (H100 / H200-class), 2,048 / 256 otherwise (A100 and smaller)."""
    if gpu.memory_bytes >= 160 * (1 << 30):
        return 16384, 1024
    if gpu.memory_bytes >= 70 * (1 << 30) and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256
