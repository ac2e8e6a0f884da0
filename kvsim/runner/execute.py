"""One run, from a RunConfig to tables: load the trace, resolve what the run needs
(kvsim/runner/resolve.py), and hand it to its driver: one replica's replay
(kvsim/runner/replay.py), a fleet (kvsim/fleet), or engine mode (kvsim/runner/engine_run.py).
``RunResult`` (kvsim/runner/result.py) and ``simulate`` are importable from here too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from kvsim.config import RunConfig, scheduling_limits
from kvsim.costmodel import resolve_model
from kvsim.runner.engine_run import run_engine_mode
from kvsim.runner.replay import simulate
from kvsim.runner.resolve import (
    build_cost_model,
    build_executor,
    load_workload,
    resolve_max_model_len,
    resolve_num_blocks,
    resolve_pd_pools,
)
from kvsim.runner.result import RunResult
from kvsim.sim.executor import LinearStepExecutor
from kvsim.sim.offload_setup import build_offload
from kvsim.sim.simulation import Progress


def run(
    config: RunConfig,
    progress: Progress | None = None,
    events_path: Path | None = None,
    *,
    keep_events: bool = True,
    on_start: Callable[[int], None] | None = None,
    finish_events_later: bool = False,
) -> RunResult:
    """Simulate ``config``: cost mode here, engine mode in kvsim.engine_mode.

    With ``events_path`` the events are streamed to that Parquet file as the run goes (memory
    stays bounded whatever the trace's length) and ``RunResult.events`` is None; with
    ``finish_events_later`` the file may still be being written when ``run`` returns: call
    ``RunResult.finish_events()`` before reading it (the caller writes its other files
    meanwhile). Without
    ``keep_events`` they are neither kept nor written (the metrics are computed all the same):
    for sweeps, where a small block size makes tens of millions of block rows. ``on_start``
    gets the number of requests to replay once the trace is loaded (a progress bar's total);
    ``progress`` is called every 4,096 steps in cost mode, every step in engine mode."""
    if not keep_events:
        events_path = None
    if config.mode == "engine":
        return run_engine_mode(
            config, progress, events_path, keep_events=keep_events, on_start=on_start
        )
    trace_path, trace = load_workload(config)
    # max_model_len first: vLLM fits the default batch limits to it; its warning keeps its place
    max_model_len_warnings: list[str] = []
    max_model_len = resolve_max_model_len(
        config, resolve_model(config.model).max_model_len, max_model_len_warnings
    )
    warnings: list[str] = []
    pools = None
    if config.pd is not None:
        # the decode pool's figures stand for the run's (they are --gpu's and --tp's unless
        # --pd-decode-gpu / --pd-decode-tp are given); each pool's in resolved.pd_pools
        pools = resolve_pd_pools(config, max_model_len, warnings)
        cost_model, limits = pools[1].cost_model, pools[1].limits
        num_blocks, plan = pools[1].num_blocks, pools[1].memory_plan
    else:
        cost_model = build_cost_model(config)
        limits = scheduling_limits(config, cost_model.gpu, max_model_len)
        num_blocks, plan = resolve_num_blocks(config, cost_model, limits, warnings)
    executor = build_executor(config, cost_model)
    warnings += max_model_len_warnings
    offload = build_offload(config, cost_model)
    resolved = {
        "trace_path": str(trace_path),
        "trace_path_absolute": str(trace_path.resolve()),
        "trace_name": trace.name,
        "num_blocks": num_blocks,
        "max_model_len": max_model_len,
        "scheduler": config.resolved_scheduler(),
        "enable_prefix_caching": config.caches_prefixes(),
        **dataclasses.asdict(limits),
        "memory_plan": plan,
        "cost_model": cost_model.describe(),
        "step_time": executor.describe() if isinstance(executor, LinearStepExecutor) else None,
        "warnings": warnings,
    }
    if offload is not None:  # absent without offload: such a run's folder is as before
        resolved["offload"] = offload.describe()
    if pools is not None:
        from kvsim.fleet.pd_run import simulate_pd_fleet

        if config.sets_pd_pools():  # absent otherwise: such a run's folder is as before
            resolved["pd_pools"] = {
                p.role: {**p.describe(), "memory_plan": p.memory_plan} for p in pools
            }
        if on_start is not None:
            on_start(len(trace.requests))
        summary, requests, steps, routing = simulate_pd_fleet(
            config, trace, pools, max_model_len, progress, events_path
        )
        return RunResult(
            config, resolved, summary, requests, steps, None, events_path,
            extra_tables={"routing": routing},
        )  # fmt: skip
    if config.replicas > 1:
        from kvsim.fleet.run import simulate_fleet  # a one-replica run need not import it

        if on_start is not None:
            on_start(len(trace.requests))
        summary, requests, steps, routing = simulate_fleet(
            config, trace, num_blocks, max_model_len,
            lambda: build_executor(config, cost_model), limits, progress, events_path,
        )  # fmt: skip
        return RunResult(
            config, resolved, summary, requests, steps, None, events_path,
            extra_tables={"routing": routing},
        )  # fmt: skip
    return simulate(
        config, trace, num_blocks, max_model_len, executor, resolved, progress,
        events_path=events_path, keep_events=keep_events, on_start=on_start, limits=limits,
        offload=offload, finish_events_later=finish_events_later,
    )  # fmt: skip


__all__ = ["RunResult", "run", "simulate"]
