"""Engine mode: a run's trace replayed through the torch engine, every step timed
(``run_engine_mode``; ``kvsim.runner.run`` hands a ``mode="engine"`` config here)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvsim.config import RunConfig, scheduling_limits
from kvsim.costmodel import resolve_gpu
from kvsim.runner.replay import simulate
from kvsim.runner.resolve import load_workload, resolve_max_model_len
from kvsim.runner.result import RunResult
from kvsim.sim.engine_mode import EngineExecutor, PromptTokens, build_llm
from kvsim.sim.simulation import Progress


def run_engine_mode(
    config: RunConfig,
    progress: Progress | None = None,
    events_path: Path | None = None,
    *,
    keep_events: bool = True,
    on_start: Callable[[int], None] | None = None,
) -> RunResult:
    """Replay ``config``'s trace through the torch engine, timing every step."""
    trace_path, trace = load_workload(config)
    limits = scheduling_limits(config, resolve_gpu(config.gpu), config.max_model_len)
    llm = build_llm(config, limits)
    warnings: list[str] = []
    resolve_max_model_len(config, llm.model_config.max_position_embeddings, warnings)
    scheduler = llm.scheduler
    block_manager = llm.block_manager
    resolved: dict[str, Any] = {
        "trace_path": str(trace_path),
        "trace_path_absolute": str(trace_path.resolve()),
        "trace_name": trace.name,
        "num_blocks": block_manager.num_blocks,
        "max_model_len": scheduler.config.max_model_len,
        "scheduler": config.resolved_scheduler(),
        "enable_prefix_caching": config.caches_prefixes(),
        **dataclasses.asdict(limits),
        "engine": {
            "model": config.model,
            "device": str(llm.kv_cache.key_cache[0].device),
            "dtype": config.dtype,
            "kv_cache_bytes": llm.kv_cache.num_bytes,
        },
    }
    if warnings:
        resolved["warnings"] = warnings
    tokens_of = PromptTokens(llm.model_config.vocab_size, config.seed, trace.hash_block_size)
    return simulate(
        config,
        trace,
        block_manager.num_blocks,
        scheduler.config.max_model_len,
        EngineExecutor(llm),
        resolved,
        progress,
        scheduler=scheduler,
        prompt_tokens_of=tokens_of,
        events_path=events_path,
        keep_events=keep_events,
        on_start=on_start,
    )
