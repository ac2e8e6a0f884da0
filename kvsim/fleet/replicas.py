"""A fleet's replicas: a one-replica simulation that tells the fleet when its requests finish
and hands its KV events to the router's index (kvsim/fleet/kv_index.py) as they happen.

Two kinds, as a one-replica run has: ``ReplicaSimulation`` steps the Python v1 scheduler
(its events reach the index through a ``KvEventTap`` recorder, one event at a time), and
``CompiledReplicaSimulation`` the compiled core (engine/compiled), whose events reach the
index each time the core hands control back (before it waits for a step that ends after the
next arrival), so before the fleet routes anything. A test holds
their routing decisions equal (tests/kvsim/fleet/test_kv_index.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.core.event_kinds import EventKind
from engine.core.event_rows import (
    EVENT_COLUMNS,
    EVENT_DTYPES,
    STEP_COLUMNS,
    STEP_DTYPES,
    empty_columns,
)
from kvsim.fleet.kv_index import REMOVED, RESET, STORED, KvEventIndex, KvEventTap
from kvsim.sim.compiled_v1 import CompiledV1Simulation
from kvsim.sim.simulation import Simulation

_OPS = {int(EventKind.CACHE): STORED, int(EventKind.EVICT): REMOVED}
_RESET_KIND = int(EventKind.CACHE_RESET)


class ReplicaSimulation(Simulation):
    """A replica on the Python scheduler (recording with a ``KvEventTap``)."""

    on_finish: Callable[[int, int], None] | None = None  # (replica, seq_id)
    replica: int = 0

    def _finish(self, seq_id: int) -> None:
        super()._finish(seq_id)
        if self.on_finish is not None:
            self.on_finish(self.replica, seq_id)

    def load(self) -> tuple[int, int, float]:
        """(waiting, running, share of KV blocks in use): what a replica publishes."""
        bm = self.block_manager
        usage = 1.0 - bm.get_num_free_blocks() / bm.num_blocks
        return self.scheduler.num_waiting, self.scheduler.num_running, usage

    def routing_state(self) -> tuple[int, int]:
        """(the last step begun, free blocks) now: what a ROUTE event to it records, as its
        ARRIVE would (events.parquet's step and free_blocks)."""
        return self.recorder.step, self.block_manager.get_num_free_blocks()

    def record_route(self, seq_id: int, step: int, free_blocks: int, cached_tokens: int) -> None:
        """A ROUTE event in this replica's stream, now (``--fleet-events all``); the recorder
        stamps its own step, ``step`` (routing_state's) for the compiled twin."""
        self.recorder.record(EventKind.ROUTE, seq_id, free_blocks, (), cached_tokens)

    def attach_index(self, index: KvEventIndex) -> None:
        """Send every KV event to ``index`` from now on."""
        recorder = self.recorder
        if not isinstance(recorder, KvEventTap):
            raise TypeError("a replica feeding a KV-event index records with KvEventTap")
        recorder.index, recorder.replica = index, self.replica


class CompiledReplicaSimulation(CompiledV1Simulation):
    """A replica on the compiled core. It makes no per-step output objects: a router that
    follows prefills (``Router.follows_prefills``) asks ``has_first_token`` instead."""

    on_finish: Callable[[int, int], None] | None = None
    replica: int = 0
    index: KvEventIndex | None = None

    def _finish(self, seq_id: int) -> None:
        super()._finish(seq_id)
        if self.on_finish is not None:
            self.on_finish(self.replica, seq_id)

    def load(self) -> tuple[int, int, float]:
        """(waiting, running, share of KV blocks in use), the core's."""
        core = self.core
        usage = 1.0 - core.get_num_free_blocks() / core.num_blocks
        return core.num_waiting, core.num_running, usage

    def routing_state(self) -> tuple[int, int]:
        """(the last step begun, free blocks) now, the core's (ReplicaSimulation's)."""
        return self.core.num_steps, self.core.get_num_free_blocks()

    def record_route(self, seq_id: int, step: int, free_blocks: int, cached_tokens: int) -> None:
        """A ROUTE event after the core's events so far (ReplicaSimulation's)."""
        self._take_events(1)
        row = (self.env.now, step, int(EventKind.ROUTE), seq_id, free_blocks, cached_tokens, 0)
        chunk = {n: np.array([v], dtype=d) for n, v, d in zip(EVENT_COLUMNS, row, EVENT_DTYPES)}
        none = np.empty(0, dtype=np.int64)
        self.recorder.add_chunk(chunk, none, empty_columns(STEP_COLUMNS, STEP_DTYPES), none)

    def has_first_token(self, seq_id: int) -> bool:
        """Whether request ``seq_id`` has sampled a token (or is gone) by the core's steps
        so far."""
        state = self.core.request(seq_id)
        return state is None or state["num_generated"] > 0

    def attach_index(self, index: KvEventIndex) -> None:
        """Send every KV event to ``index`` from now on (each time the core returns)."""
        self.index = index

    def _after_run(self) -> None:
        # What the fleet must know before it routes the next arrival: the requests that
        # finished in the steps run so far (a router counts what it routed and is not done)
        # and their KV events. The base loop would report them only after a pending step.
        self._finished(self.core.take_finished())
        index = self.index
        if index is None or self.core.num_events < 1:
            return
        columns, block_ids, block_hashes, steps = self.core.take_events()
        self.recorder.add_chunk(columns, block_ids, steps, block_hashes)
        publish_chunk(index, self.replica, columns, np.asarray(block_hashes, dtype=np.int64))


def publish_chunk(
    index: KvEventIndex, replica: int, columns: dict[str, np.ndarray], block_hashes: np.ndarray
) -> None:
    """A chunk of the core's events as KV events: each CACHE (BlockStored) and EVICT
    (BlockRemoved) with its blocks' keys (``block_hashes`` holds them in event order),
    each CACHE_RESET (AllBlocksCleared)."""
    kinds = np.asarray(columns["kind"])
    keyed = np.isin(kinds, list(_OPS))
    resets = kinds == _RESET_KIND
    if not keyed.any() and not resets.any():
        return
    times = np.asarray(columns["time_s"]).tolist()
    counts = np.asarray(columns["num_blocks"])
    ends = np.cumsum(np.where(keyed, counts, 0))
    keys = block_hashes.tolist()
    kind_list = kinds.tolist()
    for i in np.flatnonzero(keyed | resets).tolist():
        if kind_list[i] == _RESET_KIND:
            index.publish(times[i], replica, RESET, ())
        else:
            end = int(ends[i])
            index.publish(times[i], replica, _OPS[kind_list[i]], keys[end - int(counts[i]) : end])
