"""Comparing a sweep's points like with like: at the same offered rate, among the points that
meet the SLOs (kvsim/sweep/slo.py), naming one recommended point per rate and one recommended
block size with its reason. Definitions: docs/sweeps.md ("Comparing points",
"Recommendation")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvsim.sweep.recommend import DEFAULT_OBJECTIVE, OBJECTIVES, Recommendation, recommend
from kvsim.sweep.slo import slo_text
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


def verdicts(frame: pd.DataFrame) -> pd.Series:
    """Each point's saturation verdict (docs/metrics.md), "" where unknown (a failed point, or
    a table written before the verdict existed)."""
    if "saturation" not in frame:
        return pd.Series("", index=frame.index)
    return frame["saturation"].where(frame["saturation"].notna(), "").astype(str)


def eligible(frame: pd.DataFrame) -> pd.Series:
    """Whether each point may be recommended: it succeeded and met the SLOs (kvsim/sweep/
    slo.py: the sweep's own or the defaults)."""
    ok = frame["status"] == "ok"
    if "slo_met" not in frame:
        return ok
    return ok & frame["slo_met"].eq(True)


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
    points among those meeting the SLOs, and a sentence when some or all missed them."""

    group: dict[str, Any]
    best: list[Best]
    note: str | None


def best_by_rate(frame: pd.DataFrame, spec: SweepSpec) -> list[Comparison]:
    """For each swept rate (or once): the best points among the successful ones that meet the
    SLOs; a point at another rate is never a competitor, nor is one missing the SLOs."""
    ok = frame[frame["status"] == "ok"]
    keys = ["rate"] if "rate" in spec.axis_names else []
    out = []
    for group, points in groups(ok, keys):
        fit = eligible(points)
        note = None
        if len(points) and not fit.any():
            note = (
                f"no point meets the SLOs ({slo_text(spec)}; offered {_offered(points)}), so "
                "no point is named best; lower the rate, add capacity or relax the SLOs"
            )
        elif not fit.all():
            names = ", ".join(str(x) for x in points.loc[~fit, "label"])
            n = int((~fit).sum())
            note = (
                f"{n} point{'s' if n > 1 else ''} missing the SLOs left out of the comparison: "
                f"{names}"
            )
        out.append(Comparison(group, best_points(points[fit]), note))
    return out


def recommendations(
    frame: pd.DataFrame, spec: SweepSpec, objective: str = DEFAULT_OBJECTIVE
) -> list[Recommendation]:
    """One recommended point per offered load (per swept rate, or once): every point at that
    load competes, whatever its other options (kvsim/sweep/recommend.py)."""
    keys = ["rate"] if "rate" in spec.axis_names else []
    return [
        recommend(points, spec, group=_typed(group), objective=objective)
        for group, points in groups(frame, keys)
    ]


def _typed(group: dict[str, Any]) -> dict[str, Any]:
    return {k: value_text(k, v) for k, v in group.items()}


def _offered(points: pd.DataFrame) -> str:
    rates = points.get("offered_rate_per_s")
    if rates is None or rates.dropna().empty:
        return "rate unknown"
    return f"{float(rates.dropna().median()):.2f} req/s"


def recommended_block_sizes(
    frame: pd.DataFrame, spec: SweepSpec, objective: str = DEFAULT_OBJECTIVE
) -> list[str]:
    """One sentence per combination of the axes other than block size and rate: the block
    size to use, and why. With a rate axis and an SLO given: the block size that sustains the
    highest rate meeting the SLO (ties: lower normalized latency at that rate). Otherwise,
    per rate: the recommendation rule (kvsim/sweep/recommend.py) among the block sizes, then
    the measured trade-off with its neighbours."""
    if "block_size" not in spec.axis_names:
        return []
    ok = frame[frame["status"] == "ok"]
    others = [a for a in spec.axis_names if a not in ("block_size", "rate")]
    lines = []
    if "rate" in spec.axis_names and spec.has_slo:
        for group, points in groups(ok, others):
            lines.append(_by_max_rate(group, points, spec))
        return lines
    for group, points in groups(frame, [*others, *(["rate"] if "rate" in spec.axis_names else [])]):
        lines.append(_by_objective(group, points, spec, objective))
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


def _block_size_name(row: pd.Series) -> str:
    return f"block size {value_text('block_size', row['block_size'])}"


def _by_objective(
    group: dict[str, Any], points: pd.DataFrame, spec: SweepSpec, objective: str
) -> str:
    r = recommend(
        points, spec, group=_typed(group), objective=objective, name_of=_block_size_name,
        subject="block size",
    )  # fmt: skip
    if r.pick is None:
        return r.sentence
    goal = OBJECTIVES[objective]
    criteria = [(goal.column, goal.words, goal.fmt)]
    because = tradeoff(points[points["status"] == "ok"], r.pick, *criteria)
    return r.sentence + because
