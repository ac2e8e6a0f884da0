"""``kvsim validate-real SPEC``: kvsim against a real deployment's measured runs.

For each workload of the SPEC (kvsim/outputs/real_spec.py) the trace is built from its recipe
(workloads/shared_prefix.py), replayed in cost mode under the deployment's limits (model, GPU,
tp, pool, token budget, sequence cap, block size, prefix caching, chunked prefill; the
client's timeout as each request's ``cancel_after_s``), and each stage's predicted TTFT,
TPOT and end-to-end means (and p90 / p99) are set beside the measured ones with signed errors.
A stage is called saturated when the run could not keep up with it: requests timed out, or
the queue at the stage's end holds more than ``SATURATED_BACKLOG_S`` seconds of its arrivals.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.analysis.table import Table, is_label
from kvsim.atomic import FolderKind, output_folder
from kvsim.config import RunConfig
from kvsim.costmodel import load_coefficients
from kvsim.costmodel.stacks import resolve_stack, stack_preset_name
from kvsim.outputs.real_spec import Measured, RealSpec, RealWorkload
from kvsim.plots import save_png
from kvsim.plots.real_runs import plot_real_errors
from kvsim.runner import RunResult, run
from workloads import save_trace
from workloads.shared_prefix import shared_prefix_trace, stage_of

# A stage whose unfinished requests at its end exceed this many seconds of its arrivals is not
# being kept up with (a served stage's backlog is its E2E latency: seconds, not tens).
SATURATED_BACKLOG_S = 30.0
STATUS_FINISHED = "finished"
STATUS_ABORTED = "aborted"
_FILES = ("comparison.json", "stages.csv", "errors.png")
VALIDATE_REAL_FOLDER = FolderKind(
    what="validate-real folder",
    marker_file="comparison.json",
    marker_key="kvsim_validate_real",
    entries=frozenset(_FILES),
)


@dataclass(frozen=True, slots=True)
class ClientView:
    """What lies between kvsim's engine clock and the client's: vLLM's async scheduling (the
    next step is scheduled while the current one runs, so a request that arrives while the
    engine is busy is prefilled one step later than a synchronous engine would) and the
    server's front end (request parsing, tokenization, the engine hand-off, detokenization
    and the streamed response: seconds added to TTFT and E2E alike)."""

    async_scheduling: bool = False
    frontend_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StageResult:
    """One stage: predicted figures (ms, counts) beside the measured ones."""

    workload: str
    stage: int
    rate_per_s: float
    duration_s: float
    num_requests: int
    finished: int
    timed_out: int
    saturated: bool
    predicted: dict[str, float]  # ttft_ms / tpot_ms / e2e_ms: mean, p90, p99 (finished)
    measured: Measured

    def error(self, metric: str) -> float | None:
        """Signed relative error of the predicted mean (predicted / measured - 1), or None."""
        real = getattr(self.measured, metric)
        key = "e2e_ms.mean" if metric == "e2e_finished_ms" else f"{metric}.mean"
        if metric == "e2e_ms" and real is None:  # an overloaded run publishes its finished ones'
            real = self.measured.e2e_finished_ms
        if metric == "finished":
            return None if real is None else self.finished / real - 1.0
        if real is None or key not in self.predicted:
            return None
        return float(self.predicted[key] / real - 1.0)


@dataclass(slots=True)
class RealValidation:
    """Every stage of every workload of a SPEC, and the runs' resolved settings."""

    spec: RealSpec
    stages: list[StageResult] = field(default_factory=list)
    resolved: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per stage (errors in %), for a CSV or a printed table."""
        out = []
        for s in self.stages:
            row: dict[str, Any] = {
                "workload": s.workload,
                "stage": s.stage,
                "rate_per_s": s.rate_per_s,
                "duration_s": s.duration_s,
                "requests": s.num_requests,
                "finished": s.finished,
                "timed_out": s.timed_out,
                "saturated": s.saturated,
                "measured_overloaded": s.measured.overloaded,
            }
            for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
                for stat in ("mean", "p90", "p99"):
                    row[f"{metric}.{stat}"] = s.predicted.get(f"{metric}.{stat}", float("nan"))
                real = getattr(s.measured, metric)
                if metric == "e2e_ms" and real is None:
                    real = s.measured.e2e_finished_ms
                row[f"measured_{metric}"] = float("nan") if real is None else real
                err = s.error(metric)
                row[f"error_{metric}_pct"] = float("nan") if err is None else 100.0 * err
            for name in ("finished", "e2e_finished_ms"):
                real = getattr(s.measured, name)
                row[f"measured_{name}"] = float("nan") if real is None else real
                err = s.error(name)
                row[f"error_{name}_pct"] = float("nan") if err is None else 100.0 * err
            out.append(row)
        return out


def run_config(spec: RealSpec, trace_path: Path, coefficients: str | None) -> RunConfig:
    """The deployment's limits as a cost-mode RunConfig over ``trace_path``."""
    d = spec.deployment
    return RunConfig(
        trace=str(trace_path),
        model=d["model"],
        gpu=d["gpu"],
        tp=d["tp"],
        coefficients=coefficients,
        block_size=d["block_size"],
        num_blocks=d["num_blocks"],
        max_num_seqs=d["max_num_seqs"],
        max_num_batched_tokens=d["max_num_batched_tokens"],
        max_model_len=d["max_model_len"],
        enable_prefix_caching=d["enable_prefix_caching"],
        enable_chunked_prefill=d["enable_chunked_prefill"],
        scheduler="v1",
    )


