"""Metrics from the event stream: per-request, per-step and summary tables.

Definitions and formulas live in docs/metrics.md. Everything here is computed from the
recorder's events plus the per-step durations and filled-slot counts the clock measured;
nothing reaches into the engine's objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from engine import EventKind, StepKind
from kvsim.analysis.events_io import EVENT_KIND_NAMES, exploded_frame
from kvsim.analysis.kv_breakdown import breakdown_means
from kvsim.analysis.load import (
    distribution,
    itl_samples,
    overload,
    rejections,
    step_time_noise,
    weighted_distribution,
)
from kvsim.analysis.prefix_metrics import Admissions, request_columns
from kvsim.analysis.table import Table, TableLike, column, is_any, is_label
from kvsim.sim.records import SimResult
from workloads.request_columns import request_column, request_ids

if TYPE_CHECKING:
    import pandas as pd

STATUS_BY_END_KIND = {
    EventKind.FINISH: "finished",
    EventKind.ABORT: "aborted",
    EventKind.REJECT: "rejected",
}
STEP_KIND_NAMES = tuple(str(k) for k in StepKind)
STATUSES = ("finished", "aborted", "rejected", "unfinished")  # requests.parquet's status labels


def events_frame(result: SimResult, *, block_hashes: bool = False) -> pd.DataFrame:
    """events.parquet: one row per (event, block); events without blocks have block_id -1.
    ``block_hashes``: add the ``block_hash`` column (the recorder kept the keys)."""
    cols, block_ids = result.recorder.columns()
    return exploded_frame(cols, block_ids, result.recorder.block_hashes() if block_hashes else None)


def mark_events(result: SimResult) -> Table:
    """PREEMPT and REJECT events (time_s, kind, seq_id, free_blocks): the plots' markers."""
    cols, _ = result.recorder.columns()
    keep = is_any(cols["kind"], (EventKind.PREEMPT, EventKind.REJECT))
    return Table(
        {
            "time_s": cols["time_s"][keep],
            "kind": cols["kind"][keep].astype(np.int8),
            "seq_id": cols["seq_id"][keep],
            "free_blocks": cols["free_blocks"][keep],
        },
        categories={"kind": tuple(EVENT_KIND_NAMES)},
    )


def steps_table(result: SimResult, *, v1: bool = False) -> Table:
    """steps.parquet: one row per executed step; a ``v1`` run's steps add
    ``num_prefill_tokens`` and ``num_decode_tokens`` (its batched tokens, split)."""
    steps = result.recorder.step_columns()
    n = len(result.step_duration_s)
    free = steps["free_blocks"][:n]
    split: dict[str, np.ndarray] = {}
    if v1:
        prefill = np.zeros(n, dtype=np.int64)
        if result.step_prefill_tokens is not None:
            prefill = result.step_prefill_tokens[:n]
        split = {
            "num_prefill_tokens": prefill,
            "num_decode_tokens": steps["num_batched_tokens"][:n] - prefill,
        }
    return Table(
        {
            "step": steps["step"][:n],
            "time_s": steps["time_s"][:n],
            "duration_s": result.step_duration_s,
            "kind": steps["kind"][:n].astype(np.int8),
            "num_seqs": steps["num_seqs"][:n],
            "num_running": result.step_num_running,
            "num_batched_tokens": steps["num_batched_tokens"][:n],
            **split,
            "free_blocks": free,
            "allocated_slots": (result.num_blocks - free) * result.block_size,
            "filled_slots": result.step_filled_slots,
        },
        categories={"kind": STEP_KIND_NAMES},
    )


