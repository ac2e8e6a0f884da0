"""Latencies as a reader takes them in: in the unit that suits their size (``12.3 ms``,
``4.27 s``, ``60.7 min``, ``1.01 h``), not ``3,643,567.7 ms`` for an hour in a saturated queue."""

from __future__ import annotations

import math
from typing import Any

# (below this many seconds, divide by, unit, format): the first that fits is used.
_UNITS = (
    (1.0, 1e-3, "ms", "{:,.1f}"),
    (120.0, 1.0, "s", "{:.2f}"),
    (7200.0, 60.0, "min", "{:.1f}"),
    (math.inf, 3600.0, "h", "{:,.2f}"),
)


def duration_text(seconds: Any) -> str:
    """``seconds`` (a number; None or anything else: ``-``) with the unit of its size: ms
    below 1 s, s below 2 min, min below 2 h, h above."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds != seconds:
        return "-"
    for below, per, unit, form in _UNITS:
        if abs(seconds) < below:
            return f"{form.format(seconds / per)} {unit}"
    return f"{seconds:g} s"  # infinite
