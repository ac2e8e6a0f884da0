"""From a RunConfig to what a run needs: its trace, cost model, KV pool, max_model_len,
executor, and a P/D fleet's pools (each planned as a one-replica run)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsim.config import RunConfig, SchedulingLimits, scheduling_limits
from kvsim.costmodel import (
    CostModel,
    CostModelError,
    MemoryPlan,
    load_coefficients,
    plan_num_blocks,
    resolve_gpu,
    resolve_model,
)
from kvsim.option_spec import ConfigError, parse_step_time
from kvsim.sim.allocators import ContiguousCostExecutor
from kvsim.sim.executor import CostModelExecutor, Executor, LinearStepExecutor
from workloads import Trace, load_trace, rescale_to_rate, resolve_trace, scale_time

if TYPE_CHECKING:
    from kvsim.fleet.pd_pools import PDPool


def load_workload(config: RunConfig) -> tuple[Path, Trace]:
    """The trace named by ``config.trace`` (a path or a shipped name), rescaled as asked."""
    path = resolve_trace(config.trace)
    # as columns: a run reads the requests' columns (kvsim/sim/core_clock.py, the metrics),
    # never each Request (the whole Azure conversation trace: see docs/compiled.md)
    trace = load_trace(path, columns=True)
    if config.rate is not None:
        trace = rescale_to_rate(trace, config.rate)
    elif config.time_scale is not None:
        trace = scale_time(trace, config.time_scale)
    return path, trace


def build_cost_model(config: RunConfig) -> CostModel:
    coefficients = load_coefficients(Path(config.coefficients)) if config.coefficients else None
    return CostModel(
        resolve_model(config.model),
        resolve_gpu(config.gpu),
        tp=config.tp,
        coefficients=coefficients,
    )


def resolve_num_blocks(
    config: RunConfig, cost_model: CostModel, limits: SchedulingLimits, warnings: list[str]
) -> tuple[int, dict[str, Any]]:
    """``config.num_blocks`` if given, else planned from GPU memory as vLLM does. A given
    count beyond what the GPU's memory plan allows is a what-if (vLLM's
    ``num_gpu_blocks_override``): accepted, with a warning."""

    def plan() -> MemoryPlan:
        return plan_num_blocks(
            cost_model.model,
            cost_model.gpu,
            config.block_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tp=config.tp,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_num_seqs=limits.max_num_seqs,
        )

    if config.num_blocks is not None:
        try:
            planned: int | None = plan().num_blocks
        except CostModelError:
            planned = None  # the weights alone do not fit: any pool is a what-if
        if planned is None or config.num_blocks > planned:
            fits = "no KV block" if planned is None else f"{planned:,} blocks"
            warnings.append(
                f"--num-blocks {config.num_blocks:,} is more than the memory of "
                f"{config.tp} x {cost_model.gpu.name} holds ({fits} of {config.block_size} "
                "tokens): simulated as a what-if"
            )
        return config.num_blocks, {"source": "--num-blocks", "planned_num_blocks": planned}
    memory = plan()
    return memory.num_blocks, {"source": "planned from GPU memory", **dataclasses.asdict(memory)}


def resolve_max_model_len(
    config: RunConfig, model_max_len: int | None, warnings: list[str]
) -> int | None:
    """``config.max_model_len``, or the model's. Beyond the model's context vLLM 0.33 refuses
    to start (vllm/config/model.py, ``_get_and_verify_max_len``) unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; kvsim likewise raises ConfigError unless
    ``allow_long_max_model_len``, and then runs it as a what-if with a warning (the cost model
    extrapolates)."""
    if config.max_model_len is None:
        return model_max_len
    if model_max_len is not None and config.max_model_len > model_max_len:
        if not config.allow_long_max_model_len:
            raise ConfigError(
                f"--max-model-len {config.max_model_len:,} is beyond the model's context of "
                f"{model_max_len:,} tokens (vLLM refuses it too); pass "
                "--allow-long-max-model-len to run it as a what-if (vLLM's "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
            )
        warnings.append(
            f"--max-model-len {config.max_model_len:,} is beyond the model's context of "
            f"{model_max_len:,} tokens: simulated as a what-if (--allow-long-max-model-len)"
        )
    return config.max_model_len


def plan_pd_pool(
    pool: RunConfig, max_model_len: int | None, warnings: list[str]
) -> tuple[CostModel, SchedulingLimits, int, dict[str, Any], Callable[[], Executor]]:
    """A P/D pool planned as a one-replica run of ``pool`` (the run's config with the pool's
    --gpu and --tp): cost model, batch limits, KV blocks, memory plan, executor factory."""
    cost_model = build_cost_model(pool)
    limits = scheduling_limits(pool, cost_model.gpu, max_model_len)
    num_blocks, plan = resolve_num_blocks(pool, cost_model, limits, warnings)
    return cost_model, limits, num_blocks, plan, lambda: build_executor(pool, cost_model)


def resolve_pd_pools(
    config: RunConfig, max_model_len: int | None, warnings: list[str]
) -> tuple[PDPool, PDPool]:
    """``config.pd``'s prefill and decode pools, each on its own GPU and TP
    (kvsim.fleet.pd_pools)."""
    from kvsim.fleet.pd_pools import resolve_pools

    return resolve_pools(config, max_model_len, warnings, plan_pd_pool)


def build_executor(config: RunConfig, cost_model: CostModel) -> Executor:
    """The cost-mode executor: the cost model, or ``--step-time``'s linear clock."""
    if config.step_time is not None:
        return LinearStepExecutor(*parse_step_time(config.step_time))
    if config.allocator == "paged":
        return CostModelExecutor(cost_model)
    return ContiguousCostExecutor(cost_model)
