"""Long time series as envelopes: per time bin the minimum, mean and maximum of the steps in
it. Thousands of steps per pixel column draw as a solid band of spikes when plotted one by
one (free blocks over a 10,400 s run); the envelope shows the same range and the level in it.

A series is drawn as an envelope when its window holds more than ``ENVELOPE_MIN_STEPS``
steps; the picture's title says so (``envelope_note``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ENVELOPE_BINS = 500  # time bins across the axes: about two pixel columns each at 110 dpi
ENVELOPE_MIN_STEPS = 4 * ENVELOPE_BINS  # fewer steps than this are drawn one by one


@dataclass(frozen=True, slots=True)
class Envelope:
    """Per-bin statistics of one series. ``edges`` (s) has one more entry than each
    statistic; a bin without a step holds NaN (a gap in the drawing)."""

    edges: np.ndarray
    low: np.ndarray
    mean: np.ndarray
    high: np.ndarray
    steps: int  # the steps binned

    def post(self, values: np.ndarray) -> np.ndarray:
        """``values`` with the last repeated: one per edge, for ``step="post"`` drawing."""
        return np.append(values, values[-1:])


def wants_envelope(num_steps: int) -> bool:
    """Whether a window of ``num_steps`` steps is drawn as an envelope."""
    return num_steps > ENVELOPE_MIN_STEPS


def envelope(
    times: np.ndarray, values: np.ndarray, lo: float, hi: float, bins: int = ENVELOPE_BINS
) -> Envelope:
    """Min, mean and max of ``values`` (at ``times``, s, ascending) in ``bins`` equal time
    bins over [lo, hi]."""
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    low, mean, high = (np.full(bins, np.nan) for _ in range(3))
    if len(t):
        which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
        starts = np.flatnonzero(np.r_[True, np.diff(which) != 0])
        counts = np.diff(np.r_[starts, len(v)])
        at = which[starts]
        low[at] = np.minimum.reduceat(v, starts)
        high[at] = np.maximum.reduceat(v, starts)
        mean[at] = np.add.reduceat(v, starts) / counts
    return Envelope(edges, low, mean, high, len(t))


def envelope_note(env: Envelope) -> str:
    """What the title adds for an envelope: how many steps went into how wide bins."""
    width = float(env.edges[1] - env.edges[0])
    return f"{env.steps:,} steps: min / mean / max per {width:.3g} s"


def first_per_bin(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Indices of the first of ``times`` (ascending) in each bin of ``edges`` that has any:
    one marker per bin where events crowd."""
    which = np.searchsorted(edges, np.asarray(times, dtype=np.float64), side="right")
    which = np.clip(which - 1, 0, len(edges) - 2)  # the last edge closes the last bin
    return np.flatnonzero(np.r_[True, np.diff(which) != 0]) if len(which) else np.empty(0, int)
