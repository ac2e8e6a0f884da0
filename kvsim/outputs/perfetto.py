"""A run as a Chrome trace-event JSON timeline, for ui.perfetto.dev and chrome://tracing.

Layout of the trace (trace-event format: ``ph`` "X" complete slices, "C" counters, "M"
metadata naming processes and threads; ``ts`` and ``dur`` in microseconds of simulated time):

- process 1 "engine": thread 1 "steps", one slice per step (prefill / decode, with batch
  size, batched tokens and free blocks in ``args``); counters "free blocks", "running
  sequences" and "batched tokens" (a sample whenever the value changes).
- process 2 "requests": one thread per request, named by its request id, with its states as
  slices (queued / prefill / decode / preempted, see ``kvsim.occupancy.request_states``).

Large runs: limit to a time window and to the first ``max_requests`` requests in it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.analysis.occupancy import request_states, run_end_s
from kvsim.atomic import atomic_write_bytes
from kvsim.errors import KvsimError

ENGINE_PID, STEPS_TID, REQUESTS_PID = 1, 1, 2
US_PER_S = 1e6
TOLERANCE_US = 1e-3  # timestamps are rounded to the nanosecond
PHASES = {"X", "C", "M", "i"}
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
COUNTERS = (
    ("free blocks", "free_blocks", "free_blocks"),
    ("running sequences", "num_running", "running"),
    ("batched tokens", "num_batched_tokens", "tokens"),
)


class TraceFormatError(KvsimError):
    """A document is not a valid trace-event JSON timeline."""


def _us(seconds: np.ndarray | pd.Series) -> np.ndarray:
    return np.round(np.asarray(seconds, dtype=np.float64) * US_PER_S, 3)


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _clip(
    start: np.ndarray, end: np.ndarray, t_from: float | None, t_to: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo = -np.inf if t_from is None else t_from
    hi = np.inf if t_to is None else t_to
    start, end = np.maximum(start, lo), np.minimum(end, hi)
    return start, end, end > start


def _step_events(
    steps: pd.DataFrame, t_from: float | None, t_to: float | None
) -> list[dict[str, Any]]:
    start = steps["time_s"].to_numpy(np.float64)
    s0, s1, keep = _clip(start, start + steps["duration_s"].to_numpy(np.float64), t_from, t_to)
    kept = steps[keep]
    ts, end = _us(s0[keep]), _us(s1[keep])
    out: list[dict[str, Any]] = [
        {
            "ph": "X",
            "name": str(kind),
            "cat": "step",
            "pid": ENGINE_PID,
            "tid": STEPS_TID,
            "ts": float(t),
            "dur": round(float(e - t), 3),
            "args": {
                "step": int(step),
                "num_seqs": int(n),
                "num_batched_tokens": int(tok),
                "free_blocks": int(free),
            },
        }
        for t, e, kind, step, n, tok, free in zip(
            ts,
            end,
            kept["kind"],
            kept["step"],
            kept["num_seqs"],
            kept["num_batched_tokens"],
            kept["free_blocks"],
        )
    ]
    for name, column, key in COUNTERS:
        values = kept[column].to_numpy()
        changed = np.ones(len(values), dtype=bool)
        changed[1:] = values[1:] != values[:-1]
        out += [
            {"ph": "C", "name": name, "pid": ENGINE_PID, "ts": float(t), "args": {key: int(v)}}
            for t, v in zip(_us(s0[keep][changed]), values[changed])
        ]
    return out


def _request_events(
    states: pd.DataFrame, labels: dict[int, str], t_from: float | None, t_to: float | None
) -> list[dict[str, Any]]:
    s0, s1, keep = _clip(
        states["start_s"].to_numpy(np.float64), states["end_s"].to_numpy(np.float64), t_from, t_to
    )
    kept = states[keep]
    ts, end = _us(s0[keep]), _us(s1[keep])
    out: list[dict[str, Any]] = []
    for seq_id in kept["seq_id"].unique():
        tid = int(seq_id) + 1
        out.append(
            _meta("thread_name", REQUESTS_PID, tid, name=f"req {labels.get(seq_id, seq_id)}")
        )
        out.append(_meta("thread_sort_index", REQUESTS_PID, tid, sort_index=int(seq_id)))
    out += [
        {
            "ph": "X",
            "name": str(state),
            "cat": "request",
            "pid": REQUESTS_PID,
            "tid": int(seq) + 1,
            "ts": float(t),
            "dur": round(float(e - t), 3),
            "args": {"seq_id": int(seq)},
        }
        for t, e, seq, state in zip(ts, end, kept["seq_id"], kept["state"])
    ]
    return out


def build_trace(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    requests: pd.DataFrame | None = None,
    *,
    t_from: float | None = None,
    t_to: float | None = None,
    max_requests: int | None = None,
    end_s: float | None = None,
) -> dict[str, Any]:
    """The trace-event document of a run, limited to [t_from, t_to] (s; slices clipped to
    it) and to the first ``max_requests`` requests (by seq_id) with a state in the window."""
    end_s = run_end_s(events, steps) if end_s is None else end_s
    states = request_states(events, steps, end_s)
    _, _, live = _clip(
        states["start_s"].to_numpy(np.float64), states["end_s"].to_numpy(np.float64), t_from, t_to
    )
    shown = np.unique(states["seq_id"].to_numpy()[live])
    if max_requests is not None:
        shown = shown[:max_requests]
    labels: dict[int, str] = {}
    if requests is not None:
        labels = dict(zip(requests["seq_id"].tolist(), requests["request_id"].astype(str)))
    trace_events = [
        _meta("process_name", ENGINE_PID, 0, name="engine"),
        _meta("process_sort_index", ENGINE_PID, 0, sort_index=0),
        _meta("thread_name", ENGINE_PID, STEPS_TID, name="steps"),
        _meta("process_name", REQUESTS_PID, 0, name="requests"),
        _meta("process_sort_index", REQUESTS_PID, 0, sort_index=1),
        *_step_events(steps, t_from, t_to),
        *_request_events(states[states["seq_id"].isin(shown)], labels, t_from, t_to),
    ]
    return {
        "traceEvents": trace_events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "kvsim", "time": "simulated seconds x 1e6 (microseconds)"},
    }


def write_trace(doc: dict[str, Any], path: Path) -> Path:
    """Write ``doc`` as JSON to ``path`` atomically (NaN or infinity raise ValueError)."""
    path = Path(path)
    atomic_write_bytes(path, json.dumps(doc, allow_nan=False).encode())
    umask = os.umask(0)  # the temporary file was private (0600); make it an ordinary file
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    return path


# --- validation -------------------------------------------------------------------------------


def _event_problems(i: int, e: Any) -> list[str]:
    if not isinstance(e, dict):
        return [f"event {i}: not an object"]
    where = f"event {i} ({e.get('ph')!r} {e.get('name')!r})"
    problems = []
    if e.get("ph") not in PHASES:
        problems.append(f"{where}: ph must be one of {sorted(PHASES)}")
    if not isinstance(e.get("name"), str):
        problems.append(f"{where}: name must be a string")
    needs = {"pid"} | ({"tid"} if e.get("ph") in ("X", "M", "i") else set())
    problems += [f"{where}: {k} must be an integer" for k in needs if type(e.get(k)) is not int]
    number_keys = (["ts"] if e.get("ph") != "M" else []) + (["dur"] if e.get("ph") == "X" else [])
    for key in number_keys:
        v = e.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            problems.append(f"{where}: {key} must be a finite number >= 0, got {v!r}")
    args = e.get("args", {})
    if not isinstance(args, dict):
        problems.append(f"{where}: args must be an object")
    elif e.get("ph") == "C" and not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in args.values()
    ):
        problems.append(f"{where}: counter args must be numbers")
    elif e.get("ph") == "M" and e.get("name") not in METADATA:
        problems.append(f"{where}: metadata name must be one of {sorted(METADATA)}")
    return problems


def trace_problems(doc: Any) -> list[str]:
    """Everything wrong with ``doc`` as a trace-event timeline: required keys and types,
    non-negative times, named processes and threads, and no overlapping slices on a thread."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["the document must be an object with a 'traceEvents' list"]
    problems: list[str] = []
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    named: set[tuple[str, int, int]] = set()
    for i, e in enumerate(doc["traceEvents"]):
        found = _event_problems(i, e)
        problems += found
        if found:
            continue
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "M" and e["name"] in ("process_name", "thread_name"):
            named.add((e["name"], e["pid"], e["tid"] if e["name"] == "thread_name" else 0))
    for (pid, tid), spans in slices.items():
        if ("process_name", pid, 0) not in named or ("thread_name", pid, tid) not in named:
            problems.append(f"thread {pid}/{tid} has slices but no process or thread name")
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            if start < end - TOLERANCE_US:
                problems.append(
                    f"thread {pid}/{tid}: a slice at {start} us overlaps one ending {end} us"
                )
                break
    return problems


def validate_trace(doc: Any) -> None:
    """Raise ``TraceFormatError`` naming the first problems of ``doc`` (``trace_problems``)."""
    problems = trace_problems(doc)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise TraceFormatError("; ".join(problems[:3]) + more)
