"""Whether a run's numbers mean what they seem to: overload (arrivals outpacing service),
rejections by reason, inter-token latency, and how noisy measured step times are; and the
{mean, p50, p90, p99} summaries summary.json gives latencies as.

Definitions: docs/metrics.md ("Overload", "Rejections", "ITL", "Timing"). Everything here is
computed from requests.parquet's and steps.parquet's columns: a ``Table`` or a DataFrame
(``kvsim.analysis.table``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from kvsim.analysis.quantiles import median, percentiles
from kvsim.analysis.saturation import MIN_REQUESTS, NEAR, SATURATED, saturation, waiting_counts
from kvsim.analysis.table import TableLike, column, is_label

# Decode steps of one batch size, at least this many, to estimate the noise of step times.
MIN_STEPS_PER_BATCH_SIZE = 5


def overload(requests: TableLike, sim_end_s: float, *, closed_loop: bool) -> dict[str, Any]:
    """``saturation`` (the verdict, its figures and reason: kvsim/analysis/saturation.py,
    docs/metrics.md "Saturation"), ``saturated`` (the verdict is ``saturated``; kept for
    readers of older summaries) and the older top-level figures beside it."""
    arrival = np.sort(column(requests, "arrival_time_s", float))
    finished = is_label(requests, "status", "finished")
    service = (
        column(requests, "e2e_latency_s", float) - column(requests, "queueing_delay_s", float)
    )[finished]
    service_p50 = median(service) if len(service) else None
    share = _queueing_share(requests)
    verdict = saturation(
        requests, sim_end_s, closed_loop=closed_loop, service_p50_s=service_p50,
        queueing_share=share,
    )  # fmt: skip
    out: dict[str, Any] = {
        "saturated": verdict["verdict"] == SATURATED,
        "saturation": verdict,
        "offered_rate_per_s": None,
        "served_rate_per_s": None,
        "waiting_at_quarter_of_arrivals": None,
        "waiting_at_last_arrival": None,
        "service_time_p50_s": service_p50,
        "queueing_share_of_ttft": share,
    }
    if len(arrival) < 2:
        return out
    start, end = float(arrival[0]), min(float(arrival[-1]), sim_end_s)
    if sim_end_s > start:
        out["served_rate_per_s"] = int(finished.sum()) / (sim_end_s - start)
    if closed_loop or len(arrival) < MIN_REQUESTS or end <= start:
        return out
    at_quarter, at_end = waiting_counts(requests, np.array([start + (end - start) / 4, end]))
    out.update(
        offered_rate_per_s=int((arrival <= end).sum()) / (end - start),
        waiting_at_quarter_of_arrivals=int(at_quarter),
        waiting_at_last_arrival=int(at_end),
    )
    return out


def _queueing_share(requests: TableLike) -> float | None:
    """Median queueing delay over median TTFT, for the last quarter of arrivals that got a
    first token: near 1 when TTFT is mostly waiting in the queue."""
    ttft = column(requests, "ttft_s", float)
    got = np.flatnonzero(~np.isnan(ttft))
    got = got[np.argsort(column(requests, "arrival_time_s", float)[got], kind="stable")]
    last = got[-max(1, len(got) // 4) :]
    median_ttft = median(ttft[last]) if len(last) else 0.0
    if not median_ttft > 0:
        return None
    return median(column(requests, "queueing_delay_s", float)[last]) / median_ttft


def rejections(requests: TableLike) -> list[dict[str, Any]]:
    """Rejected requests by reason, most common first: ``reason`` is the engine's reason with
    each number that differs between those requests written as their range (``prompt of 4097
    to 31000 tokens exceeds max_model_len 4096``), ``count`` how many, ``example`` the first
    one's own reason."""
    rejected = column(requests, "finish_reason")[is_label(requests, "status", "rejected")]
    groups: dict[str, list[list[str]]] = {}
    for why in map(str, rejected):
        parts = _NUMBER.split(why)  # text, number, text, number, ..., text
        groups.setdefault(_NUMBER.sub("N", why), []).append(parts)
    out = []
    for members in groups.values():
        first = members[0]
        merged = [
            part if i % 2 == 0 or all(m[i] == part for m in members) else _range(members, i)
            for i, part in enumerate(first)
        ]
        out.append({"reason": "".join(merged), "count": len(members), "example": "".join(first)})
    return sorted(out, key=lambda e: -e["count"])


_NUMBER = re.compile(r"(\d[\d,._]*)")


def _range(members: list[list[str]], i: int) -> str:
    """``low to high``: the smallest and largest of the members' ``i``-th parts (numbers),
    each as the engine wrote it."""

    def value(text: str) -> float:
        try:
            return float(text.replace(",", "").replace("_", "").rstrip("."))
        except ValueError:  # "1.2.3": not one number; order it last
            return float("inf")

    texts = [m[i] for m in members]
    low, high = min(texts, key=value), max(texts, key=value)
    return f"{low} to {high}"


def itl_samples(steps: TableLike) -> tuple[np.ndarray, np.ndarray]:
    """Inter-token latencies (s) and their weights: for each decode step after the first, the
    time from the end of the previous decode step to its end, once for each sequence in its
    batch (every running sequence decodes in every decode step; prefills in between stall
    them all). A v1 run's steps (with ``num_decode_tokens``) count every step that decodes,
    mixed ones included, once per decode token."""
    if "num_decode_tokens" in steps:
        # v1: mixed steps decode too (beside prefill chunks); each decode token is a gap
        weights = column(steps, "num_decode_tokens", float)
        decode = weights > 0
    else:
        decode = is_label(steps, "kind", "decode")
        weights = column(steps, "num_seqs", float)
    weights = weights[decode]
    ends = (column(steps, "time_s", float) + column(steps, "duration_s", float))[decode]
    if len(ends) < 2:
        return np.empty(0), np.empty(0)
    return np.diff(ends), weights[1:]


