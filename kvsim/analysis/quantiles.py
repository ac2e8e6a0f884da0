"""Percentiles and medians equal, bit for bit, to numpy's, without numpy.ma.

``np.percentile``, ``np.median`` and ``np.nanmedian`` import numpy.ma at their first call
(``np.unique`` asks ``np.ma.is_masked``; ``nanmedian`` of a short array goes through a
masked array): 17-25 ms of every ``kvsim run`` process, a run of the default trace taking
about 0.9 s. These compute the same values the way numpy's default ('linear') method does,
operation for operation, so summary.json does not change by a bit (tests/kvsim/
test_quantiles.py compares them with numpy on random samples).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentiles(values: np.ndarray, ps: Sequence[float]) -> np.ndarray:
    """``np.percentile(values, ps)`` of a non-empty 1-d float64 array holding no NaN."""
    n = len(values)
    q = np.true_divide(np.asarray(ps), 100)
    virtual = (n - 1) * q
    previous = np.floor(virtual)
    following = previous + 1
    above = virtual >= n - 1  # numpy takes the largest value there
    previous[above] = -1
    following[above] = -1
    previous_index = previous.astype(np.intp)
    following_index = following.astype(np.intp)
    ordered = np.partition(values, np.concatenate(([0, n - 1], previous_index, following_index)))
    a, b = ordered[previous_index], ordered[following_index]
    t = virtual - previous_index
    # numpy's _lerp: from a below t = 0.5, from b at and above it
    diff = b - a
    out: np.ndarray = a + diff * t
    np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5)
    return out


def median(values: np.ndarray) -> float:
    """``np.nanmedian(values)`` of a 1-d float64 array (``np.median`` when it holds no NaN):
    the median of its values that are not NaN, NaN when there are none."""
    values = values[~np.isnan(values)]
    n = len(values)
    if not n:
        return float("nan")
    half = n // 2
    # numpy takes the mean of the middle value(s): a sum from 0.0 (so -0.0 comes out 0.0)
    if n % 2:
        return 0.0 + float(np.partition(values, half)[half])
    ordered = np.partition(values, (half - 1, half))
    return (0.0 + float(ordered[half - 1]) + float(ordered[half])) / 2
