"""``kvsim validate-run``: engine mode and calibrated cost mode on the same trace.

1. Engine mode runs the trace on the torch engine, threads pinned; every step's BatchShape is
   recorded beside its measured time (what engine mode advances the clock by).
2. Step-time error without schedule divergence: each recorded step is priced by the calibrated
   CostModel and compared with its measurement (MAPE by step kind and batch size).
3. End-to-end error: cost mode replays the same trace, seed and pool with the calibrated
   CostModel; throughput, TTFT, TPOT and end-to-end latency are compared (relative error).

The folder written: ``steps.csv`` (engine steps: measured and predicted), ``comparison.json``
(every figure above, the noise of the machine), ``step_times.png`` (predicted vs measured),
``step_timeline.png`` (both against simulated time).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine import LLMEngine, Scheduler, SchedulerOutput
from kvsim.atomic import FolderKind, output_folder
from kvsim.config import RunConfig, scheduling_limits
from kvsim.costmodel import CostModel, GPUSpec, ModelSpec, StepCoefficients, resolve_gpu
from kvsim.costmodel.validate import mape_table
from kvsim.plots import save_png
from kvsim.plots.calibration import plot_predicted_vs_measured, plot_step_time_validation
from kvsim.runner import RunResult, load_workload, simulate
from kvsim.sim.engine_mode import EngineExecutor, PromptTokens, build_llm
from kvsim.sim.engine_timing import CLOCKS, engine_clock, load_average
from kvsim.sim.executor import CostModelExecutor, step_shape

# The end-to-end figures compared: summary.json key (a distribution's "mean"/"p50"/"p99"
# after a dot).
COMPARED = (
    "throughput_output_tokens_per_s",
    "throughput_requests_per_s",
    "ttft_s.mean",
    "ttft_s.p50",
    "ttft_s.p99",
    "tpot_s.mean",
    "tpot_s.p50",
    "tpot_s.p99",
    "e2e_latency_s.mean",
    "sim_duration_s",
)
BATCH_RANGES = (0, 1, 4, 16, 64, 1 << 20)
BATCH_LABELS = ("1", "2-4", "5-16", "17-64", "> 64")


class RecordingEngineExecutor(EngineExecutor):
    """Engine mode that also keeps each step's BatchShape counts and measured seconds, timed by
    ``clock`` (engine_timing.CLOCKS: the wall clock, as engine mode, or the thread's CPU time)."""

    def __init__(self, llm: LLMEngine, clock: Callable[[], int] = CLOCKS["wall"]) -> None:
        super().__init__(llm)
        self.clock = clock
        self.records: list[tuple[int, ...]] = []
        self.seconds: list[float] = []
        self.kinds: list[str] = []

    def execute(self, out: SchedulerOutput, scheduler: Scheduler) -> tuple[float, list[int]]:
        shape = step_shape(out, sum(len(seq.block_table) for seq in out.seqs))
        start = self.clock()
        tokens = self.llm.execute_model(out)
        if self._cuda:
            import torch

            torch.cuda.synchronize()
        dt = (self.clock() - start) * 1e-9
        self.records.append((
            shape.num_seqs, shape.num_batched_tokens, shape.num_decode_seqs,
            shape.decode_context_tokens, shape.prefill_causal_pairs,
            shape.prefill_cached_pairs, shape.prefill_cached_tokens, shape.num_blocks_walked,
        ))  # fmt: skip
        self.seconds.append(dt)
        self.kinds.append(str(out.kind))
        return dt, tokens


def engine_model_spec(llm: LLMEngine, name: str) -> ModelSpec:
    """The cost model's view of the engine's model, in its real dtype (CPU runs float32)."""
    c = llm.model_config
    params = sum(p.numel() for p in llm.model_runner.model.parameters())
    dtype_bytes = int(llm.kv_cache.key_cache[0].element_size())
    return ModelSpec(
        name=Path(name).name or "engine-model",
        num_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        vocab_size=c.vocab_size,
        dtype_bytes=dtype_bytes,
        num_params=int(params),
        max_model_len=c.max_position_embeddings,
    )


@dataclass(frozen=True)
class RunComparison:
    """One validate-run: the engine steps priced, both runs, and the figures compared."""

    steps: pd.DataFrame  # engine steps: time_s, kind, num_seqs, measured_s, predicted_s, error
    summary: dict[str, Any]  # step MAPE, end-to-end errors, noise
    engine: RunResult
    cost: RunResult


def _dig(summary: dict[str, Any], key: str) -> float:
    value: Any = summary
    for part in key.split("."):
        value = value[part]
    return float(value)


def compare_runs(
    config: RunConfig, gpu: GPUSpec, coefficients: StepCoefficients, timer: str = "wall"
) -> RunComparison:
    """Engine mode and cost mode (with ``coefficients`` on ``gpu``) on ``config``'s trace;
    engine steps timed by ``timer`` ("wall", as engine mode, or "thread": engine_timing)."""
    engine_config = config.replace(mode="engine")
    clock = engine_clock(timer, config.threads)
    _, trace = load_workload(engine_config)
    load_before, started = load_average(), time.perf_counter()
    # Both runs schedule under the same limits (the run's GPU preset's serving defaults).
    limits = scheduling_limits(engine_config, resolve_gpu(config.gpu), config.max_model_len)
    llm = build_llm(engine_config, limits)
    executor = RecordingEngineExecutor(llm, clock)
    scheduler = llm.scheduler
    max_model_len = scheduler.config.max_model_len
    num_blocks = llm.block_manager.num_blocks
    tokens_of = PromptTokens(llm.model_config.vocab_size, config.seed, trace.hash_block_size)
    engine = simulate(
        engine_config, trace, num_blocks, max_model_len, executor, {}, scheduler=scheduler,
        prompt_tokens_of=tokens_of, limits=limits,
    )  # fmt: skip
    engine_wall = time.perf_counter() - started
    spec = engine_model_spec(llm, config.model)
    cost_model = CostModel(spec, gpu, tp=1, coefficients=coefficients)
    cost_config = config.replace(mode="cost", num_blocks=num_blocks, max_model_len=max_model_len)
    cost = simulate(
        cost_config, trace, num_blocks, max_model_len, CostModelExecutor(cost_model), {},
        limits=limits,
    )  # fmt: skip
    steps = engine.steps[["step", "time_s", "kind", "num_seqs", "num_batched_tokens"]].copy()
    steps["measured_s"] = executor.seconds
    steps["predicted_s"] = [cost_model.step_time_of(*r) for r in executor.records]
    steps["error"] = steps["predicted_s"] / steps["measured_s"] - 1.0
    steps["batch_range"] = pd.cut(steps["num_seqs"], BATCH_RANGES, labels=BATCH_LABELS)
    errors = {
        key: _dig(cost.summary, key) / _dig(engine.summary, key) - 1.0
        for key in COMPARED
        if _dig(engine.summary, key)
    }
    summary = {
        "kvsim_validate_run": 1,
        "trace": config.trace,
        "num_steps": {"engine": len(steps), "cost": int(cost.summary["num_steps"])},
        "step_time_mape_pct": round(100 * float(steps["error"].abs().mean()), 2),
        "step_time_median_error_pct": round(100 * float(steps["error"].abs().median()), 2),
        "step_time_by_kind": mape_table(steps, ["kind"]).to_dict(orient="records"),
        "engine": {key: _dig(engine.summary, key) for key in COMPARED},
        "cost": {key: _dig(cost.summary, key) for key in COMPARED},
        "relative_error": errors,
        "threads": config.threads,
        "timer": timer,
        "engine_wall_s": round(engine_wall, 2),
        "load_average": {"before": load_before, "after": load_average()},
        "coefficients": coefficients.source or "in memory",
    }
    return RunComparison(steps, summary, engine, cost)


_FILES = ("steps.csv", "comparison.json", "step_times.png", "step_timeline.png")
# comparison.json's "kvsim_validate_run" key marks the folder as kvsim's (kvsim.atomic).
VALIDATE_RUN_FOLDER = FolderKind(
    what="validate-run folder",
    marker_file="comparison.json",
    marker_key="kvsim_validate_run",
    entries=frozenset(_FILES),
)


def write_comparison(
    comparison: RunComparison, out_dir: Path, *, force: bool = False
) -> list[Path]:
    """Write validate-run's folder (all or nothing; an existing one only if kvsim wrote it,
    with ``force``); return its files."""
    steps = comparison.steps
    with output_folder(out_dir, VALIDATE_RUN_FOLDER, force=force) as tmp:
        steps.to_csv(tmp / "steps.csv", index=False)
        text = json.dumps(comparison.summary, indent=2, default=_json_default) + "\n"
        (tmp / "comparison.json").write_text(text, encoding="utf-8")
        scatter = plot_predicted_vs_measured(
            steps, color_by="kind", title="engine steps: cost model vs measured"
        )
        save_png(scatter, tmp / "step_times.png")
        timeline = plot_step_time_validation(steps, title="engine step times over the run")
        save_png(timeline, tmp / "step_timeline.png")
    return [out_dir / name for name in _FILES]


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
