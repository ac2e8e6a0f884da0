"""The recommendation rule: among the points of one offered load, those that meet the SLOs are
eligible, the best by the objective wins (points within a tie margin of it are tied and
broken by a second figure), and every other point is told why it lost; when no point meets
the SLOs, that is the answer. Definitions: docs/sweeps.md ("Recommendation").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from kvsim.sweep import slo
from kvsim.sweep.spec import OBJECTIVE_NAMES, SweepSpec


@dataclass(frozen=True, slots=True)
class Objective:
    """What a recommendation optimises: a sweep.csv column, lower or higher is better."""

    name: str
    column: str
    lower_is_better: bool
    words: str
    fmt: Callable[[float], str]
    tie_column: str  # breaks a tie within the margin (lower is better)
    tie_words: str
    tie_fmt: Callable[[float], str]

    def better(self, a: float, b: float) -> bool:
        return a < b if self.lower_is_better else a > b

    def within(self, value: float, best: float, margin: float) -> bool:
        """Whether ``value`` is within ``margin`` (relative) of ``best``: a tie."""
        if self.lower_is_better:
            return value <= best * (1 + margin)
        return value >= best * (1 - margin)

    def change(self, value: float, best: float) -> str:
        """How much worse ``value`` is than ``best``: ``+12.5%``."""
        if not best:
            return ""
        return f" ({(value - best) / abs(best):+.1%})"


OBJECTIVES = {
    "normalized_latency": Objective(
        "normalized_latency",
        "normalized_latency_s_per_token",
        True,
        "normalized latency",
        lambda v: f"{v:.4f} s/token",
        "ttft_s_p99",
        "p99 TTFT",
        slo.seconds_text,
    ),
    "throughput": Objective(
        "throughput",
        "throughput_output_tokens_per_s",
        False,
        "output throughput",
        lambda v: f"{v:,.0f} tokens/s",
        "normalized_latency_s_per_token",
        "normalized latency",
        lambda v: f"{v:.4f} s/token",
    ),
}
DEFAULT_OBJECTIVE = OBJECTIVE_NAMES[0]
# Points whose objective is within this share of the best are tied: the sweep's step-time
# model and a trace's sample do not separate them more finely than that.
TIE_MARGIN = 0.02


@dataclass(frozen=True, slots=True)
class Recommendation:
    """One offered load's answer: the ``pick`` (its row, None when no point meets the SLOs),
    a ``sentence`` saying why, and each other point with why it lost."""

    group: dict[str, object]
    pick: pd.Series | None
    sentence: str
    lost: list[tuple[str, str]] = field(default_factory=list)


def _number(row: pd.Series, column: str) -> float:
    value = row.get(column)
    if value is None or pd.isna(value):
        return math.nan
    return float(value)


def _name_of(row: pd.Series) -> str:
    return str(row["label"])


def recommend(
    points: pd.DataFrame,
    spec: SweepSpec,
    *,
    group: dict[str, object] | None = None,
    objective: str = DEFAULT_OBJECTIVE,
    margin: float = TIE_MARGIN,
    name_of: Callable[[pd.Series], str] = _name_of,
    subject: str = "point",
) -> Recommendation:
    """The recommendation among ``points`` (one offered load; the caller groups them):
    ``name_of`` names a point in sentences (its label, or e.g. ``block size 32``)."""
    goal = OBJECTIVES[objective]
    bounds = slo.bounds(spec)
    prefix = f"{', '.join(f'{k}={v}' for k, v in (group or {}).items())}: " if group else ""
    lost: list[tuple[str, str]] = []
    eligible = []
    for _, row in points.iterrows():
        if row["status"] != "ok":
            lost.append((name_of(row), f"failed: {row.get('error') or 'no result'}"))
            continue
        missed = slo.misses(row, bounds)
        if missed:
            lost.append((name_of(row), "misses the SLO: " + ", ".join(missed)))
        elif math.isnan(_number(row, goal.column)):
            lost.append((name_of(row), f"no {goal.words} (no request finished)"))
        else:
            eligible.append(row)
    slo_words = slo.slo_text(spec)
    if not eligible:
        return Recommendation(
            group or {},
            None,
            f"{prefix}no {subject} meets the SLOs ({slo_words}): none is recommended.",
            lost,
        )
    values = [_number(r, goal.column) for r in eligible]
    best = min(values) if goal.lower_is_better else max(values)
    tied = [r for r, v in zip(eligible, values) if goal.within(v, best, margin)]
    pick = min(tied, key=lambda r: (_tie_key(r, goal), int(r["point"])))
    value = _number(pick, goal.column)
    n = len(eligible)
    most = "lowest" if goal.lower_is_better else "highest"
    sentence = (
        f"{prefix}recommended {name_of(pick)}: the {most} "
        f"{goal.words} ({goal.fmt(value)}) of {n} {subject}{'s' if n > 1 else ''} meeting the "
        f"SLOs ({slo_words})"
    )
    if len(tied) > 1:
        sentence += (
            f"; {len(tied) - 1} other{'s' if len(tied) > 2 else ''} within {margin:.0%} of it, "
            f"tie broken by the lowest {goal.tie_words}"
        )
    verdict = pick.get("saturation")
    if isinstance(verdict, str) and verdict != "stable":
        sentence += (
            f". Note: it is {verdict} at this load (docs/metrics.md), so its latencies depend "
            "on the trace's length"
        )
    for row in eligible:
        if int(row["point"]) == int(pick["point"]):
            continue
        lost.append((name_of(row), _why_lost(row, pick, goal, margin)))
    order = {name_of(r): i for i, (_, r) in enumerate(points.iterrows())}
    lost.sort(key=lambda item: order.get(item[0], 0))
    return Recommendation(group or {}, pick, sentence + ".", lost)


def _tie_key(row: pd.Series, goal: Objective) -> float:
    value = _number(row, goal.tie_column)
    return math.inf if math.isnan(value) else value


def _why_lost(row: pd.Series, pick: pd.Series, goal: Objective, margin: float) -> str:
    value, best = _number(row, goal.column), _number(pick, goal.column)
    if goal.within(value, best, margin):
        tie, tie_pick = _number(row, goal.tie_column), _number(pick, goal.tie_column)
        broken = (
            f"higher {goal.tie_words} ({goal.tie_fmt(tie)} vs {goal.tie_fmt(tie_pick)})"
            if tie != tie_pick
            else f"the same {goal.tie_words}, later in the grid"
        )
        return (
            f"tied within {margin:.0%} on {goal.words} ({goal.fmt(value)} vs "
            f"{goal.fmt(best)}); {broken}"
        )
    return f"{goal.words} {goal.fmt(value)} vs {goal.fmt(best)}{goal.change(value, best)}"


def lines(recommendation: Recommendation) -> list[str]:
    """The sentence, then one line per other point: ``block_size=32 ...: why``."""
    return [recommendation.sentence] + [f"{name}: {why}" for name, why in recommendation.lost]
