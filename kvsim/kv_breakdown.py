"""Where the KV slots go, step by step: token states, reservation, fragmentation, free.

Computed after the run from the event stream (the single source of every metric), so the
simulator pays nothing per step. Every slot of the pool is in exactly one class at each step's
compute moment (docs/sweeps.md has the definitions):

- token states: slots holding K/V (``filled_slots``);
- reservation: slots a sequence holds for its own tokens still to come (positions below its
  final length ``T`` = prompt + generated tokens at its finish);
- internal fragmentation: slots a sequence holds that no token of it will ever use
  (positions >= ``T``: buddy rounding and over-reservation; for paging, the tail of the
  last block past ``T``);
- external fragmentation: free slots in holes smaller than the block the request at the head
  of the waiting queue needs (contiguous allocators only; with paging any free block serves);
- free: every other free slot.

With ``U`` = Σ over sequences holding memory of min(slots held, T): reservation = U - filled,
internal = allocated - U. U changes only at ALLOCATE / APPEND_BLOCK / FREE events, so it is a
cumulative sum over events (vectorised); external fragmentation replays the buddy allocator
and the waiting queue from the events (one Python pass over request-level events).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from engine import EventKind
from engine.buddy import BuddyAllocator, order_of
from engine.contiguous import POLICIES, Policy, reservation_tokens
from kvsim.sim import SimResult

COLUMNS = (
    "filled_slots",
    "reserved_slots",
    "internal_frag_slots",
    "external_frag_slots",
    "free_slots",
)
SUMMARY_FIELDS = (
    "kv_token_state_share_mean",
    "kv_reservation_share_mean",
    "kv_internal_frag_share_mean",
    "kv_external_frag_share_mean",
    "kv_free_share_mean",
)


def final_lengths(result: SimResult, max_model_len: int | None) -> np.ndarray:
    """T per seq_id: prompt + the tokens it generates when it runs to its end."""
    n = len(result.requests)
    prompt = np.fromiter((r.prompt_tokens for r in result.requests), np.int64, n)
    output = np.fromiter((r.output_tokens for r in result.requests), np.int64, n)
    if max_model_len is not None:
        output = np.minimum(output, np.maximum(max_model_len - prompt, 1))
    return prompt + output


def region_sizes(result: SimResult, policy: Policy, max_model_len: int | None) -> np.ndarray:
    """Slots of each request's buddy block under a contiguous ``policy`` (rounded)."""
    sizes = [
        1 << order_of(reservation_tokens(policy, r.prompt_tokens, r.output_tokens, max_model_len))
        for r in result.requests
    ]
    return np.asarray(sizes, dtype=np.int64)


def _step_event_index(kind: np.ndarray, num_steps: int) -> np.ndarray:
    return np.flatnonzero(kind == EventKind.STEP)[:num_steps]


def _usable_paged(cols: dict[str, np.ndarray], t: np.ndarray, block_size: int) -> np.ndarray:
    """Per event: the change of U (Σ min(blocks held x block_size, T)) it causes.

    Written to keep few arrays alive at once (a million-request run has ~15 M block events)."""
    kind = cols["kind"]
    ev = np.flatnonzero(np.isin(kind, (EventKind.ALLOCATE, EventKind.APPEND_BLOCK, EventKind.FREE)))
    out = np.zeros(len(kind), dtype=np.int64)
    n = len(ev)
    if n == 0:
        return out
    # 1. the events of each sequence together, in time order (stable sort by sequence)
    seq = cols["seq_id"][ev]
    order = np.argsort(seq, kind="stable")
    seq_sorted = seq[order]
    del seq
    delta = cols["num_blocks"][ev]
    delta = np.where(kind[ev] == EventKind.FREE, -delta, delta)[order]
    first = np.ones(n, dtype=bool)
    first[1:] = seq_sorted[1:] != seq_sorted[:-1]
    # 2. blocks each sequence holds after each of its events (cumulative sum per sequence)
    cs = np.cumsum(delta, dtype=np.int64)
    group_base = (cs - delta)[first]
    del delta
    group_len = np.diff(np.append(np.flatnonzero(first), n))
    cs -= np.repeat(group_base, group_len)  # now: blocks held after the event
    del group_base, group_len
    # 3. its usable slots after the event, and the change from its previous event
    usable = np.minimum(cs * block_size, t[seq_sorted])
    del cs, seq_sorted
    change = np.empty_like(usable)
    change[0] = usable[0]
    np.subtract(usable[1:], usable[:-1], out=change[1:])
    change[first] = usable[first]
    del usable, first
    out[ev[order]] = change
    return out


