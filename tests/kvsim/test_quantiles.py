"""kvsim.analysis.quantiles gives numpy's percentiles and medians bit for bit (summary.json's
latency figures must not move), without importing numpy.ma."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kvsim.analysis.quantiles import median, percentiles

# Latency-like samples with ties, zeros of both signs, and wide magnitudes.
finite = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1.0, 0.25, 3.0]),
)
samples = arrays(np.float64, st.integers(1, 300), elements=finite)


def same_bits(a: float | np.ndarray, b: float | np.ndarray) -> bool:
    return np.asarray(a, dtype=np.float64).tobytes() == np.asarray(b, dtype=np.float64).tobytes()


# Each property runs 100 examples by default; its ..._at_full_strength twin (-m slow) 400.
QUICK = settings(max_examples=100, deadline=None)
FULL = settings(max_examples=400, deadline=None)


def percentiles_equal_numpys(values: np.ndarray, ps: list[float]) -> None:
    before = values.copy()
    assert same_bits(percentiles(values, ps), np.percentile(values, ps))
    assert same_bits(values, before)  # the input is not reordered


@QUICK
@given(samples, st.lists(st.floats(0, 100), min_size=1, max_size=4))
def test_percentiles_equal_numpys(values: np.ndarray, ps: list[float]) -> None:
    percentiles_equal_numpys(values, ps)


@pytest.mark.slow
@FULL
@given(samples, st.lists(st.floats(0, 100), min_size=1, max_size=4))
def test_percentiles_equal_numpys_at_full_strength(values: np.ndarray, ps: list[float]) -> None:
    percentiles_equal_numpys(values, ps)


@QUICK
@given(samples)
def test_median_equals_numpys(values: np.ndarray) -> None:
    assert same_bits(median(values), np.median(values))


@pytest.mark.slow
@FULL
@given(samples)
def test_median_equals_numpys_at_full_strength(values: np.ndarray) -> None:
    assert same_bits(median(values), np.median(values))


@QUICK
@given(samples, st.data())
def test_median_skips_nan_as_nanmedian(values: np.ndarray, data: st.DataObject) -> None:
    median_skips_nan_as_nanmedian(values, data)


@pytest.mark.slow
@settings(FULL, max_examples=300)
@given(samples, st.data())
def test_median_skips_nan_as_nanmedian_at_full_strength(
    values: np.ndarray, data: st.DataObject
) -> None:
    median_skips_nan_as_nanmedian(values, data)


def median_skips_nan_as_nanmedian(values: np.ndarray, data: st.DataObject) -> None:
    holes = data.draw(arrays(np.bool_, len(values)))
    values = values.copy()
    values[holes] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all NaN: numpy warns, gives NaN
        expected = np.nanmedian(values)
    assert same_bits(median(values), expected)


def test_the_latency_percentiles_of_a_long_run() -> None:
    values = np.random.default_rng(7).exponential(0.2, 1_000_001)  # odd and long
    assert same_bits(percentiles(values, (50, 90, 99)), np.percentile(values, (50, 90, 99)))
    assert same_bits(median(values[:-1]), np.median(values[:-1]))


def test_it_imports_no_numpy_ma() -> None:
    code = (
        "import sys, numpy as np\n"
        "from kvsim.analysis.quantiles import median, percentiles\n"
        "v = np.arange(9.0)\n"
        "percentiles(v, (50, 90)); median(v); median(v[:4])\n"
        "print('numpy.ma' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