PERCENTILES = (50, 90, 99)  # summary.json's latency percentiles


def distribution(values: np.ndarray) -> dict[str, float | None]:
    """``{mean, p50, p90, p99}`` as summary.json writes latencies (None when empty)."""
    v = np.asarray(values, dtype=np.float64)
    nan = np.isnan(v)
    if nan.any():  # else no copy (1.5 M block lifetimes: 12 MB)
        v = v[~nan]
    if len(v) == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    # one call partitions the samples once for all three (1.5M block lifetimes: 31 ms against
    # 75 ms), giving the same values as one call each; np.percentile's values, bit for bit
    quantiles = percentiles(v, PERCENTILES)
    return {"mean": float(v.mean()), **{f"p{p}": float(q) for p, q in zip(PERCENTILES, quantiles)}}


def weighted_distribution(values: np.ndarray, weights: np.ndarray) -> dict[str, float | None]:
    """``{mean, p50, p90, p99}`` of ``values`` counted ``weights`` times each (the inverted
    CDF: the smallest value with at least p% of the weight at or below it)."""
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not len(values):
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    del order  # the arrays are a few million long (a million requests' decode steps)
    cumulative = np.cumsum(weights)
    cumulative /= weights.sum()
    out: dict[str, float | None] = {"mean": float(np.average(values, weights=weights))}
    for p in PERCENTILES:
        at = min(int(np.searchsorted(cumulative, p / 100 - 1e-12)), len(values) - 1)
        out[f"p{p}"] = float(values[at])
    return out


def step_time_noise(steps: TableLike) -> float | None:
    """The noise of measured step times: the coefficient of variation (std / mean) of the
    duration of decode steps of one batch size, averaged over batch sizes with at least
    ``MIN_STEPS_PER_BATCH_SIZE`` steps (weighted by their counts); None if there are none."""
    decode = is_label(steps, "kind", "decode")
    sizes, group = np.unique(column(steps, "num_seqs")[decode], return_inverse=True)
    duration = column(steps, "duration_s", float)[decode]
    count = np.bincount(group, minlength=len(sizes))
    mean = np.bincount(group, weights=duration, minlength=len(sizes)) / np.maximum(count, 1)
    squares = np.bincount(group, weights=(duration - mean[group]) ** 2, minlength=len(sizes))
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.sqrt(squares / (count - 1))  # the sample std (ddof 1), as pandas' std
    keep = (count >= MIN_STEPS_PER_BATCH_SIZE) & (mean > 0)
    if not keep.any():
        return None
    return float(np.average(std[keep] / mean[keep], weights=count[keep]))


def saturation_warning(summary: dict[str, Any]) -> str | None:
    """The saturation line of a run's warnings (None when stable), with the figures that
    decided the verdict; a summary written before the verdict existed gives its flag only."""
    verdict = summary.get("saturation") or {}
    if verdict.get("verdict") == SATURATED or (not verdict and summary.get("saturated")):
        why = f" ({verdict['reason']})" if verdict.get("reason") else ""
        return (
            f"saturated: arrivals outpace service{why}: latencies grow with the trace's "
            "length and measure the queue, not the engine; lower --rate or add capacity"
        )
    if verdict.get("verdict") == NEAR:
        return (
            f"near saturation: {verdict['reason']}: the engine barely keeps up, so latencies "
            "depend on the trace's bursts and length; a little more load saturates it"
        )
    return None


def saturation_text(summary: dict[str, Any]) -> str:
    """The verdict with its headline figures, for a summary table: ``saturated (queue +0.497
    req/s, 9.0% of offered; queueing 100% of TTFT)``."""
    verdict = summary.get("saturation")
    if not verdict:  # a summary written before the verdict existed
        return SATURATED if summary.get("saturated") else "not saturated"
    if not verdict.get("judged"):
        return f"{verdict['verdict']} ({verdict['reason']})"
    share = verdict.get("queueing_share_of_ttft")
    queueing = "" if share is None else f"; queueing {share:.0%} of TTFT"
    return (
        f"{verdict['verdict']} (queue {verdict['queue_slope_per_s']:+#.3g} req/s, "
        f"{verdict['queue_growth_share']:.1%} of offered{queueing})"
    )


def warnings(summary: dict[str, Any]) -> list[str]:
    """What a reader of ``summary`` must know before trusting its numbers, one line each:
    overload, rejections and measured (noisy) timing. Empty when there is nothing to say."""
    out = []
    line = saturation_warning(summary)
    if line:
        out.append(line)
    rejected = summary.get("rejections") or []
    if rejected:
        total = sum(r["count"] for r in rejected)
        top = "; ".join(f"{r['count']:,} x {r['reason']}" for r in rejected[:3])
        more = f"; {len(rejected) - 3} more reasons" if len(rejected) > 3 else ""
        out.append(f"{total:,} rejected: {top}{more}")
    if summary.get("timing") == "measured wall time":
        cv = summary.get("step_time_noise_cv")
        noise = (
            f"decode steps of one batch size vary by {cv:.0%} (coefficient of variation)"
            if cv is not None
            else "too few steps to estimate their noise"
        )
        out.append(
            "engine mode: latencies are measured wall time of this machine's steps; "
            f"{noise}; a rerun gives other times, so possibly other steps"
        )
    return out