def spec_coefficients(spec: RealSpec) -> str | None:
    """The shipped coefficients of the deployment's GPU under its serving stack (a name
    ``load_coefficients`` resolves), or None (the GPU preset's) without one."""
    stack = spec.deployment.get("serving_stack")
    if stack is None:
        return None
    name = stack_preset_name(spec.deployment["gpu"], resolve_stack(stack))
    load_coefficients(name)  # a GPU without a shipped preset: the error names both
    return name


def _stats(values: np.ndarray, prefix: str) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {
        f"{prefix}.mean": float(values.mean()),
        f"{prefix}.p90": float(np.percentile(values, 90)),
        f"{prefix}.p99": float(np.percentile(values, 99)),
    }


def client_view(spec: RealSpec) -> ClientView:
    """What lies between the engine and the client in ``spec``'s deployment: its
    ``async_scheduling``, and its ``frontend_latency_s`` or, without one, its serving stack's
    (0 without a stack)."""
    d = spec.deployment
    frontend = d.get("frontend_latency_s")
    if frontend is None:
        stack = d.get("serving_stack")
        frontend = 0.0 if stack is None else resolve_stack(stack).frontend_latency_s
    return ClientView(async_scheduling=d.get("async_scheduling", False), frontend_s=frontend)


def fit_frontend_latency_s(measured_ms: np.ndarray, predicted_ms: np.ndarray) -> float:
    """The constant (s) that, added to every predicted TTFT mean (ms, without a front end),
    minimizes the sum of squared relative errors against the measured means: least squares
    on relative error, as kvsim's other fits."""
    weights = 1.0 / measured_ms**2
    return float(np.sum((measured_ms - predicted_ms) * weights) / np.sum(weights)) * 1e-3


def client_latencies(table: Table, view: ClientView) -> tuple[np.ndarray, np.ndarray]:
    """TTFT and E2E (s) as the client sees them: the engine's, plus one step where the engine
    was busy when the request arrived and schedules a step ahead (``view.async_scheduling``),
    plus the server's front end (``view.frontend_s``). TPOT is unchanged: both ends move."""
    lag = np.zeros(len(table))
    if view.async_scheduling:
        busy = table["queueing_delay_s"] > 0
        lag = np.where(busy, table["prefill_time_s"], 0.0)
    shift = lag + view.frontend_s
    return table["ttft_s"] + shift, table["e2e_latency_s"] + shift


