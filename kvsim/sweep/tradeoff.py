"""Why a block size: the measured trade-off between a recommended block size and its
neighbours in the grid, in words and numbers taken from sweep.csv's columns.

Two effects pull the block size in opposite directions (docs/sweeps.md, "Comparing points"):

- **hits lost to coarse blocks**: only full blocks are cached, so a prompt's partial last block
  and, with hash-block prefixes, any block that straddles the end of the shared prefix are
  recomputed; the prefix-cache hit rate (``prefix_cache_hit_rate``) falls as blocks grow;
- **per-block costs**: attention reads one block-table entry per block in use, so the walk the
  cost model charges (``block_walk_share`` of the busy time) grows as blocks shrink.

Each sentence compares the recommended point with the next smaller and the next larger block
size at the same other options (and rate), so every figure quoted is a row of the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

# A hit-rate change below this (a share: 0.05 percentage points) is "the same hit rate".
SAME_HIT_RATE = 0.0005

Criterion = tuple[str, str, Callable[[float], str]]  # column, words, format


def _number(row: pd.Series, column: str) -> float:
    value = row.get(column)
    if value is None or pd.isna(value):
        return math.nan
    return float(value)


def _percent(share: float) -> str:
    return f"{share:.1%}"


def share_text(share: float) -> str:
    """A share of busy time to two significant figures: ``9.8%``, ``0.071%``."""
    return f"{float(f'{share * 100:.2g}'):g}%"


def _points(delta: float) -> str:
    return f"{delta * 100:+.1f} points"


def _size(row: pd.Series) -> str:
    return str(int(row["block_size"]))


def neighbours(points: pd.DataFrame, pick: pd.Series) -> tuple[pd.Series | None, pd.Series | None]:
    """The successful points with the next smaller and next larger block size than ``pick``
    among ``points`` (already restricted to the same other options and rate)."""
    ok = points[points["status"] == "ok"].sort_values("block_size")
    sizes = ok["block_size"].astype(float)
    size = float(pick["block_size"])
    smaller = ok[sizes < size]
    larger = ok[sizes > size]
    return (
        smaller.iloc[-1] if len(smaller) else None,
        larger.iloc[0] if len(larger) else None,
    )


def _criterion_text(pick: pd.Series, other: pd.Series, criteria: Sequence[Criterion]) -> str:
    compared = []
    for column, words, fmt in criteria:
        a, b = _number(other, column), _number(pick, column)
        if not (math.isnan(a) or math.isnan(b)):
            compared.append(f"{words} {fmt(a)} vs {fmt(b)}")
    flags = []
    verdict = other.get("saturation")
    if isinstance(verdict, str) and verdict in ("near saturation", "saturated"):
        flags.append(verdict)
    if _flag(other, "slo_met") is False:
        flags.append("misses the SLO")
    flagged = f" ({', '.join(flags)})" if flags else ""
    if not compared:
        return flagged
    return f"; {', '.join(compared)}{flagged}"


def _flag(row: pd.Series, column: str) -> bool | None:
    value = row.get(column)
    if value is None or pd.isna(value):
        return None
    return bool(value)


def _against_larger(
    pick: pd.Series, larger: pd.Series, criteria: Sequence[Criterion]
) -> str | None:
    hit_pick = _number(pick, "prefix_cache_hit_rate")
    hit_larger = _number(larger, "prefix_cache_hit_rate")
    tail = _criterion_text(pick, larger, criteria)
    if math.isnan(hit_pick) or math.isnan(hit_larger):
        return None
    drop = hit_pick - hit_larger
    if hit_pick == 0 and hit_larger == 0:
        return f"block size {_size(larger)} has no prefix hits to lose either{tail}"
    if drop < SAME_HIT_RATE:
        return (
            f"block size {_size(larger)} loses no prefix hits (hit rate "
            f"{_percent(hit_larger)} vs {_percent(hit_pick)}){tail}"
        )
    text = (
        f"block size {_size(larger)} loses hits to coarse blocks: prefix-cache hit rate "
        f"{_percent(hit_larger)} vs {_percent(hit_pick)} ({_points(-drop)}"
    )
    recomputed_pick = _number(pick, "prefix_cache_queries") - _number(pick, "prefix_cache_hits")
    recomputed = _number(larger, "prefix_cache_queries") - _number(larger, "prefix_cache_hits")
    if not math.isnan(recomputed - recomputed_pick) and recomputed > recomputed_pick:
        text += f", {recomputed - recomputed_pick:,.0f} more prompt tokens computed"
    return text + ")" + tail


def _against_smaller(
    pick: pd.Series, smaller: pd.Series, criteria: Sequence[Criterion]
) -> str | None:
    walk_pick = _number(pick, "block_walk_share")
    walk_smaller = _number(smaller, "block_walk_share")
    tail = _criterion_text(pick, smaller, criteria)
    if math.isnan(walk_pick) or math.isnan(walk_smaller):
        return None
    text = (
        f"block size {_size(smaller)} pays per-block costs: the block-table walk takes "
        f"{share_text(walk_smaller)} of busy time vs {share_text(walk_pick)}"
    )
    hit_pick = _number(pick, "prefix_cache_hit_rate")
    hit_smaller = _number(smaller, "prefix_cache_hit_rate")
    if not (math.isnan(hit_pick) or math.isnan(hit_smaller)):
        gain = hit_smaller - hit_pick
        if gain >= SAME_HIT_RATE:
            text += f", for a hit rate of {_percent(hit_smaller)} ({_points(gain)})"
        else:
            text += f", for no more prefix hits ({_percent(hit_smaller)})"
    return text + tail


def tradeoff(points: pd.DataFrame, pick: pd.Series, *criteria: Criterion) -> str:
    """Sentences comparing ``pick`` with its neighbouring block sizes in ``points`` (the same
    other options and rate), ending with the ``criteria`` (column, words, format) the
    recommendation ranked by: ``" Block size 64 loses hits ... Block size 16 pays ..."``; ""
    when there is no neighbour or nothing measured to compare."""
    smaller, larger = neighbours(points, pick)
    parts = []
    if larger is not None:
        text = _against_larger(pick, larger, criteria)
        if text:
            parts.append(text)
    if smaller is not None:
        text = _against_smaller(pick, smaller, criteria)
        if text:
            parts.append(text)
    return "".join(f" {text[0].upper()}{text[1:]}." for text in parts)


def slo_criterion(spec: Any) -> Criterion:
    """The latency the SLO bounds (TTFT when given, else TPOT) at its percentile."""
    p = spec.slo_percentile
    if spec.slo_ttft_s is not None:
        return (f"ttft_s_p{p}", f"p{p} TTFT", lambda v: f"{_three_figures(v)} s")
    return (f"tpot_s_p{p}", f"p{p} TPOT", lambda v: f"{_three_figures(v * 1000)} ms")


def _three_figures(value: float) -> str:
    """``7.00``, ``0.0153``, ``123``: three significant figures, trailing zeros kept."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:#.3g}"


LATENCY_CRITERION: Criterion = (
    "normalized_latency_s_per_token",
    "normalized latency",
    lambda v: f"{v:.4f} s/token",
)
