"""Prefix-cache metrics of a v1 run: per request (requests.parquet) and for the run
(summary.json), with vLLM's names and semantics (docs/metrics.md, "Prefix caching").

vLLM counts a lookup when a request is admitted (``KVCacheManager.record_prefix_cache_stats``,
called by the scheduler at admission so lookups of requests that did not fit are not
counted): ``queries`` += the request's ``num_tokens`` then, ``hits`` += the tokens its
cached prefix covers. A request admitted again after a preemption counts in
``preempted_queries`` / ``preempted_hits`` instead. The engine records every admission
(ADMIT, RESUME), its hit (PREFIX_HIT, same step, same sequence) and, under v1, each
preemption's ``num_tokens`` (what a resumed request's lookup covers), so all of it is read
off the event stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import EventKind
from engine.core.events import Columns
from kvsim.analysis.block_states import BlockStateTracker
from kvsim.analysis.load import distribution


def _rank_within(seq: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... for each sequence's rows, in row order."""
    order = np.argsort(seq, kind="stable")
    s = seq[order]
    n = len(s)
    new = np.ones(n, dtype=bool)
    new[1:] = s[1:] != s[:-1]
    index = np.arange(n)
    rank_sorted = index - np.maximum.accumulate(np.where(new, index, 0))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = rank_sorted
    return rank


