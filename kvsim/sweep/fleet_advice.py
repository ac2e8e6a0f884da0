"""Which router and fleet shape serve the most load, and why (issue 28 item 4): the advice of
a capacity search (``kvsim capacity ... --router a,b --replicas 2,4``) whose grid has a
``router`` or ``replicas`` axis. Definitions: docs/sweeps.md ("Fleets: which router and shape
serve the most load").

Per combination of the other axes, the configuration with the highest rate within the SLOs
is named with its rate per replica, and the reason is read from its figures at that rate
against the router it beat or lost to at the same fleet size: the points of prompt tokens its
prefix cache gained (hit rate, fleet-wide) against the load imbalance routing by cache costs
(the coefficient of variation of busy time across replicas, docs/fleet.md).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvsim.sweep.compare import groups, labelled
from kvsim.sweep.spec import SweepSpec

FLEET_AXES = ("router", "replicas")
BASELINE_ROUTER = "round-robin"
CAPACITY = "capacity_rate_per_s"


def _number(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _hits(row: pd.Series) -> str:
    rate = _number(row.get("prefix_cache_hit_rate"))
    return "-" if rate is None else f"{rate:.1%}"


def _cv(row: pd.Series) -> str:
    cv = _number(row.get("busy_time_cv"))
    return "-" if cv is None else f"{cv:.3f}"


def _shape(row: pd.Series, spec: SweepSpec) -> str:
    router = row.get("router", spec.base.router)
    replicas = int(row.get("replicas", spec.base.replicas))
    return f"{router} on {replicas} replica{'s' if replicas != 1 else ''}"


def _reason(best: pd.Series, rival: pd.Series) -> str:
    """Why ``best`` served more than ``rival`` (same fleet size, another router)."""
    gained = (_number(best.get("prefix_cache_hit_rate")) or 0.0) - (
        _number(rival.get("prefix_cache_hit_rate")) or 0.0
    )
    best_cv = _number(best.get("busy_time_cv")) or 0.0
    rival_cv = _number(rival.get("busy_time_cv")) or 0.0
    figures = (
        f"hit rate {_hits(best)} against {_hits(rival)} ({gained * 100:+.1f} points), "
        f"busy-time CV {_cv(best)} against {_cv(rival)}"
    )
    if gained > 0 and best_cv > rival_cv:
        why = "the prefill its cache hits save outweighs the imbalance of routing by cache"
    elif gained > 0:
        why = "its cache hits save prefill without unbalancing the replicas"
    elif best_cv < rival_cv:
        why = (
            "it balances the replicas better, and the rival's extra hits do not pay for its "
            "imbalance"
            if gained < 0
            else "it balances the replicas better"
        )
    else:
        why = "neither hits nor balance explain it alone: compare TTFT and queueing"
    return f"{figures}: {why}"


def fleet_advice(table: pd.DataFrame, spec: SweepSpec) -> list[str]:
    """One sentence per combination of the non-fleet axes (none when the grid sweeps neither
    ``router`` nor ``replicas``): the configuration with the highest capacity (req/s within
    the SLOs), its rate per replica, and its reason against the best other router at the same
    fleet size (``round-robin`` when it was swept and is not the winner)."""
    fleet_axes = [a for a in FLEET_AXES if a in spec.axis_names]
    if not fleet_axes or CAPACITY not in table:
        return []
    others = [a for a in spec.axis_names if a not in FLEET_AXES]
    out = []
    for group, points in groups(table, others):
        prefix = f"{labelled(group)}: " if group else ""
        served = points[points[CAPACITY].notna()]
        if served.empty:
            words = "no fleet configuration met the SLOs at any rate probed."
            out.append(prefix + words if prefix else words[0].upper() + words[1:])
            continue
        ranked = served.sort_values(CAPACITY, ascending=False, kind="stable")
        best = ranked.iloc[0]
        rate = float(best[CAPACITY])
        replicas = int(best.get("replicas", spec.base.replicas))
        sentence = (
            f"{prefix}most load: {_shape(best, spec)} serves {rate:g} req/s within the SLOs "
            f"({rate / replicas:.3g} req/s per replica)"
        )
        if "router" in fleet_axes:
            same_size = (
                ranked[ranked["replicas"] == best["replicas"]] if "replicas" in ranked else ranked
            )
            rivals = same_size[same_size["router"] != best["router"]]
            if not rivals.empty:
                baseline = rivals[rivals["router"] == BASELINE_ROUTER]
                rival = baseline.iloc[0] if not baseline.empty else rivals.iloc[0]
                sentence += (
                    f"; {rival['router']} on as many replicas serves "
                    f"{float(rival[CAPACITY]):g} req/s — " + _reason(best, rival)
                )
        out.append(sentence[0].upper() + sentence[1:] + ".")
    return out
