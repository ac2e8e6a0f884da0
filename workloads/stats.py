"""Summary statistics of a trace (what ``kvsim info`` shows)."""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.request import Trace


def _summary(values: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(values.mean()),
        "p50": float(np.percentile(values, 50)),
        "p99": float(np.percentile(values, 99)),
        "max": float(values.max()),
        "total": float(values.sum()),
    }


def trace_stats(trace: Trace) -> dict[str, Any]:
    """Statistics of a non-empty trace (times in seconds, lengths in tokens).

    Keys: name, num_requests, hash_block_size, duration_s (last minus first arrival),
    mean_rate_per_s ((N - 1) / duration_s, None when duration_s is 0), interarrival_cv
    (std / mean of the gaps, None with fewer than 2 gaps or a zero mean gap), prompt_tokens and
    output_tokens (each mean, p50, p99, max, total; linear-interpolated percentiles),
    share_with_hash_ids, num_sessions, share_with_cancel_after (shares in [0, 1]).
    """
    requests = trace.requests
    if not requests:
        raise ValueError("trace_stats needs at least one request")
    count = len(requests)
    times = np.fromiter((r.arrival_time_s for r in requests), np.float64, count)
    prompt = np.fromiter((r.prompt_tokens for r in requests), np.float64, count)
    output = np.fromiter((r.output_tokens for r in requests), np.float64, count)
    duration = float(times[-1] - times[0])
    gaps = np.diff(times)
    mean_gap = float(gaps.mean()) if len(gaps) else 0.0
    cv = float(gaps.std()) / mean_gap if len(gaps) >= 2 and mean_gap > 0 else None
    return {
        "name": trace.name,
        "num_requests": count,
        "hash_block_size": trace.hash_block_size,
        "duration_s": duration,
        "mean_rate_per_s": (count - 1) / duration if duration > 0 else None,
        "interarrival_cv": cv,
        "prompt_tokens": _summary(prompt),
        "output_tokens": _summary(output),
        "share_with_hash_ids": sum(r.hash_ids is not None for r in requests) / count,
        "num_sessions": len({r.session_id for r in requests if r.session_id is not None}),
        "share_with_cancel_after": sum(r.cancel_after_s is not None for r in requests) / count,
    }
