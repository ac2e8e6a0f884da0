"""Comparing a sweep's points like with like: at the same offered rate, leaving out saturated
points (whose latencies measure a growing queue, not the option swept), and naming one
recommended block size with its reason. Definitions: docs/sweeps.md ("Comparing points")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvsim.sweep.spec import SweepSpec
from kvsim.sweep.table import Best, best_points, max_rates
from kvsim.sweep.tradeoff import LATENCY_CRITERION, slo_criterion, tradeoff


def value_text(name: str, value: Any) -> str:
    """A swept value as the user would type it: ``16``, not ``16.0`` (a table column with a
    failed point in it holds floats), ``2.5``, ``paged``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def labelled(keys: dict[str, Any]) -> str:
    return ", ".join(f"{k}={value_text(k, v)}" for k, v in keys.items())


def saturated(frame: pd.DataFrame) -> pd.Series:
    """Whether each point ran saturated (False for a point without the column or value)."""
    if "saturated" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["saturated"].eq(True)


def groups(frame: pd.DataFrame, keys: list[str]) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """``frame`` split by the values of ``keys`` (one group, {} for no keys), in point order."""
    if not keys:
        return [({}, frame)]
    out = []
    for key, group in frame.groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        out.append((dict(zip(keys, key)), group))
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """The points of one offered rate (``group``: {} when the rate is not swept): the best
    unsaturated points, and a sentence when some or all were saturated."""

    group: dict[str, Any]
    best: list[Best]
    note: str | None


def best_by_rate(frame: pd.DataFrame, spec: SweepSpec) -> list[Comparison]:
    """For each swept rate (or once): the best points among the successful, unsaturated ones;
    a point at another rate is never a competitor, nor is a saturated one."""
    ok = frame[frame["status"] == "ok"]
    keys = ["rate"] if "rate" in spec.axis_names else []
    out = []
    for group, points in groups(ok, keys):
        sat = saturated(points)
        fair = points[~sat]
        note = None
        if len(points) and sat.all():
            note = (
                f"every point is saturated (arrivals outpace service, offered "
                f"{_offered(points)}): their latencies measure the queue, not the options "
                "swept, so no point is named best; lower the rate or add capacity"
            )
        elif sat.any():
            names = ", ".join(str(x) for x in points.loc[sat, "label"])
            n = int(sat.sum())
            note = f"{n} saturated point{'s' if n > 1 else ''} left out of the comparison: {names}"
        out.append(Comparison(group, best_points(fair), note))
    return out


def _offered(points: pd.DataFrame) -> str:
    rates = points.get("offered_rate_per_s")
    if rates is None or rates.dropna().empty:
        return "rate unknown"
    return f"{float(rates.dropna().median()):.2f} req/s"


def recommended_block_sizes(frame: pd.DataFrame, spec: SweepSpec) -> list[str]:
    """One sentence per combination of the axes other than block size and rate: the block
    size to use, and why. With a rate axis and an SLO: the block size that sustains the
    highest rate meeting the SLO (ties: lower normalized latency at that rate). Otherwise,
    per rate: the lowest normalized latency among unsaturated points (meeting the SLO, if
    given). Never a winner among saturated points only."""
    if "block_size" not in spec.axis_names:
        return []
    ok = frame[frame["status"] == "ok"]
    others = [a for a in spec.axis_names if a not in ("block_size", "rate")]
    lines = []
    if "rate" in spec.axis_names and spec.has_slo:
        for group, points in groups(ok, others):
            lines.append(_by_max_rate(group, points, spec))
        return lines
    for group, points in groups(ok, [*others, *(["rate"] if "rate" in spec.axis_names else [])]):
        lines.append(_by_latency(group, points, spec))
    return lines


def _prefix(group: dict[str, Any]) -> str:
    return f"{labelled(group)}: " if group else ""


def _by_max_rate(group: dict[str, Any], points: pd.DataFrame, spec: SweepSpec) -> str:
    rates = max_rates(points, spec)
    rates = rates[rates["max_rate"].notna()] if len(rates) else rates
    if not len(rates):
        return f"{_prefix(group)}no block size meets the SLO at any swept rate."
    best_rate = rates["max_rate"].max()
    tied = rates[rates["max_rate"] == best_rate]["block_size"].tolist()
    at_rate = points[(points["rate"] == best_rate) & points["block_size"].isin(tied)]
    pick = at_rate.sort_values(["normalized_latency_s_per_token", "block_size"]).iloc[0]
    size = value_text("block_size", pick["block_size"])
    why = f"it sustains {best_rate:g} requests/s within the SLO, the highest rate of any block size"
    if len(tied) > 1:
        why += (
            f" (tied with {len(tied) - 1} other{'s' if len(tied) > 2 else ''}; lowest "
            "normalized latency there, "
            f"{pick['normalized_latency_s_per_token']:.4f} s/token)"
        )
    at_best = points[points["rate"] == best_rate]
    # tied on rate: the tie was broken by normalized latency, so it is quoted too
    criteria = [slo_criterion(spec), *([LATENCY_CRITERION] if len(tied) > 1 else [])]
    because = tradeoff(at_best, pick, *criteria)
    return f"{_prefix(group)}recommended block size {size}: {why}.{because}"


def _by_latency(group: dict[str, Any], points: pd.DataFrame, spec: SweepSpec) -> str:
    sat = saturated(points)
    if len(points) and sat.all():
        return (
            f"{_prefix(group)}no block size is recommended: every point is saturated "
            f"(offered {_offered(points)}), so latencies measure the queue, not the block size."
        )
    fair = points[~sat]
    if spec.has_slo:
        fair = fair[fair["slo_met"].eq(True)]
        if not len(fair):
            return f"{_prefix(group)}no block size is recommended: none meets the SLO."
    fair = fair.dropna(subset=["normalized_latency_s_per_token"])
    if not len(fair):
        return f"{_prefix(group)}no block size is recommended: no point finished a request."
    ranked = fair.sort_values(
        ["normalized_latency_s_per_token", "throughput_output_tokens_per_s", "block_size"],
        ascending=[True, False, True],
    )
    pick = ranked.iloc[0]
    size = value_text("block_size", pick["block_size"])
    among = f"{len(fair)} unsaturated point{'s' if len(fair) > 1 else ''}"
    if spec.has_slo:
        among += " meeting the SLO"
    left = f"; {int(sat.sum())} saturated left out" if sat.any() else ""
    because = tradeoff(points, pick, LATENCY_CRITERION)
    return (
        f"{_prefix(group)}recommended block size {size}: the lowest normalized latency "
        f"({pick['normalized_latency_s_per_token']:.4f} s/token) of {among}{left}.{because}"
    )