def requests_table(result: SimResult, steps: Table, admissions: Admissions | None = None) -> Table:
    """requests.parquet: one row per submitted request, in submission (seq_id) order. With a
    v1 run's ``admissions`` it adds the prefix-cache columns (``request_columns``) and
    ``prefill_time_s`` (first token - admission: TTFT = queueing_delay_s + prefill_time_s)."""
    cols, _ = result.recorder.columns()
    kind, seq_id, t = cols["kind"], cols["seq_id"], cols["time_s"]
    n = len(result.requests)

    def first_per_seq(
        mask: np.ndarray, values: np.ndarray, fill: float, dtype: DTypeLike | None = None
    ) -> np.ndarray:
        # ``dtype``: the output's, the values converted (exactly) as they are written rather
        # than the whole column first (a million requests' kept events: 32 MB a column)
        if dtype is None:
            dtype = values.dtype if fill != fill else np.float64
        out = np.full(n, fill, dtype=dtype)
        ids, vals = seq_id[mask], values[mask]
        # Reverse so the earliest event of each sequence is written last and wins.
        out[ids[::-1]] = vals[::-1]
        return out

    arrival = first_per_seq(kind == EventKind.ARRIVE, t, np.nan)
    admit_mask = kind == EventKind.ADMIT
    admit_time = first_per_seq(admit_mask, t, np.nan)
    admit_step = first_per_seq(admit_mask, cols["step"], np.nan, np.float64)
    first_token = _step_end_at(steps, admit_step)
    is_first = kind == EventKind.FIRST_TOKEN
    if is_first.any():
        # v1 records the step that completes each prompt: a chunked prompt's first token
        # comes with its last chunk (the admission step's end is only its first chunk's)
        first_token = first_per_seq(is_first, t, np.nan)
    end_mask = is_any(kind, list(STATUS_BY_END_KIND))
    finish_time = first_per_seq(end_mask, t, np.nan)
    # The admit step's token exists only if the request was still there when the step
    # ended: not when it was aborted mid-step, nor when the run stopped (--until) first.
    lost = (first_token > finish_time) | (first_token > result.sim_end_s)
    first_token[lost] = np.nan
    end_kind = first_per_seq(end_mask, kind, np.nan, np.float64)
    end_tokens = first_per_seq(end_mask, cols["num_tokens"], np.nan, np.float64)
    preemptions = np.bincount(seq_id[kind == EventKind.PREEMPT], minlength=n)[:n]

    prompt = request_column(result.requests, "prompt_tokens")
    status = np.full(n, STATUSES.index("unfinished"), dtype=np.int8)
    for code, name in STATUS_BY_END_KIND.items():
        status[end_kind == code] = STATUSES.index(name)
    generated = np.where(np.isnan(end_tokens), np.nan, end_tokens - prompt)
    finished = status == STATUSES.index("finished")
    output = request_column(result.requests, "output_tokens")
    reason = np.full(n, None, dtype=object)
    # one str object per reason, not one per request from a fixed-width array (a million
    # finished requests: a 120 MB '<U30' temporary and 55 MB of copies of "length")
    reason[finished] = "length"
    reason[finished & (generated < output)] = "length (max_model_len reached)"
    reason[status == STATUSES.index("aborted")] = "aborted (cancel_after_s elapsed)"
    reason[status == STATUSES.index("rejected")] = "rejected"
    for rejected_id, why in result.reject_reasons.items():
        if rejected_id < n:
            reason[rejected_id] = why
    e2e = np.where(finished, finish_time - arrival, np.nan)
    ttft = first_token - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(
            finished & (generated > 1), (finish_time - first_token) / (generated - 1), np.nan
        )
    v1_columns: dict[str, np.ndarray] = {}
    v1_latency: dict[str, np.ndarray] = {}
    if admissions is not None:
        v1_columns = request_columns(admissions, n)
        v1_latency = {"prefill_time_s": first_token - admit_time}
    request_id = np.empty(n, dtype=object)
    request_id[:] = request_ids(result.requests)
    return Table(
        {
            "request_id": request_id,
            "seq_id": np.arange(n, dtype=np.int64),
            "arrival_time_s": arrival,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "generated_tokens": generated,
            "status": status,
            "finish_reason": reason,
            "admit_time_s": admit_time,
            "first_token_time_s": first_token,
            "finish_time_s": finish_time,
            "num_preemptions": preemptions.astype(np.int64),
            **v1_columns,
            "queueing_delay_s": admit_time - arrival,
            **v1_latency,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_latency_s": e2e,
        },
        categories={"status": STATUSES},
        text=frozenset({"request_id", "finish_reason"}),
    )


def _step_end_at(steps: Table, step_ids: np.ndarray) -> np.ndarray:
    """End time of the step numbered ``step_ids[i]`` (NaN where it is NaN or no such step)."""
    numbers = steps["step"]
    ends = steps["time_s"] + steps["duration_s"]
    out = np.full(len(step_ids), np.nan)
    known = ~np.isnan(step_ids)
    wanted = step_ids[known].astype(np.int64)
    at = np.searchsorted(numbers, wanted)  # step numbers rise: one per executed step
    found = at < len(numbers)
    found[found] = numbers[at[found]] == wanted[found]
    filled = np.flatnonzero(known)[found]
    out[filled] = ends[at[found]]
    return out


def _distribution(table: TableLike, name: str, rows: np.ndarray | None = None) -> dict[str, Any]:
    values = column(table, name, np.float64)
    return distribution(values if rows is None else values[rows])


