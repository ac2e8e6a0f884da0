"""Where the KV slots go, step by step: token states, reservation, fragmentation, free.

Computed from the event stream (the single source of every metric), so the simulator pays
nothing per step: for paging chunk by chunk as the recorder packs events
(``PagedUsageTracker``, so block events need not stay in memory), for contiguous allocators
after the run. Every slot of the pool is in exactly one class at each step's compute moment
(docs/sweeps.md has the definitions):

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
cumulative sum over events (vectorised, carrying each sequence's held blocks from chunk to
chunk); external fragmentation replays the buddy allocator and the waiting queue from the
events (one Python pass over request-level events).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine import EventKind
from engine.contiguous.allocator import POLICIES, Policy, reservation_tokens
from engine.contiguous.buddy import BuddyAllocator, order_of
from engine.core.events import Columns
from kvsim.analysis.block_states import BlockStateTracker
from kvsim.analysis.table import Table, TableLike, column
from kvsim.sim.records import SimResult
from workloads import Request

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
# v1 only (after kv_external_frag_share_mean): free blocks that keep their prefix-cache key.
CACHED_FIELD, CACHED_COLUMN = "kv_cached_share_mean", "cached_slots"


def final_length(request: Request, max_model_len: int | None) -> int:
    """T: prompt + the tokens the request generates when it runs to its end (tokens)."""
    output = request.output_tokens
    if max_model_len is not None:
        output = min(output, max(max_model_len - request.prompt_tokens, 1))
    return request.prompt_tokens + output


def final_lengths(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, max_model_len: int | None
) -> np.ndarray:
    """``final_length`` of many requests at once, from their prompt and output tokens (int64)."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    output = np.asarray(output_tokens, dtype=np.int64)
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


# Events that change the blocks a sequence holds: a prefix hit (v1) adds the hit blocks to
# its table without allocating them; FREE drops its whole table, hit blocks included.
_HOLD_KINDS = (EventKind.ALLOCATE, EventKind.APPEND_BLOCK, EventKind.PREFIX_HIT, EventKind.FREE)


def _step_event_index(kind: np.ndarray, num_steps: int) -> np.ndarray:
    return np.flatnonzero(kind == EventKind.STEP)[:num_steps]


