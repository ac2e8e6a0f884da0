"""One run, from a RunConfig to tables: load the trace, size the KV cache, simulate, measure.

resolve.py turns the config into what a run needs (trace, cost model, KV pool, max_model_len,
executor, a P/D fleet's pools); execute.py runs it (``run``: cost mode, a fleet, or engine
mode: engine_run.py); replay.py is ``simulate``, one replica's replay through the engine and
its measurement; result.py is ``RunResult``, what a run holds in memory."""

from kvsim.runner.execute import RunResult, run, simulate
from kvsim.runner.resolve import (
    build_cost_model,
    build_executor,
    load_workload,
    plan_pd_pool,
    resolve_max_model_len,
    resolve_num_blocks,
    resolve_pd_pools,
)

__all__ = [
    "RunResult",
    "build_cost_model",
    "build_executor",
    "load_workload",
    "plan_pd_pool",
    "resolve_max_model_len",
    "resolve_num_blocks",
    "resolve_pd_pools",
    "run",
    "simulate",
]