def _time_weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    total = float(weights.sum())
    return float((values * weights).sum() / total) if total > 0 else 0.0


def summarize(
    result: SimResult,
    requests: TableLike,
    steps: TableLike,
    *,
    closed_loop: bool = False,
    measured: bool = False,
    prefix_cache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json. Shares are of all KV slots; time averages are weighted by step duration.
    ``closed_loop``: users wait for answers (never saturated); ``measured``: step times are
    wall time (engine mode), so their noise is estimated. ``prefix_cache``: a v1 run's
    prefix-cache fields (``prefix_metrics.prefix_cache_summary``), written after the KV
    breakdown, with ``prefill_time_s`` after ``ttft_s``; a classic summary has neither.
    ``requests`` and ``steps`` are Tables or DataFrames of requests.parquet's and
    steps.parquet's columns."""
    v1_latency: dict[str, Any] = {}
    if prefix_cache is not None:
        v1_latency = {"prefill_time_s": _distribution(requests, "prefill_time_s")}
    total_slots = result.num_blocks * result.block_size
    finished = is_label(requests, "status", "finished")
    # The run spans from time 0 (the trace's start) to the last thing that happened.
    duration = result.sim_end_s
    # A step still running when --until stopped the run counts only up to the stop.
    start = column(steps, "time_s")
    # np.minimum(start + duration_s, duration) - start, in one array (2 M steps: 16 MB each)
    weights = start + column(steps, "duration_s")
    np.minimum(weights, duration, out=weights)
    weights -= start
    allocated = column(steps, "allocated_slots")
    usage = allocated / total_slots
    internal = (allocated - column(steps, "filled_slots")) / total_slots
    output_tokens = float(column(requests, "generated_tokens")[finished].sum())
    prompt_tokens = float(column(requests, "prompt_tokens")[finished].sum())
    num_finished = int(finished.sum())
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    num_steps = len(steps)
    num_seqs = column(steps, "num_seqs")
    return {
        "num_requests": len(requests),
        "num_finished": num_finished,
        "num_rejected": int(is_label(requests, "status", "rejected").sum()),
        "num_aborted": int(is_label(requests, "status", "aborted").sum()),
        "num_unfinished": int(is_label(requests, "status", "unfinished").sum()),
        "num_preemptions": int(column(requests, "num_preemptions").sum()),
        "block_size": result.block_size,
        "num_blocks": result.num_blocks,
        "sim_duration_s": duration,
        "num_steps": num_steps,
        "throughput_requests_per_s": rate(num_finished),
        "throughput_output_tokens_per_s": rate(output_tokens),
        "throughput_total_tokens_per_s": rate(output_tokens + prompt_tokens),
        "total_prompt_tokens": int(prompt_tokens),
        "total_output_tokens": int(output_tokens),
        "queueing_delay_s": _distribution(requests, "queueing_delay_s"),
        "ttft_s": _distribution(requests, "ttft_s"),
        **v1_latency,
        "tpot_s": _distribution(requests, "tpot_s"),
        "itl_s": weighted_distribution(*itl_samples(steps)),
        "e2e_latency_s": _distribution(requests, "e2e_latency_s", finished),
        "kv_usage_mean": _time_weighted_mean(usage, weights),
        "kv_usage_peak": float(usage.max()) if num_steps else 0.0,
        "internal_fragmentation_mean": _time_weighted_mean(internal, weights),
        **breakdown_means(steps, total_slots, weights),
        **(prefix_cache or {}),
        "mean_running_seqs": _time_weighted_mean(column(steps, "num_running"), weights),
        "mean_batch_size": _time_weighted_mean(num_seqs, weights),
        "max_batch_size": int(num_seqs.max()) if num_steps else 0,
        "busy_time_s": float(weights.sum()),
        **overload(requests, duration, closed_loop=closed_loop),
        "rejections": rejections(requests),
        "timing": "measured wall time" if measured else "cost model",
        "step_time_noise_cv": step_time_noise(steps) if measured else None,
        "wall_time_s": result.wall_time_s,
        "sim_requests_per_wall_s": len(requests) / result.wall_time_s
        if result.wall_time_s
        else 0.0,
        "sim_steps_per_wall_s": num_steps / result.wall_time_s if result.wall_time_s else 0.0,
    }


# Fields that measure the simulator itself, not the simulated system: they differ between
# otherwise identical runs.
WALL_CLOCK_FIELDS = ("wall_time_s", "sim_requests_per_wall_s", "sim_steps_per_wall_s")
