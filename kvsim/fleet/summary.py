"""summary.json of a fleet: the single-run names, fleet-wide, plus one section per replica.

Request figures (counts, latencies, throughput, saturation, rejections) are computed from
every replica's requests together; prefix-cache counts and step counts are summed; KV and
batch means are the mean over replicas of each replica's time average (each replica is one
GPU pool: the fleet's mean share of its slots); peaks are the maximum. docs/fleet.md lists
them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.analysis.load import (
    distribution,
    itl_samples,
    overload,
    rejections,
    weighted_distribution,
)
from kvsim.analysis.table import Table, column, is_label
from kvsim.config import RunConfig

# Summed over replicas (counts; a dict of counts is summed key by key).
_SUMMED = {
    "num_blocks", "num_steps", "busy_time_s", "prefix_cache_requests", "prefix_cache_queries",
    "prefix_cache_hits", "prefix_cache_preempted_requests", "prefix_cache_preempted_queries",
    "prefix_cache_preempted_hits", "prefix_cache_hits_by_reason", "prompt_tokens_cached",
    "prompt_tokens_computed", "prompt_tokens_recomputed", "prefix_cache_evictions",
}  # fmt: skip
_MAXED = {"kv_usage_peak", "max_batch_size", "sim_duration_s"}
_LATENCIES = ("queueing_delay_s", "ttft_s", "prefill_time_s", "tpot_s")
_RESIDENCY = ("kv_block_lifetime_s", "kv_block_idle_before_evict_s", "kv_block_reuse_gap_s")


def coefficient_of_variation(values: np.ndarray) -> float:
    """std / mean (0 when the mean is 0): how unevenly a load is spread over replicas."""
    mean = float(np.mean(values)) if len(values) else 0.0
    return float(np.std(values) / mean) if mean > 0 else 0.0


def _combined(key: str, values: list[Any]) -> Any:
    """One replica-level figure fleet-wide (see the module docstring). A replica that saw no
    request has None for its rates and means: it is left out of them."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    first = known[0]
    if key in _SUMMED:
        if isinstance(first, dict):
            return {k: sum(v[k] for v in known) for k in first}
        return sum(known)
    if key in _MAXED:
        return max(known)
    if isinstance(first, (bool, str, dict)):  # fleet-wide distributions are recomputed
        return first if all(v == first for v in values) else None
    if isinstance(first, (int, float)):
        return first if all(v == first for v in known) else float(np.mean(known))
    return first


def router_settings(config: RunConfig, num_replicas: int) -> dict[str, Any]:
    """summary.json's ``fleet`` settings: the shape and the router as the run gave them."""
    return {
        "num_replicas": num_replicas,
        "router": config.router,
        "router_weights": config.router_weights if config.router == "prefix" else None,
        "router_event_delay_s": config.router_event_delay_s,
        "router_oracle": config.router_oracle,
        # only when set: fleet sections of runs without it keep their bytes
        **(
            {"router_speculative_ttl_s": config.router_speculative_ttl_s}
            if config.router_speculative_ttl_s > 0
            else {}
        ),
    }


def fleet_summary(
    replica_summaries: list[dict[str, Any]],
    requests: Table,
    replica_steps: list[Table],
    residency_samples: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None,
    fleet: dict[str, Any],
) -> dict[str, Any]:
    """The fleet's summary.json: each single-run key fleet-wide, then ``fleet`` (the
    router and the imbalance figures) and ``replicas`` (each replica's own summary)."""
    first = replica_summaries[0]
    out: dict[str, Any] = {
        key: _combined(key, [s[key] for s in replica_summaries]) for key in first
    }
    finished = is_label(requests, "status", "finished")
    duration = float(out["sim_duration_s"])
    output_tokens = float(column(requests, "generated_tokens")[finished].sum())
    prompt_tokens = float(column(requests, "prompt_tokens")[finished].sum())
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    out.update(
        num_requests=len(requests),
        num_finished=int(finished.sum()),
        num_rejected=int(is_label(requests, "status", "rejected").sum()),
        num_aborted=int(is_label(requests, "status", "aborted").sum()),
        num_unfinished=int(is_label(requests, "status", "unfinished").sum()),
        num_preemptions=int(column(requests, "num_preemptions").sum()),
        throughput_requests_per_s=rate(int(finished.sum())),
        throughput_output_tokens_per_s=rate(output_tokens),
        throughput_total_tokens_per_s=rate(output_tokens + prompt_tokens),
        total_prompt_tokens=int(prompt_tokens),
        total_output_tokens=int(output_tokens),
        e2e_latency_s=distribution(column(requests, "e2e_latency_s", np.float64)[finished]),
    )
    for key in _LATENCIES:
        if key in out:
            out[key] = distribution(column(requests, key, np.float64))
    samples = [itl_samples(steps) for steps in replica_steps]
    out["itl_s"] = weighted_distribution(
        np.concatenate([s[0] for s in samples]), np.concatenate([s[1] for s in samples])
    )
    if out.get("prefix_cache_queries"):
        out["prefix_cache_hit_rate"] = out["prefix_cache_hits"] / out["prefix_cache_queries"]
    if residency_samples and len(replica_summaries) > 1:
        # pooled samples (one replica keeps its own figures, whose mean is an exact sum)
        for i, key in enumerate(_RESIDENCY):
            if key in out:
                out[key] = distribution(np.concatenate([s[i] for s in residency_samples]))
    out.update(overload(requests, duration, closed_loop=False))
    out["rejections"] = rejections(requests)
    wall = out["wall_time_s"] = max(s["wall_time_s"] for s in replica_summaries)
    out["sim_requests_per_wall_s"] = len(requests) / wall if wall else 0.0
    out["sim_steps_per_wall_s"] = out["num_steps"] / wall if wall else 0.0
    per_replica_requests = np.array([s["num_requests"] for s in replica_summaries], float)
    busy = np.array([s["busy_time_s"] for s in replica_summaries], float)
    out["fleet"] = {
        **fleet,
        "requests_per_replica": [int(n) for n in per_replica_requests],
        "requests_cv": coefficient_of_variation(per_replica_requests),
        "busy_time_cv": coefficient_of_variation(busy),
        "prefix_cache_hit_rate_per_replica": [
            s.get("prefix_cache_hit_rate") for s in replica_summaries
        ],
    }
    out["replicas"] = [{"replica": i, **s} for i, s in enumerate(replica_summaries)]
    return out