def _pair_keys(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One int64 per (a, b) pair of non-negative values below 2**31 (seq ids, steps, ranks)."""
    return (a.astype(np.int64) << 32) | b.astype(np.int64)


def _look_up(keys: np.ndarray, table_keys: np.ndarray, values: np.ndarray, fill: int) -> np.ndarray:
    """``values`` at the row of ``table_keys`` equal to each of ``keys`` (unique), else ``fill``."""
    order = np.argsort(table_keys, kind="stable")
    sorted_keys = table_keys[order]
    at = np.minimum(np.searchsorted(sorted_keys, keys), max(len(sorted_keys) - 1, 0))
    out = np.full(len(keys), fill, dtype=np.int64)
    if len(sorted_keys):
        found = sorted_keys[at] == keys
        out[found] = values[order[at[found]]]
    return out


@dataclass(frozen=True, slots=True)
class Admissions:
    """Every admission of a v1 run: sequence, whether it resumed a preempted one, the tokens
    its lookup covered (vLLM's ``num_tokens`` then) and the tokens served from the cache."""

    seq_id: np.ndarray
    resumed: np.ndarray
    num_tokens: np.ndarray
    hit_tokens: np.ndarray
    # Tokens loaded from a KV offload tier for this admission (0 without offloading).
    offload_tokens: np.ndarray


def admissions(cols: Columns, prompt_tokens: np.ndarray) -> Admissions:
    """The admissions in ``cols`` (events with at least ARRIVE..REJECT, PREFIX_HIT kept).
    A resumed sequence's ``num_tokens`` is its previous PREEMPT's (prompt + generated)."""
    kind, seq, step = cols["kind"], cols["seq_id"].astype(np.int64), cols["step"]
    is_admit = (kind == EventKind.ADMIT) | (kind == EventKind.RESUME)
    a_seq, a_step = seq[is_admit], step[is_admit].astype(np.int64)
    resumed = kind[is_admit] == EventKind.RESUME
    num_tokens = prompt_tokens[a_seq].astype(np.int64)
    if resumed.any():
        # the k-th resume of a sequence follows its k-th preemption
        is_pre = kind == EventKind.PREEMPT
        pre_seq, res_seq = seq[is_pre], a_seq[resumed]
        num_tokens[resumed] = _look_up(
            _pair_keys(res_seq, _rank_within(res_seq)),
            _pair_keys(pre_seq, _rank_within(pre_seq)),
            cols["num_tokens"][is_pre].astype(np.int64),
            fill=0,
        )
    lookup_step, offload_tokens = _loads_before(cols, is_admit, a_step)
    hit = np.zeros(len(a_seq), dtype=np.int64)
    is_hit = kind == EventKind.PREFIX_HIT
    if is_hit.any():
        # an admission's PREFIX_HIT is the same sequence's, in the step of its lookup
        hit = _look_up(
            _pair_keys(a_seq, lookup_step),
            _pair_keys(seq[is_hit], step[is_hit]),
            cols["num_tokens"][is_hit].astype(np.int64),
            fill=0,
        )
    return Admissions(a_seq, resumed, num_tokens, hit, offload_tokens)


def _loads_before(
    cols: Columns, is_admit: np.ndarray, a_step: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per admission: the step of its prefix lookup and the tokens it loaded from an offload
    tier. An admission that waited for a load (OFFLOAD_LOAD, then ADMIT or RESUME once it
    runs) looked its prefix up when the load was issued; any other looked up when admitted."""
    kind, seq = cols["kind"], cols["seq_id"].astype(np.int64)
    is_load = kind == EventKind.OFFLOAD_LOAD
    lookup_step, loaded = a_step.copy(), np.zeros(len(a_step), dtype=np.int64)
    if not is_load.any():
        return lookup_step, loaded
    admit_rows, load_rows = np.flatnonzero(is_admit), np.flatnonzero(is_load)
    rows = np.concatenate([admit_rows, load_rows])
    is_load_row = np.r_[np.zeros(len(admit_rows), bool), np.ones(len(load_rows), bool)]
    order = np.lexsort((rows, seq[rows]))  # by sequence, then in event order
    rows, is_load_row = rows[order], is_load_row[order]
    same_seq = seq[rows[1:]] == seq[rows[:-1]]
    after_load = np.flatnonzero(~is_load_row[1:] & is_load_row[:-1] & same_seq) + 1
    at = np.searchsorted(admit_rows, rows[after_load])  # index among the admissions
    lookup_step[at] = cols["step"][rows[after_load - 1]]
    loaded[at] = cols["num_tokens"][rows[after_load - 1]]
    return lookup_step, loaded


def request_columns(
    adm: Admissions, num_requests: int, *, offload: bool = False
) -> dict[str, np.ndarray]:
    """requests.parquet's v1 columns: ``prefix_hit_tokens`` (served from the cache at the
    first admission), ``resumed_hit_tokens`` (at admissions after a preemption, summed) and
    ``prompt_tokens_recomputed`` (computed again after a preemption: the tokens each resumed
    admission covered less its hits, summed); with ``offload``, ``offload_hit_tokens``
    (loaded from the offload tier at the first admission)."""
    first = ~adm.resumed
    hit_first = np.zeros(num_requests, dtype=np.int64)
    hit_first[adm.seq_id[first]] = adm.hit_tokens[first]
    offload_columns: dict[str, np.ndarray] = {}
    if offload:
        loaded_first = np.zeros(num_requests, dtype=np.int64)
        loaded_first[adm.seq_id[first]] = adm.offload_tokens[first]
        offload_columns["offload_hit_tokens"] = loaded_first
    resumed_hits = np.bincount(
        adm.seq_id[adm.resumed], weights=adm.hit_tokens[adm.resumed], minlength=num_requests
    )
    recomputed = np.bincount(
        adm.seq_id[adm.resumed],
        weights=(adm.num_tokens - adm.hit_tokens - adm.offload_tokens)[adm.resumed],
        minlength=num_requests,
    )
    return {
        "prefix_hit_tokens": hit_first,
        "resumed_hit_tokens": resumed_hits[:num_requests].astype(np.int64),
        "prompt_tokens_recomputed": recomputed[:num_requests].astype(np.int64),
        **offload_columns,
    }


def prefix_cache_summary(
    adm: Admissions, block_states: BlockStateTracker | None, *, caching: bool
) -> dict[str, Any]:
    """summary.json's prefix-cache fields (docs/metrics.md). Without prefix caching vLLM
    looks nothing up: queries and hits 0, the hit rate None, no evictions or residency
    samples (None distributions); recomputation after preemption is still counted."""
    first = ~adm.resumed
    queries = int(adm.num_tokens[first].sum()) if caching else 0
    hits = int(adm.hit_tokens[first].sum())
    preempted_queries = int(adm.num_tokens[adm.resumed].sum()) if caching else 0
    preempted_hits = int(adm.hit_tokens[adm.resumed].sum())
    recomputed = int((adm.num_tokens - adm.hit_tokens - adm.offload_tokens)[adm.resumed].sum())
    residency = tuple(distribution(np.zeros(0)) for _ in range(3))
    if caching and block_states is not None:
        residency = block_states.residency.distributions()
    return {
        "prefix_cache_requests": int(first.sum()) if caching else 0,
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "prefix_cache_preempted_requests": int(adm.resumed.sum()) if caching else 0,
        "prefix_cache_preempted_queries": preempted_queries,
        "prefix_cache_preempted_hits": preempted_hits,
        "prefix_cache_hits_by_reason": {
            "new_request": hits,
            "resumed_after_preemption": preempted_hits,
        },
        "prompt_tokens_cached": hits,
        "prompt_tokens_computed": int(adm.num_tokens[first].sum())
        - hits
        - int(adm.offload_tokens[first].sum()),
        "prompt_tokens_recomputed": recomputed,
        "prefix_cache_evictions": block_states.num_evictions
        if caching and block_states is not None
        else 0,
        "kv_block_lifetime_s": residency[0],
        "kv_block_idle_before_evict_s": residency[1],
        "kv_block_reuse_gap_s": residency[2],
    }
