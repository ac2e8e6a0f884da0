"""The advice of a sweep over the CPU offload tier's size (``--param
kv_offloading_size=0,64,256``): the smallest CPU tier whose hit rate (GPU and CPU together,
``hit_rate_all_tiers``) is within one percentage point of the largest tier's, what it does to
TTFT p50 and p99 against no tier, and a table row per size. Definitions: docs/sweeps.md ("CPU
offload tier").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvsim.sweep.compare import groups, labelled, value_text
from kvsim.sweep.offload import AXIS, finite
from kvsim.sweep.slo import seconds_text
from kvsim.sweep.spec import SweepSpec

# "Within 1 point": hit rates are shares of prompt tokens, so one point is 0.01.
HIT_RATE_MARGIN = 0.01


@dataclass(frozen=True, slots=True)
class TierAdvice:
    """One combination of the other axes: the ``pick`` (the smallest tier within the margin
    of the largest's hit rate; None when no point has a hit rate), the ``sentence`` that says
    so and its TTFT against no tier, and one row per tier size (``table_rows``)."""

    group: dict[str, Any]
    pick: pd.Series | None
    sentence: str
    rows: list[pd.Series] = field(default_factory=list)


def _gib(size: Any) -> str:
    return f"{value_text(AXIS, size)} GiB"


def _change(new: float, old: float) -> str:
    if not (finite(new) and finite(old)):
        return "-"
    change = f" ({(new - old) / old:+.0%})" if old else ""
    return f"{seconds_text(old)} → {seconds_text(new)}{change}"


def tier_advice(
    frame: pd.DataFrame, spec: SweepSpec, margin: float = HIT_RATE_MARGIN
) -> list[TierAdvice]:
    """Per combination of the other axes (a sweep with a ``kv_offloading_size`` axis; else
    none): among the successful points with a hit rate, the smallest tier whose
    ``hit_rate_all_tiers`` is at least the largest tier's less ``margin``, and its TTFT p50
    and p99 against the tierless point (size 0), or the smallest size swept without one."""
    if AXIS not in spec.axis_names or "hit_rate_all_tiers" not in frame:
        return []
    others = [a for a in spec.axis_names if a != AXIS]
    out = []
    for group, points in groups(frame, others):
        prefix = f"{labelled(group)}: " if group else ""
        ok = points[(points["status"] == "ok") & points["hit_rate_all_tiers"].notna()]
        ok = ok.sort_values(AXIS, kind="stable")
        rows = [r for _, r in ok.iterrows()]
        if not rows:
            out.append(TierAdvice(group, None, f"{prefix}no point measured a hit rate."))
            continue
        largest = rows[-1]
        target = float(largest["hit_rate_all_tiers"]) - margin
        pick = next(r for r in rows if float(r["hit_rate_all_tiers"]) >= target - 1e-12)
        base = rows[0]
        sentence = _sentence(pick, largest, base, margin)
        sentence = prefix + sentence if prefix else sentence[0].upper() + sentence[1:]
        out.append(TierAdvice(group, pick, sentence, rows))
    return out


def _sentence(pick: pd.Series, largest: pd.Series, base: pd.Series, margin: float) -> str:
    rate, top = float(pick["hit_rate_all_tiers"]), float(largest["hit_rate_all_tiers"])
    points = f"{margin * 100:g} point{'s' if margin != 0.01 else ''}"
    if float(pick[AXIS]) == 0:
        return (
            f"no CPU tier is needed: without one the hit rate ({rate:.1%}) is within {points} "
            f"of the largest tier's ({_gib(largest[AXIS])}: {top:.1%})."
        )
    gpu = pick.get("prefix_cache_hit_rate")
    alone = f" (its GPU cache alone: {float(gpu):.1%})" if finite(gpu) else ""
    if float(pick[AXIS]) == float(largest[AXIS]):
        words = (
            f"the largest tier swept, {_gib(pick[AXIS])}, is the only one within {points} of "
            f"its hit rate: {top:.1%} of prompt tokens from GPU and CPU{alone}, so a larger "
            "tier may gain more"
        )
    else:
        words = (
            f"the smallest CPU tier within {points} of the largest's hit rate is "
            f"{_gib(pick[AXIS])}: {rate:.1%} of prompt tokens from GPU and CPU{alone} against "
            f"{top:.1%} with {_gib(largest[AXIS])}"
        )
    if float(base[AXIS]) == float(pick[AXIS]):
        return words + "."
    against = "no CPU tier" if float(base[AXIS]) == 0 else _gib(base[AXIS])
    return (
        f"{words}; TTFT p50 {_change(pick['ttft_s_p50'], base['ttft_s_p50'])}, p99 "
        f"{_change(pick['ttft_s_p99'], base['ttft_s_p99'])} against {against}."
    )


TABLE_HEAD = (
    "CPU tier", "hit rate all tiers", "GPU hit rate", "tokens loaded", "TTFT p50", "TTFT p99",
)  # fmt: skip


def table_rows(advice: TierAdvice) -> list[list[str]]:
    """One row per tier size of ``advice``: TABLE_HEAD's cells, the pick marked."""
    out = []
    for r in advice.rows:
        mark = " (recommended)" if advice.pick is not None and r is advice.pick else ""
        gpu = r.get("prefix_cache_hit_rate")
        loaded = r.get("offload_loaded_tokens")
        out.append(
            [
                _gib(r[AXIS]) + mark,
                f"{float(r['hit_rate_all_tiers']):.1%}",
                f"{float(gpu):.1%}" if finite(gpu) else "-",
                f"{int(loaded):,}" if finite(loaded) else "-",
                seconds_text(float(r["ttft_s_p50"])) if finite(r["ttft_s_p50"]) else "-",
                seconds_text(float(r["ttft_s_p99"])) if finite(r["ttft_s_p99"]) else "-",
            ]
        )
    return out