class PagedUsageTracker:
    """U (Σ over sequences of min(blocks held x block_size, T)) at every STEP event, built
    chunk by chunk as the recorder packs events (``consume`` is an ``on_chunk`` callback).

    Carrying each sequence's held blocks from chunk to chunk means the block events need not
    be kept until the run ends: a million-request run has ~15 M of them.
    ``final_length_of(seq_id)`` gives T; it is asked once per sequence, when its first block
    event arrives (the sequence has been submitted by then)."""

    def __init__(self, block_size: int, final_length_of: Callable[[int], int]) -> None:
        self.block_size = block_size
        self.final_length_of = final_length_of  # T by seq_id (the compiled core asks it too)
        self._final = np.zeros(0, dtype=np.int64)  # T by seq_id
        self._held = np.zeros(0, dtype=np.int64)  # blocks held by seq_id
        self._num_known = 0  # seq ids whose T is in _final
        self._usable_total = 0
        self._refs_total = 0
        self._at_steps: list[np.ndarray] = []
        self._refs_at_steps: list[np.ndarray] = []

    def _grow(self, num_seqs: int) -> None:
        """Learn T of seq ids below ``num_seqs`` (arrays grow by doubling)."""
        known = self._num_known
        if num_seqs <= known:
            return
        if num_seqs > len(self._final):
            size = max(num_seqs, 2 * len(self._final))
            self._final = np.concatenate([self._final, np.zeros(size - len(self._final), "i8")])
            self._held = np.concatenate([self._held, np.zeros(size - len(self._held), "i8")])
        self._final[known:num_seqs] = [self.final_length_of(s) for s in range(known, num_seqs)]
        self._num_known = num_seqs

    def consume(self, cols: Columns, block_ids: np.ndarray | None = None) -> None:
        """Account one chunk of events (in recording order)."""
        kind = cols["kind"]
        ev = np.flatnonzero(np.isin(kind, _HOLD_KINDS))
        change = np.zeros(len(kind), dtype=np.int64)
        refs = np.zeros(len(kind), dtype=np.int64)
        if len(ev):
            change[ev] = self._usable_changes(cols, ev)
            held = cols["num_blocks"][ev].astype(np.int64)
            refs[ev] = np.where(kind[ev] == EventKind.FREE, -held, held)
        usable = np.cumsum(change)
        usable += self._usable_total
        refs = np.cumsum(refs)
        refs += self._refs_total
        if len(usable):
            self._usable_total = int(usable[-1])
            self._refs_total = int(refs[-1])
        at_step = kind == EventKind.STEP
        self._at_steps.append(usable[at_step])
        self._refs_at_steps.append(refs[at_step])

    def _usable_changes(self, cols: Columns, ev: np.ndarray) -> np.ndarray:
        """Per block event ``ev``: the change of U it causes."""
        seq = cols["seq_id"][ev].astype(np.int64)
        self._grow(int(seq.max()) + 1)
        n = len(ev)
        # the events of each sequence together, in time order (stable sort by sequence)
        order = np.argsort(seq, kind="stable")
        seq_sorted = seq[order]
        delta = cols["num_blocks"][ev].astype(np.int64)
        delta = np.where(cols["kind"][ev] == EventKind.FREE, -delta, delta)[order]
        first = np.ones(n, dtype=bool)
        first[1:] = seq_sorted[1:] != seq_sorted[:-1]
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        # blocks held after each event: a cumulative sum per sequence from its carried count
        cs = np.cumsum(delta)
        group_start = np.flatnonzero(first)
        group_base = (cs - delta)[first] - self._held[seq_sorted[first]]
        cs -= np.repeat(group_base, np.diff(np.append(group_start, n)))
        final = self._final[seq_sorted]
        usable = np.minimum(cs * self.block_size, final)
        before = np.empty_like(usable)
        before[1:] = usable[:-1]
        first_seqs = seq_sorted[first]
        before[first] = np.minimum(self._held[first_seqs] * self.block_size, final[first])
        self._held[seq_sorted[last]] = cs[last]
        out = np.empty(n, dtype=np.int64)
        out[order] = usable - before
        return out

    def restore_compiled(self, state: dict[str, np.ndarray]) -> None:
        """Take what the compiled core computed from the whole run's events instead of
        ``consume`` (engine/compiled/csrc/usage.hpp, the same sums): ``V1Core.usage_state()``,
        U and the held references at every STEP event."""
        self._at_steps = [np.asarray(state["usable_at_steps"], dtype=np.int64)]
        self._refs_at_steps = [np.asarray(state["refs_at_steps"], dtype=np.int64)]

    def usable_at_steps(self, num_steps: int) -> np.ndarray:
        """U at each of the first ``num_steps`` STEP events."""
        if not self._at_steps:
            return np.zeros(0, dtype=np.int64)[:num_steps]
        if len(self._at_steps) > 1:
            self._at_steps = [np.concatenate(self._at_steps)]
        return self._at_steps[0][:num_steps]

    def refs_at_steps(self, num_steps: int) -> np.ndarray:
        """Σ over sequences of the blocks each holds (blocks shared by k sequences count k
        times) at each of the first ``num_steps`` STEP events."""
        if not self._refs_at_steps:
            return np.zeros(0, dtype=np.int64)
        if len(self._refs_at_steps) > 1:
            self._refs_at_steps = [np.concatenate(self._refs_at_steps)]
        return self._refs_at_steps[0][:num_steps]


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
    steps: Table,
    result: SimResult,
    allocator: str,
    max_model_len: int | None,
    paged_usage: PagedUsageTracker | None = None,
    *,
    v1: bool = False,
) -> Table:
    """Add ``reserved_slots``, ``internal_frag_slots``, ``external_frag_slots`` and
    ``free_slots`` to ``steps`` (in place; also returned). With ``filled_slots`` they sum to
    the pool's slots at every step.

    ``paged_usage``: a tracker that consumed every chunk of the run as it was recorded (the
    recorder then need not keep block events); without it, paged runs replay the kept events.

    ``v1`` (the v1 scheduler's pool, where a prefix hit shares blocks): a block held by
    several sequences counts once, so ``filled_slots`` becomes the slots of distinct held
    blocks holding K/V, and ``cached_slots`` is added: free blocks that keep their
    prefix-cache key (as the simulation measured them, ``result.step_cached_free_blocks``;
    else a replay of the kept events), which ``free_slots`` then leaves out.
    """
    n = len(steps)
    total = result.num_blocks * result.block_size
    if allocator == "paged":
        if paged_usage is None:
            paged_usage = PagedUsageTracker(
                result.block_size, lambda s: final_length(result.requests[s], max_model_len)
            )
            paged_usage.consume(result.recorder.columns()[0])
        usable = paged_usage.usable_at_steps(n)
        external = np.zeros(n, dtype=np.int64)
    elif allocator in POLICIES:
        cols, block_ids = result.recorder.columns()
        t = np.array([final_length(r, max_model_len) for r in result.requests], dtype=np.int64)
        sizes = region_sizes(result, allocator, max_model_len)
        change = _usable_contiguous(cols, t, sizes)
        external = _external_contiguous(cols, block_ids, sizes, total)[:n]
        at = _step_event_index(cols["kind"], n)
        usable = np.cumsum(change)[at] if n else np.zeros(0, dtype=np.int64)
    else:
        raise ValueError(f"unknown allocator {allocator!r}")
    if len(usable) != n:
        raise ValueError(f"KV usage known for {len(usable)} of {n} steps: events were lost")
    allocated = steps["allocated_slots"]
    filled = steps["filled_slots"]
    cached = np.zeros(n, dtype=np.int64)
    if v1 and paged_usage is not None:
        # Each extra reference to a shared block was counted in the U and the filled tokens
        # of every sequence holding it; a shared block is full (only full blocks are cached).
        held = result.num_blocks - steps["free_blocks"]
        extra = (paged_usage.refs_at_steps(n) - held) * result.block_size
        usable = usable - extra
        filled = filled - extra
        steps["filled_slots"] = filled
        if result.step_cached_free_blocks is not None:
            cached_blocks = result.step_cached_free_blocks[:n]
        else:
            block_states = BlockStateTracker(result.num_blocks)
            block_states.consume(*result.recorder.columns())
            cached_blocks = block_states.cached_blocks_at_steps(n)
        steps.insert_after("free_blocks", "cached_blocks", cached_blocks)
        cached = cached_blocks * result.block_size
    steps["reserved_slots"] = usable - filled
    steps["internal_frag_slots"] = allocated - usable
    steps["external_frag_slots"] = external
    if v1:
        steps["cached_slots"] = cached
    steps["free_slots"] = total - allocated - external - cached
    return steps


def breakdown_means(
    steps: TableLike, total_slots: int, weights: np.ndarray | None = None
) -> dict[str, Any]:
    """Time-averaged shares of all slots (weights: step durations, or ``weights``, e.g. cut
    at ``--until``); they sum to 1. A v1 run's steps (with ``cached_slots``) add
    ``kv_cached_share_mean`` before ``kv_free_share_mean``."""
    w = column(steps, "duration_s") if weights is None else np.asarray(weights)
    busy = float(w.sum())
    out: dict[str, Any] = {}
    pairs = list(zip(SUMMARY_FIELDS, COLUMNS))
    if CACHED_COLUMN in steps:
        pairs.insert(len(pairs) - 1, (CACHED_FIELD, CACHED_COLUMN))
    for field, name in pairs:
        if name not in steps or busy <= 0 or total_slots <= 0:
            out[field] = 0.0 if name in steps else None
            continue
        out[field] = float((column(steps, name) * w).sum() / (busy * total_slots))
    return out
