"""EventSink: the protocol the BlockManager and Scheduler record events to.

engine/core/events.py's EventRecorder is the sink the simulator attaches (typed column arrays);
the compiled core's EventBuffer mirrors it. A sink receives events in the order the engine
makes them; none of its methods returns anything the engine reads.
"""

from __future__ import annotations

from collections.abc import Sequence as BlockIds
from typing import Protocol

import numpy as np

from engine.core.event_kinds import EventKind, StepKind

__all__ = ["EventSink"]


class EventSink(Protocol):
    """Where the BlockManager and Scheduler send events."""

    # Whether to send CACHE, EVICT and CACHE_RESET events (and their keys): one or two per
    # block under v1 prefix caching, which a consumer that only needs PREFIX_HIT may skip.
    prefix_cache_events: bool

    def begin_step(self, step: int) -> None:
        """Stamp the events that follow with scheduler step ``step``."""

    def record(
        self,
        kind: EventKind,
        seq_id: int,
        free_blocks: int,
        block_ids: BlockIds[int] = (),
        num_tokens: int = 0,
    ) -> None:
        """One event about a sequence; ``free_blocks`` is the count after the event."""

    def record_step(
        self, kind: StepKind, num_seqs: int, num_batched_tokens: int, free_blocks: int
    ) -> None:
        """One scheduled step; ``free_blocks`` is the count after scheduling it."""

    def record_appends(self, seq_ids: list[int], block_ids: list[int], free_blocks: int) -> None:
        """APPEND_BLOCK events, one per (sequence, block), in order; ``free_blocks`` is the
        count after the first of them (each later one has one fewer)."""

    def record_decode_step(
        self, step: int, num_seqs: int, free_blocks: int, seq_ids: list[int], block_ids: list[int]
    ) -> None:
        """A whole decode step that admits and preempts nothing, as ``begin_step(step)``,
        ``record_appends`` (sequence ``seq_ids[i]`` got block ``block_ids[i]``) and
        ``record_step`` of ``num_seqs`` sequences one token each would record it;
        ``free_blocks`` is the count after the step's appends."""

    def record_block_events(
        self, kinds: list[int], seq_ids: list[int], block_ids: list[int], num_tokens: list[int],
        free_blocks: int,
    ) -> None:  # fmt: skip
        """Single-block events of one scheduling pass, in order, as ``record`` and
        ``record_appends`` would record them one by one: APPEND_BLOCK (the sequence took the
        block from the free queue), EVICT (seq_id -1: the block the next APPEND_BLOCK takes
        lost its key) and CACHE (num_tokens: the block's table index). ``free_blocks`` is
        the count before the first; each APPEND_BLOCK takes one, and its EVICT records the
        count after that take. The keys of the EVICT and CACHE blocks follow in one
        ``record_hashes`` call."""

    def record_hashes(self, block_hashes: BlockIds[int] | np.ndarray) -> None:
        """The prefix-cache keys of the blocks of the CACHE or EVICT event just recorded,
        in order (signed 64-bit ints; a sequence of ints or an int64 array)."""
