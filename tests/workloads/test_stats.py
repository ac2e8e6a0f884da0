"""trace_stats gives the documented numbers."""

from __future__ import annotations

import pytest

from workloads import Request, Trace, load_trace, shipped_trace_path, trace_stats


def test_stats_of_a_small_trace() -> None:
    requests = [
        Request(
            request_id="a", arrival_time_s=1.0, prompt_tokens=10, output_tokens=1, session_id="s"
        ),
        Request(
            request_id="b", arrival_time_s=2.0, prompt_tokens=20, output_tokens=3, hash_ids=(1,)
        ),
        Request(
            request_id="c", arrival_time_s=5.0, prompt_tokens=30, output_tokens=5, cancel_after_s=1
        ),
    ]
    stats = trace_stats(Trace(name="t", hash_block_size=64, requests=requests))
    assert stats["num_requests"] == 3
    assert stats["duration_s"] == 4.0
    assert stats["mean_rate_per_s"] == 0.5
    assert stats["interarrival_cv"] == pytest.approx(1.0 / 2.0)  # gaps 1 and 3
    assert stats["prompt_tokens"] == {
        "mean": 20.0,
        "p50": 20.0,
        "p99": 29.8,
        "max": 30.0,
        "total": 60.0,
    }
    assert stats["share_with_hash_ids"] == pytest.approx(1 / 3)
    assert stats["num_sessions"] == 1
    assert stats["share_with_cancel_after"] == pytest.approx(1 / 3)


def test_single_request_has_no_rate() -> None:
    one = [Request(request_id="a", arrival_time_s=1.0, prompt_tokens=10, output_tokens=1)]
    stats = trace_stats(Trace(name="t", hash_block_size=None, requests=one))
    assert stats["mean_rate_per_s"] is None and stats["interarrival_cv"] is None


def test_azure_conversation_matches_the_published_summary() -> None:
    stats = trace_stats(load_trace(shipped_trace_path("azure_llm_2023_conv")))
    assert stats["mean_rate_per_s"] == pytest.approx(5.5, abs=0.1)
    assert stats["prompt_tokens"]["mean"] == pytest.approx(1155, abs=1)
    assert stats["output_tokens"]["mean"] == pytest.approx(211, abs=1)
