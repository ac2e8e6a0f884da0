"""scale_time / rescale_to_rate / truncate are pure and hit their targets."""

from __future__ import annotations

import pytest

from workloads import (
    Request,
    Trace,
    WorkloadError,
    mean_arrival_rate,
    rescale_to_rate,
    scale_time,
    truncate,
)


def trace(*times: float) -> Trace:
    requests = [
        Request(
            request_id=str(i),
            arrival_time_s=t,
            prompt_tokens=4,
            output_tokens=2,
            cancel_after_s=9.0,
        )
        for i, t in enumerate(times)
    ]
    return Trace(name="t", hash_block_size=None, requests=requests)


def test_scale_time_multiplies_arrivals_and_keeps_the_rest() -> None:
    original = trace(0.0, 1.0, 3.0)
    scaled = scale_time(original, 2.0)
    assert [r.arrival_time_s for r in scaled.requests] == [0.0, 2.0, 6.0]
    assert [r.cancel_after_s for r in scaled.requests] == [9.0] * 3
    assert [r.arrival_time_s for r in original.requests] == [0.0, 1.0, 3.0]  # pure


def test_rescale_to_rate_hits_the_rate() -> None:
    rescaled = rescale_to_rate(trace(1.0, 2.0, 4.0, 10.0), 6.0)
    assert mean_arrival_rate(rescaled) == pytest.approx(6.0)
    assert rescaled.requests[0].arrival_time_s == pytest.approx(1.0 / 18.0)  # factor (3/9)/6


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_factors_and_rates(bad: float) -> None:
    with pytest.raises(WorkloadError):
        scale_time(trace(0.0, 1.0), bad)
    with pytest.raises(WorkloadError):
        rescale_to_rate(trace(0.0, 1.0), bad)


def test_rate_undefined_for_simultaneous_arrivals() -> None:
    with pytest.raises(WorkloadError, match="same time"):
        rescale_to_rate(trace(2.0, 2.0), 1.0)


def test_truncate_by_count_and_duration() -> None:
    t = trace(5.0, 6.0, 7.0, 9.0)
    assert [r.request_id for r in truncate(t, max_requests=2).requests] == ["0", "1"]
    assert [r.request_id for r in truncate(t, max_duration_s=2.0).requests] == ["0", "1"]
    assert len(truncate(t, max_duration_s=4.5, max_requests=3)) == 3
