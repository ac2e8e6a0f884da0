"""KV offload metrics of a run (docs/metrics.md, "KV offloading"): per request (requests.parquet),
per step (steps.parquet) and for the run (summary.json's ``offload`` section).

Hits by source follow vLLM's prompt-token metrics (vllm/v1/metrics/stats.py PromptTokenStats,
counted at each request's first admission): ``local_cache_hit`` (the GPU prefix cache),
``external_kv_transfer`` (loaded from the CPU tier) and ``local_compute`` (the rest), which sum
to the prompt tokens; ``external_prefix_cache_queries`` / ``_hits`` are vLLM's connector
counters (queries: the tokens past the GPU hit).

A loading request's TTFT splits into queueing (arrival until its load is issued), loading
(until it is admitted to run) and computing (admission until its first token).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine import EventKind
from engine.core.events import Columns
from kvsim.analysis.load import distribution
from kvsim.analysis.prefix_metrics import Admissions
from kvsim.analysis.table import Table
from kvsim.sim.records import OffloadRecords, SecondaryTierRecords


def _per_seq_first(
    seq_id: np.ndarray, values: np.ndarray, n: int, fill: float = np.nan
) -> np.ndarray:
    out = np.full(n, fill, dtype=np.float64)
    out[seq_id[::-1]] = values[::-1]  # the earliest row of each sequence wins
    return out


def offload_request_columns(
    cols: Columns, records: OffloadRecords, n: int
) -> dict[str, np.ndarray]:
    """requests.parquet's offload columns: ``offload_load_start_s`` (when its first load was
    issued), ``offload_transfer_s`` (that load's transfer time, s), ``offload_recompute_s``
    (what a lone prefill of the loaded tokens takes on the run's step-time model: loading
    pays off when it is the larger; vLLM's rule does not compare), ``offload_load_wait_s``
    (issue to the admission that runs it: the TTFT share spent loading, for a first admission)
    and ``offload_bytes_loaded``."""
    kind, seq, t = cols["kind"], cols["seq_id"].astype(np.int64), cols["time_s"]
    is_load = kind == EventKind.OFFLOAD_LOAD
    start = _per_seq_first(seq[is_load], t[is_load], n)
    # the admission that ended its first load: the first ADMIT / RESUME after it
    runs = np.full(n, np.nan)
    is_admit = (kind == EventKind.ADMIT) | (kind == EventKind.RESUME)
    order = np.lexsort((t[is_admit], seq[is_admit]))  # by sequence, then time
    admit_seq, admit_t = seq[is_admit][order], t[is_admit][order]
    for s_id in np.flatnonzero(~np.isnan(start)):
        lo, hi = np.searchsorted(admit_seq, [s_id, s_id + 1])
        at = lo + np.searchsorted(admit_t[lo:hi], start[s_id])
        if at < hi:
            runs[s_id] = admit_t[at]
    loads = [j for j in records.jobs if not j.job.is_store]
    transfer = np.full(n, np.nan)
    loaded_bytes = np.zeros(n, dtype=np.int64)
    if loads:
        load_seq = np.fromiter((j.job.seq_id for j in loads), np.int64, len(loads))
        took = np.fromiter(
            (np.nan if j.completed_s is None else j.completed_s - j.submitted_s for j in loads),
            np.float64,
            len(loads),
        )
        transfer = _per_seq_first(load_seq, took, n)
        nbytes = np.fromiter((j.nbytes for j in loads), np.int64, len(loads))
        loaded_bytes = np.bincount(load_seq, weights=nbytes, minlength=n)[:n].astype(np.int64)
    recompute = np.full(n, np.nan)
    if loads:
        costs = np.fromiter(
            (records.load_recompute_s.get(j.job.job_id, np.nan) for j in loads),
            np.float64,
            len(loads),
        )
        recompute = _per_seq_first(load_seq, costs, n)
    return {
        "offload_load_start_s": start,
        "offload_transfer_s": transfer,
        "offload_recompute_s": recompute,
        "offload_load_wait_s": runs - start,
        "offload_bytes_loaded": loaded_bytes,
    }


def offload_summary(
    adm: Admissions, records: OffloadRecords, requests_load_wait: np.ndarray, block_size: int
) -> dict[str, Any]:
    """summary.json's ``offload`` section (module docstring)."""
    first = ~adm.resumed
    prompt = int(adm.num_tokens[first].sum())
    local = int(adm.hit_tokens[first].sum())
    external = int(adm.offload_tokens[first].sum())
    queries = prompt - local
    moved: dict[str, dict[str, Any]] = {}
    for name, is_store in (("load", False), ("store", True)):
        jobs = [j for j in records.jobs if j.job.is_store is is_store]
        done = [j for j in jobs if j.completed_s is not None]
        times = np.array([j.completed_s - j.submitted_s for j in done if j.completed_s])
        moved[name] = {
            "jobs": len(jobs),
            "bytes": int(sum(j.nbytes for j in jobs)),
            "chunks": int(sum(len(j.job.keys) for j in jobs)),
            "transfer_s": distribution(times),
        }
    chunks = records.step_tier_chunks
    slower = sum(
        1
        for j in records.jobs
        if not j.job.is_store
        and j.completed_s is not None
        and j.completed_s - j.submitted_s > records.load_recompute_s.get(j.job.job_id, np.inf)
    )
    capacity = records.tier_capacity_chunks
    out = {
        "tier": "cpu",
        "capacity_chunks": capacity,
        "chunk_tokens": records.blocks_per_chunk * block_size,
        "chunk_bytes": records.blocks_per_chunk * records.bytes_per_block,
        "prompt_tokens_by_source": {
            "local_compute": prompt - local - external,
            "local_cache_hit": local,
            "external_kv_transfer": external,
        },
        "external_prefix_cache_queries": queries,
        "external_prefix_cache_hits": external,
        "external_prefix_cache_hit_rate": external / queries if queries else None,
        "hit_rate_all_tiers": (local + external) / prompt if prompt else None,
        "requests_loading": int((adm.offload_tokens[first] > 0).sum()),
        "loads_slower_than_recompute": slower,
        "load_wait_s": distribution(requests_load_wait[~np.isnan(requests_load_wait)]),
        "loads": moved["load"],
        "stores": moved["store"],
        "tier_chunks_mean": float(chunks.mean()) if len(chunks) else 0.0,
        "tier_chunks_peak": int(chunks.max()) if len(chunks) else 0,
        "tier_usage_peak": float(chunks.max() / capacity) if len(chunks) and capacity else 0.0,
        "tier_evictions": int(records.step_tier_evictions[-1])
        if len(records.step_tier_evictions)
        else 0,
    }
    if records.secondary:  # only with --kv-offload-tier: a CPU-only summary is unchanged
        chunk_tokens = records.blocks_per_chunk * block_size
        out["tiers"] = [secondary_summary(t, chunk_tokens) for t in records.secondary]
    return out


def secondary_summary(t: SecondaryTierRecords, chunk_tokens: int) -> dict[str, Any]:
    """One secondary tier's entry of summary.json ``offload.tiers``: tokens it served (chunks
    promoted for a request and then loaded by it, x tokens per chunk), its reads (promotions,
    tier -> CPU) and writes (cascades, CPU -> tier), lookups, occupancy and evictions."""
    moved: dict[str, dict[str, Any]] = {}
    for name, promotion in (("reads", True), ("writes", False)):
        jobs = [j for j in t.jobs if j.is_promotion is promotion]
        times = np.array([j.completed_s - j.submitted_s for j in jobs if j.completed_s is not None])
        moved[name] = {
            "jobs": len(jobs),
            "bytes": int(sum(j.nbytes for j in jobs)),
            "chunks": int(sum(len(j.keys) if promotion else len(j.written) for j in jobs)),
            "busy_s": float(times.sum()) if len(times) else 0.0,
            "transfer_s": distribution(times),
        }
    chunks = t.step_chunks
    return {
        "tier": t.name,
        "capacity_chunks": t.capacity_chunks,
        "chunk_bytes": t.chunk_bytes,
        "hit_tokens": t.loaded_chunks * chunk_tokens,
        "chunks_promoted": t.promoted_chunks,
        "chunks_loaded": t.loaded_chunks,
        "lookups": t.stats.lookups,
        "lookup_hits": t.stats.hits,
        "reads": moved["reads"],
        "writes": moved["writes"],
        "chunks_mean": float(chunks.mean()) if len(chunks) else 0.0,
        "chunks_peak": int(chunks.max()) if len(chunks) else 0,
        "usage_peak": float(chunks.max() / t.capacity_chunks) if len(chunks) else 0.0,
        "evictions": t.stats.evictions,
        "chunks_dropped": t.stats.dropped,
    }


def transfers_table(records: OffloadRecords, block_size: int) -> Table:
    """transfers.parquet: one row per load or store job, in submission order: its request
    (seq_id), kind, GPU blocks and tokens moved, chunks, bytes, when it was submitted and
    completed on the link (s; NaN if still in flight when the run ended) and, for a load,
    what recomputing its tokens would have taken instead (s)."""
    jobs = records.jobs
    n = len(jobs)
    kind = np.fromiter((1 if j.job.is_store else 0 for j in jobs), np.int8, n)
    completed = np.fromiter(
        (np.nan if j.completed_s is None else j.completed_s for j in jobs), np.float64, n
    )
    blocks = np.fromiter((len(j.job.gpu_block_ids) for j in jobs), np.int64, n)
    recompute = np.fromiter(
        (records.load_recompute_s.get(j.job.job_id, np.nan) for j in jobs), np.float64, n
    )
    return Table(
        {
            "job": np.fromiter((j.job.job_id for j in jobs), np.int64, n),
            "seq_id": np.fromiter((j.job.seq_id for j in jobs), np.int64, n),
            "kind": kind,
            "gpu_blocks": blocks,
            "tokens": blocks * block_size,
            "chunks": np.fromiter((len(j.job.keys) for j in jobs), np.int64, n),
            "bytes": np.fromiter((j.nbytes for j in jobs), np.int64, n),
            "submitted_s": np.fromiter((j.submitted_s for j in jobs), np.float64, n),
            "completed_s": completed,
            "transfer_s": completed - np.fromiter((j.submitted_s for j in jobs), np.float64, n),
            "recompute_s": recompute,
        },
        categories={"kind": ("load", "store")},
    )


def transfers_with_tiers(records: OffloadRecords, block_size: int) -> Table:
    """transfers.parquet of a run with secondary tiers: the CPU link's jobs (tier "cpu") then
    each secondary tier's (a promotion is a "load" into the CPU tier, a cascade a "store"
    from it; no GPU blocks), with a ``tier`` column."""
    base = transfers_table(records, block_size)
    columns = {name: base[name] for name in base.columns}
    names = ["cpu", *(t.name for t in records.secondary)]
    tier = [np.zeros(len(base), np.int8)]
    chunk_tokens = records.blocks_per_chunk * block_size
    for i, t in enumerate(records.secondary, 1):
        jobs, n = t.jobs, len(t.jobs)
        done = np.fromiter(
            (np.nan if j.completed_s is None else j.completed_s for j in jobs), np.float64, n
        )
        sub = np.fromiter((j.submitted_s for j in jobs), np.float64, n)
        nchunks = np.fromiter(
            (len(j.keys) if j.is_promotion else len(j.written) for j in jobs), np.int64, n
        )
        extra = {
            "job": np.fromiter((j.job_id for j in jobs), np.int64, n),
            "seq_id": np.full(n, -1, np.int64),
            "kind": np.fromiter((0 if j.is_promotion else 1 for j in jobs), np.int8, n),
            "gpu_blocks": np.zeros(n, np.int64),
            "tokens": nchunks * chunk_tokens,
            "chunks": nchunks,
            "bytes": np.fromiter((j.nbytes for j in jobs), np.int64, n),
            "submitted_s": sub,
            "completed_s": done,
            "transfer_s": done - sub,
            "recompute_s": np.full(n, np.nan),
        }
        for name in columns:
            columns[name] = np.concatenate([np.asarray(columns[name]), extra[name]])
        tier.append(np.full(n, i, np.int8))
    columns["tier"] = np.concatenate(tier)
    return Table(columns, categories={"kind": ("load", "store"), "tier": tuple(names)})
