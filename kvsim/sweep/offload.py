"""sweep.csv's columns of the points that ran with a CPU offload tier (``--param
kv_offloading_size=0,64,256``), from their summary.json ``offload`` sections; the advice they
feed: kvsim/sweep/offload_advice.py. Definitions: docs/sweeps.md ("CPU offload tier"),
docs/metrics.md ("KV offloading").
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

AXIS = "kv_offloading_size"
# sweep.csv's offload columns (only in a sweep where some point offloads): summary.json's
# ``offload`` fields (docs/metrics.md); a point without a tier gets the GPU's hit rate as its
# hit rate of all tiers, and 0 tokens and bytes moved.
OFFLOAD_COLUMNS = (
    "hit_rate_all_tiers",
    "offload_loaded_tokens",
    "offload_requests_loading",
    "offload_bytes_loaded",
    "offload_bytes_stored",
    "offload_tier_evictions",
    "offload_load_wait_s_p50",
)
OFFLOAD_INT_COLUMNS = OFFLOAD_COLUMNS[1:6]


def offload_row(summary: dict[str, Any]) -> dict[str, Any]:
    """A point's offload columns from its summary.json (empty without a CPU tier)."""
    o = summary.get("offload")
    if not o:
        return {}
    rate = o.get("hit_rate_all_tiers")
    return {
        "hit_rate_all_tiers": math.nan if rate is None else rate,
        "offload_loaded_tokens": o["prompt_tokens_by_source"]["external_kv_transfer"],
        "offload_requests_loading": o["requests_loading"],
        "offload_bytes_loaded": o["loads"]["bytes"],
        "offload_bytes_stored": o["stores"]["bytes"],
        "offload_tier_evictions": o["tier_evictions"],
        "offload_load_wait_s_p50": _nan((o.get("load_wait_s") or {}).get("p50")),
    }


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def has_offload(rows: list[dict[str, Any]]) -> bool:
    """Whether some point of a sweep ran with a CPU tier (its table gets OFFLOAD_COLUMNS)."""
    return any(finite(r.get("offload_loaded_tokens")) for r in rows)


def finite(value: Any) -> bool:
    """Whether ``value`` is a number (numpy's and pandas' too), not NaN or missing."""
    if value is None or isinstance(value, (str, bool)) or value is pd.NA:
        return False
    try:
        return not math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def fill_tierless(frame: pd.DataFrame) -> pd.DataFrame:
    """A tierless point's offload columns: all tiers = the GPU's hit rate, nothing moved."""
    ok = frame["status"] == "ok"
    tierless = ok & frame["offload_loaded_tokens"].isna()
    frame.loc[tierless, "hit_rate_all_tiers"] = frame.loc[tierless, "prefix_cache_hit_rate"]
    for column in OFFLOAD_INT_COLUMNS:
        frame.loc[tierless, column] = 0
    return frame