def stage_results(
    workload: RealWorkload, result: RunResult, view: ClientView | None = None
) -> list[StageResult]:
    """Each stage's figures from one run's requests table."""
    view = view or ClientView()
    table = result.requests_table
    ids = table["request_id"]
    stages = np.fromiter((stage_of(str(i)) for i in ids), np.int64, len(ids))
    finished = is_label(table, "status", STATUS_FINISHED)
    aborted = is_label(table, "status", STATUS_ABORTED)
    finish = table["finish_time_s"]
    out = []
    start = 0.0
    recipe = workload.recipe
    for index, (stage, measured) in enumerate(zip(recipe.stages, workload.measured, strict=True)):
        mine = stages == index
        done = mine & finished
        end = start + stage.duration_s
        # Requests of the stage still waiting or running when its last one was sent.
        backlog = int(np.sum(mine & ~(finish <= end)))
        ttft, e2e = client_latencies(table, view)
        predicted = {
            **_stats(1e3 * ttft[done], "ttft_ms"),
            **_stats(1e3 * table["tpot_s"][done], "tpot_ms"),
            **_stats(1e3 * e2e[done], "e2e_ms"),
        }
        timed_out = int(np.sum(mine & aborted))
        out.append(
            StageResult(
                workload=recipe.name,
                stage=index,
                rate_per_s=stage.rate_per_s,
                duration_s=stage.duration_s,
                num_requests=int(mine.sum()),
                finished=int(done.sum()),
                timed_out=timed_out,
                saturated=timed_out > 0 or backlog > SATURATED_BACKLOG_S * stage.rate_per_s,
                predicted=predicted,
                measured=measured,
            )
        )
        start = end
    return out


def validate_real(
    spec: RealSpec,
    *,
    coefficients: str | None = None,
    workloads: tuple[str, ...] = (),
    on_workload: Callable[[str], None] | None = None,
) -> RealValidation:
    """Replay every workload of ``spec`` (or only those named) and compare each stage."""
    validation = RealValidation(spec)
    with tempfile.TemporaryDirectory(prefix="kvsim-validate-real-") as tmp:
        for workload in spec.workloads:
            name = workload.recipe.name
            if workloads and name not in workloads:
                continue
            if on_workload is not None:
                on_workload(name)
            trace_path = Path(tmp) / f"{name}.jsonl"
            save_trace(shared_prefix_trace(workload.recipe), trace_path)
            config = run_config(spec, trace_path, coefficients or spec_coefficients(spec))
            result = run(config, keep_events=False)
            view = client_view(spec)
            validation.resolved[name] = {
                "num_blocks": result.resolved["num_blocks"],
                "coefficients_source": result.resolved["cost_model"]["coefficients_source"],
                "async_scheduling": view.async_scheduling,
                "frontend_latency_s": view.frontend_s,
            }
            validation.stages.extend(stage_results(workload, result, view))
    return validation


def write_validation(validation: RealValidation, out_dir: Path, *, force: bool = False) -> None:
    """Write validate-real's folder (all or nothing; an existing one only if kvsim wrote it,
    with ``force``): comparison.json (the SPEC's provenance, what the runs resolved to, every
    stage), stages.csv (one row per stage) and errors.png."""
    rows = validation.rows()
    spec = validation.spec
    doc = {
        "kvsim_validate_real": 1,
        "spec": spec.name,
        "spec_source": spec.source,
        "provenance": spec.provenance,
        "deployment": spec.deployment,
        "resolved": validation.resolved,
        "stages": [{k: _json_value(v) for k, v in row.items()} for row in rows],
        "recipes": {w.recipe.name: dataclasses.asdict(w.recipe) for w in spec.workloads},
    }
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["workload"])
    writer.writeheader()
    writer.writerows(rows)
    with output_folder(out_dir, VALIDATE_REAL_FOLDER, force=force) as tmp:
        text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
        (tmp / "comparison.json").write_text(text, encoding="utf-8")
        (tmp / "stages.csv").write_text(buffer.getvalue(), encoding="utf-8")
        figure = plot_real_errors(rows, title=f"kvsim against {spec.name}")
        save_png(figure, tmp / "errors.png")


def _json_value(value: Any) -> Any:
    """NaN (a figure not published, or no finished request) as JSON null."""
    return None if isinstance(value, float) and value != value else value