def _usable_contiguous(cols: dict[str, np.ndarray], t: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    kind, seq = cols["kind"], cols["seq_id"]
    out = np.zeros(len(kind), dtype=np.int64)
    usable = np.minimum(sizes, t)
    alloc = kind == EventKind.ALLOCATE
    free = kind == EventKind.FREE
    out[alloc] = usable[seq[alloc]]
    out[free] = -usable[seq[free]]
    return out


def _external_contiguous(
    cols: dict[str, np.ndarray], block_ids: np.ndarray, sizes: np.ndarray, num_slots: int
) -> np.ndarray:
    """Per STEP event: free slots in buddy holes smaller than the waiting head's block."""
    kind, nb = cols["kind"], cols["num_blocks"]
    if "first_block" in cols:  # a streamed run keeps only each event's first block id
        first_block = cols["first_block"]
    else:
        first_block = np.full(len(kind), -1, dtype=np.int64)
        has = nb > 0
        first_block[has] = block_ids[(np.cumsum(nb) - nb)[has]]
    wanted = (
        EventKind.ARRIVE, EventKind.ADMIT, EventKind.RESUME, EventKind.REJECT, EventKind.ABORT,
        EventKind.PREEMPT, EventKind.ALLOCATE, EventKind.FREE, EventKind.STEP,
    )  # fmt: skip
    ev = np.flatnonzero(np.isin(kind, wanted))
    buddy = BuddyAllocator(num_slots)
    orders = [order_of(int(s)) for s in sizes]
    waiting: dict[int, None] = {}  # insertion-ordered: the head is the first key
    external: list[int] = []
    step, arrive, allocate, free, preempt = (
        EventKind.STEP, EventKind.ARRIVE, EventKind.ALLOCATE, EventKind.FREE, EventKind.PREEMPT
    )  # fmt: skip
    for k, sid, b in zip(kind[ev].tolist(), cols["seq_id"][ev].tolist(), first_block[ev].tolist()):
        if k == step:
            external.append(buddy.free_slots_below(orders[next(iter(waiting))]) if waiting else 0)
        elif k == arrive:
            waiting[sid] = None
        elif k == allocate:
            start = buddy.allocate(int(sizes[sid]))
            if start != b:
                raise AssertionError(f"buddy replay placed seq {sid} at {start}, events say {b}")
        elif k == free:
            buddy.free(b)
        elif k == preempt:
            waiting = {sid: None, **waiting}
        else:  # ADMIT, RESUME, REJECT, ABORT: it leaves the waiting queue (if it was there)
            waiting.pop(sid, None)
    return np.asarray(external, dtype=np.int64)


def add_kv_breakdown(
    steps: pd.DataFrame, result: SimResult, allocator: str, max_model_len: int | None
) -> pd.DataFrame:
    """Add ``reserved_slots``, ``internal_frag_slots``, ``external_frag_slots`` and
    ``free_slots`` to ``steps`` (in place; also returned). With ``filled_slots`` they sum to
    the pool's slots at every step."""
    cols, block_ids = result.recorder.columns()
    n = len(steps)
    at = _step_event_index(cols["kind"], n)
    t = final_lengths(result, max_model_len)
    total = result.num_blocks * result.block_size
    if allocator == "paged":
        change = _usable_paged(cols, t, result.block_size)
        external = np.zeros(n, dtype=np.int64)
    elif allocator in POLICIES:
        sizes = region_sizes(result, allocator, max_model_len)
        change = _usable_contiguous(cols, t, sizes)
        external = _external_contiguous(cols, block_ids, sizes, total)[:n]
    else:
        raise ValueError(f"unknown allocator {allocator!r}")
    usable = np.cumsum(change)[at] if n else np.zeros(0, dtype=np.int64)
    allocated = steps["allocated_slots"].to_numpy()
    filled = steps["filled_slots"].to_numpy()
    steps["reserved_slots"] = usable - filled
    steps["internal_frag_slots"] = allocated - usable
    steps["external_frag_slots"] = external
    steps["free_slots"] = total - allocated - external
    return steps


def breakdown_means(
    steps: pd.DataFrame, total_slots: int, weights: np.ndarray | None = None
) -> dict[str, Any]:
    """Time-averaged shares of all slots (weights: step durations, or ``weights``, e.g. cut
    at ``--until``); they sum to 1."""
    w = steps["duration_s"].to_numpy() if weights is None else np.asarray(weights)
    busy = float(w.sum())
    out: dict[str, Any] = {}
    for field, column in zip(SUMMARY_FIELDS, COLUMNS):
        if column not in steps or busy <= 0 or total_slots <= 0:
            out[field] = 0.0 if column in steps else None
            continue
        out[field] = float((steps[column].to_numpy() * w).sum() / (busy * total_slots))
    return out
