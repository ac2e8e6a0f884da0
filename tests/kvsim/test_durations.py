"""Latencies print in the unit of their size."""

from __future__ import annotations

import pytest

from kvsim.outputs.durations import duration_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0123, "12.3 ms"),
        (0.9994, "999.4 ms"),
        (1.5, "1.50 s"),
        (119.9, "119.90 s"),
        (275.0, "4.6 min"),
        (3643.5677, "60.7 min"),
        (7200.0, "2.00 h"),
        (36_000.0, "10.00 h"),
        (None, "-"),
        (float("nan"), "-"),
    ],
)
def test_duration_text(seconds: float | None, text: str) -> None:
    assert duration_text(seconds) == text
