"""A sweep's simulated prefix-cache hit rates beside the offline cache curve of its trace.

The cache curve (kvsim.analysis.cache_curve, ``kvsim cache-curve``) is the hit rate of a
cache that holds ``capacity`` tokens of blocks and nothing else, with requests served one at a
time in arrival order: LRU, and the optimal policy no eviction rule can beat. A simulated pool
of the same ``kv_slots`` also holds the running requests' blocks, admits requests in batches
and evicts only free blocks (vLLM's free queue), so its hit rate is read against that curve:
at or below the LRU figure when running requests crowd the cache, near it when they take
little of the pool. Definitions: docs/sweeps.md ("The cache-curve bound").
"""

from __future__ import annotations

import pandas as pd

from kvsim.analysis.cache_curve import cache_curve
from kvsim.analysis.prefix_blocks import PrefixBlocksError
from kvsim.runner import load_workload
from kvsim.sweep.compare import labelled
from kvsim.sweep.spec import SweepSpec
from workloads import Trace

BOUND_COLUMNS = ("lru_hit_rate", "optimal_hit_rate")


def hit_rate_bounds(table: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """The successful points of ``table`` (sweep.csv) that measured a prefix-cache hit rate,
    with ``lru_hit_rate`` and ``optimal_hit_rate``: the cache curve of ``trace`` at the
    point's block size and ``kv_slots`` (tokens). One curve per block size, computed for all
    its capacities in one pass."""
    ok = table[(table["status"] == "ok") & table["prefix_cache_hit_rate"].notna()].copy()
    ok[list(BOUND_COLUMNS)] = float("nan")
    for block_size, group in ok.groupby("block_size", sort=True):
        capacities = sorted({float(c) for c in group["kv_slots"]})
        curve = cache_curve(trace, int(block_size), capacities).frame()
        rates = curve.pivot(index="capacity_tokens", columns="policy", values="hit_rate")
        for policy, column in zip(("lru", "optimal"), BOUND_COLUMNS):
            ok.loc[group.index, column] = (
                group["kv_slots"].astype(float).map(rates[policy]).to_numpy()
            )
    return ok


def bound_lines(table: pd.DataFrame, spec: SweepSpec) -> list[str]:
    """The report's sentences: each point's simulated hit rate beside the cache curve of the
    sweep's trace at its block size and kv_slots. None when no point measured a hit rate or
    the trace has no hash_ids (the curve needs prefix identity)."""
    if "prefix_cache_hit_rate" not in table or table["prefix_cache_hit_rate"].isna().all():
        return []
    _, trace = load_workload(spec.base)
    if trace.hash_block_size is None:  # no prefix identity, no curve
        return []
    try:
        bounds = hit_rate_bounds(table, trace)
    except PrefixBlocksError:
        return []
    names = [n for n in ("block_size", "kv_slots", *spec.axis_names) if n in bounds]
    lines = []
    for _, r in bounds.iterrows():
        who = labelled({n: r[n] for n in dict.fromkeys(names)})
        lines.append(
            f"{who}: simulated {r['prefix_cache_hit_rate']:.1%}; cache curve LRU "
            f"{r['lru_hit_rate']:.1%}, optimal {r['optimal_hit_rate']:.1%}."
        )
    return lines
