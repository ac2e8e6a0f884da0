"""The engine's event stream: every arrival, allocation, free, preemption and step.

The engine does not know time. An ``EventRecorder`` is given a clock callable (the simulator
passes ``lambda: env.now``) and stamps each event with it. Recording appends to typed column
arrays, not one object per event, so a million-step run stays cheap; with no sink attached the
engine pays one ``is None`` check per event site. The kinds live in engine/core/event_kinds.py, the
packed rows and their expansion in engine/core/event_rows.py, the protocol the engine records to
(EventSink) in engine/core/event_sink.py; this module re-exports their public names.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from collections.abc import Sequence as BlockIds

import numpy as np

from engine.core.event_kinds import NO_SEQ, EventKind, StepKind
from engine.core.event_rows import (
    _APPEND_RUN,
    _BLOCK_RUN,
    _DECODE,
    _DECODE_STEP,
    _ROW,
    _STEP,
    EVENT_COLUMNS,
    EVENT_DTYPES,
    STEP_COLUMNS,
    STEP_DTYPES,
    BlockRunColumns,
    ChunkCallback,
    Columns,
    empty_columns,
    event_records,
    merge_chunks,
)
from engine.core.event_sink import EventSink

__all__ = [
    "EVENT_COLUMNS",
    "EVENT_DTYPES",
    "NO_SEQ",
    "STEP_COLUMNS",
    "STEP_DTYPES",
    "ChunkCallback",
    "Columns",
    "EventKind",
    "EventRecorder",
    "EventSink",
    "StepKind",
]


def _zero_clock() -> float:
    return 0.0


class EventRecorder:
    """An ``EventSink`` that keeps events as compact columns.

    Recording packs one struct per row into a bytearray (a row is an event, or a run of
    APPEND_BLOCK events, or a whole plain decode step); every ``chunk_size`` rows (or
    ``chunk_size`` appends in runs) they are viewed as a record array, expanded into events
    and copied into numpy columns, so memory stays near 40 bytes per event plus 8 per block
    id. Pass ``on_chunk`` to receive each packed chunk (event columns and its flat block ids;
    the recorder never changes them afterwards), e.g. to stream it to disk, and
    ``keep_kinds`` to keep only the kinds you still need in memory.

    Event ``i`` carries ``num_blocks[i]`` block ids; they follow each other in ``block_ids``
    in event order.
    """

    def __init__(
        self,
        clock: Callable[[], float] = _zero_clock,
        chunk_size: int = 1 << 16,
        on_chunk: ChunkCallback | None = None,
        keep_kinds: Iterable[EventKind] | None = None,
        keep_block_ids: bool = True,
        keep_block_hashes: bool = False,
        prefix_cache_events: bool = True,
    ) -> None:
        """``on_chunk`` receives every packed chunk; the recorder itself keeps the events of
        ``keep_kinds`` only (all kinds when None) and, without ``keep_block_ids``, only each
        event's first block id (column ``first_block``, -1 for none), so a streamed run stays
        small in memory. With ``keep_block_hashes`` it keeps the keys of every CACHE and
        EVICT event's blocks (``block_hashes()``), for a KV-event export; without
        ``prefix_cache_events`` the engine sends no CACHE, EVICT or CACHE_RESET events."""
        self.clock = clock
        self.step = 0
        self.chunk_size = chunk_size
        self.on_chunk = on_chunk
        self.keep_kinds = None if keep_kinds is None else np.array(sorted(keep_kinds))
        # keep_kinds as a lookup table by kind code: one gather per chunk instead of np.isin's
        # sort-based search (a tenth of a whole-trace run's chunk delivery)
        self._keep_table: np.ndarray | None = None
        if keep_kinds is not None:
            self._keep_table = np.zeros(256, dtype=bool)
            self._keep_table[[int(k) for k in keep_kinds]] = True
        self.keep_block_ids = keep_block_ids
        self.keep_block_hashes = keep_block_hashes
        self.prefix_cache_events = prefix_cache_events
        self._block_hashes = array("q")
        self._rows = bytearray()  # packed _ROW structs
        self._rows_limit = chunk_size * _ROW.size
        self._pack_row = _ROW.pack
        self._block_ids: list[int] = []  # a list: extending it from a block table is a memcpy
        self._run_seq_ids: list[int] = []  # the sequences of the APPEND runs in _rows
        self._num_runs = 0  # APPEND run rows in _rows
        self._block_run = BlockRunColumns()  # the events of the block runs in _rows
        self._num_block_runs = 0
        self._chunks: list[tuple[Columns, np.ndarray]] = []
        self._dropped = False  # drop_kept() was called
        self._num_packed = 0
        # Per STEP row in _rows, what its event row does not carry (its other step columns
        # are read off the event row when packing): one row per step, not two.
        self._step_kinds = array("b")
        self._step_num_seqs = array("q")
        self._step_chunks: list[Columns] = []

    def __len__(self) -> int:
        """Events recorded so far (an APPEND run counts as its events)."""
        num_rows = len(self._rows) // _ROW.size
        num_expanded = len(self._run_seq_ids) - self._num_runs
        num_expanded += len(self._block_run) - self._num_block_runs
        return self._num_packed + num_rows + num_expanded

    def begin_step(self, step: int) -> None:
        self.step = step

    def record(
        self,
        kind: EventKind,
        seq_id: int,
        free_blocks: int,
        block_ids: BlockIds[int] = (),
        num_tokens: int = 0,
    ) -> None:
        rows = self._rows
        rows += self._pack_row(
            self.clock(), self.step, kind, seq_id, free_blocks, num_tokens, len(block_ids)
        )
        if block_ids:
            self._block_ids.extend(block_ids)
        if len(rows) >= self._rows_limit:
            self._pack()

    def record_step(
        self, kind: StepKind, num_seqs: int, num_batched_tokens: int, free_blocks: int
    ) -> None:
        rows = self._rows
        rows += self._pack_row(
            self.clock(), self.step, _STEP, NO_SEQ, free_blocks, num_batched_tokens, 0
        )
        self._step_kinds.append(kind)
        self._step_num_seqs.append(num_seqs)
        if len(rows) >= self._rows_limit:
            self._pack()

    def record_appends(self, seq_ids: list[int], block_ids: list[int], free_blocks: int) -> None:
        # One row for the whole run, expanded when packing: a decode step at a small block
        # size appends a block for most of the batch.
        rows = self._rows
        rows += self._pack_row(
            self.clock(), self.step, _APPEND_RUN, len(seq_ids), free_blocks, 1, 1
        )
        self._run_seq_ids.extend(seq_ids)
        self._num_runs += 1
        self._block_ids.extend(block_ids)
        # a chunk holds at most chunk_size rows and chunk_size appends they stand for
        if len(rows) >= self._rows_limit or len(self._run_seq_ids) >= self.chunk_size:
            self._pack()

    def record_decode_step(
        self, step: int, num_seqs: int, free_blocks: int, seq_ids: list[int], block_ids: list[int]
    ) -> None:
        # One row for the whole step (the plain decode steps of multi-step decoding), expanded
        # when packing: three sink calls per step were a tenth of the simulator's loop.
        self.step = step
        rows = self._rows
        num_appends = len(seq_ids)
        rows += self._pack_row(
            self.clock(), step, _DECODE_STEP, num_appends, free_blocks, num_seqs, num_appends
        )
        if num_appends:
            self._run_seq_ids.extend(seq_ids)
            self._block_ids.extend(block_ids)
        self._step_kinds.append(_DECODE)
        self._step_num_seqs.append(num_seqs)
        if len(rows) >= self._rows_limit or len(self._run_seq_ids) >= self.chunk_size:
            self._pack()

    def record_block_events(
        self, kinds: list[int], seq_ids: list[int], block_ids: list[int], num_tokens: list[int],
        free_blocks: int,
    ) -> None:  # fmt: skip
        rows = self._rows
        rows += self._pack_row(
            self.clock(), self.step, _BLOCK_RUN, len(kinds), free_blocks, 0, len(kinds)
        )
        run = self._block_run
        run.kinds.fromlist(kinds)
        run.seq_ids.fromlist(seq_ids)
        run.num_tokens.fromlist(num_tokens)
        self._num_block_runs += 1
        self._block_ids.extend(block_ids)
        if len(rows) >= self._rows_limit or len(run) >= self.chunk_size:
            self._pack()

    def record_hashes(self, block_hashes: BlockIds[int] | np.ndarray) -> None:
        if self.keep_block_hashes:
            cls = block_hashes.__class__
            if cls is list:
                # fromlist: half extend's time from a list (4.8 against 9.6 us for 64 keys)
                self._block_hashes.fromlist(block_hashes)  # type: ignore[arg-type]
            elif cls is np.ndarray:
                # an admission's keys as made (int64): 0.7 us against 6 us through a list
                keys = block_hashes.astype(np.int64, copy=False)  # type: ignore[union-attr]
                self._block_hashes.frombytes(keys.tobytes())
            else:
                self._block_hashes.extend(block_hashes)

    def block_hashes(self) -> np.ndarray:
        """int64 keys of the blocks of every CACHE and EVICT event, in event order (each
        event's ``num_blocks`` of them); empty unless ``keep_block_hashes``."""
        return np.array(self._block_hashes, dtype=np.int64)

    @property
    def num_block_hashes(self) -> int:
        """Keys kept so far and not popped. A CACHE or EVICT event's keys come right after
        it, so a chunk that ends with one is packed before its keys arrive."""
        return len(self._block_hashes)

    def pop_block_hashes(self, count: int) -> np.ndarray:
        """The first ``count`` kept keys (``block_hashes()``), dropped from the recorder: a
        consumer of each packed chunk takes its CACHE and EVICT blocks' keys (recorded by
        the next chunk is packed, or the recorder flushed) so they need not stay in memory."""
        taken = np.array(self._block_hashes[:count], dtype=np.int64)
        del self._block_hashes[:count]
        return taken

    def _pack(self) -> None:
        if self._rows:
            block_run = self._block_run if self._num_block_runs else None
            records = event_records(self._rows, self._run_seq_ids, block_run)
            chunk = {n: records[n].copy() for n in EVENT_COLUMNS}
        else:
            chunk = empty_columns(EVENT_COLUMNS, EVENT_DTYPES)
        block_ids = np.fromiter(self._block_ids, dtype=np.int64, count=len(self._block_ids))
        self._num_packed += len(chunk["kind"])
        self._rows = bytearray()
        self._block_ids = []
        self._run_seq_ids = []
        self._num_runs = 0
        if self._num_block_runs:
            self._block_run = BlockRunColumns()
            self._num_block_runs = 0
        if self._step_kinds:
            is_step = chunk["kind"] == _STEP
            self._step_chunks.append(
                {
                    "time_s": chunk["time_s"][is_step],
                    "step": chunk["step"][is_step].astype(np.int64),
                    "kind": np.frombuffer(self._step_kinds, dtype=np.int8).copy(),
                    "num_seqs": np.frombuffer(self._step_num_seqs, dtype=np.int64).copy(),
                    "num_batched_tokens": chunk["num_tokens"][is_step].astype(np.int64),
                    "free_blocks": chunk["free_blocks"][is_step].astype(np.int64),
                }
            )
            self._step_kinds = array("b")
            self._step_num_seqs = array("q")
        self._deliver(chunk, block_ids)

    def add_chunk(
        self, chunk: Columns, block_ids: np.ndarray, steps: Columns, block_hashes: np.ndarray
    ) -> None:
        """Take events recorded elsewhere (the compiled core's buffer, engine/compiled) as if
        they had been recorded here, after everything recorded so far: ``chunk``'s columns
        (``EVENT_COLUMNS``), their flat block ids, the rows of their STEP events
        (``STEP_COLUMNS``) and the keys of their CACHE / EVICT blocks. They are handed to
        ``on_chunk`` and kept as a chunk of their own."""
        self.flush()
        if self.keep_block_hashes and len(block_hashes):
            self._block_hashes.frombytes(block_hashes.astype(np.int64, copy=False).tobytes())
        chunk = {
            n: np.ascontiguousarray(chunk[n], dtype=d) for n, d in zip(EVENT_COLUMNS, EVENT_DTYPES)
        }
        self._num_packed += len(chunk["kind"])
        if len(steps["kind"]):
            self._step_chunks.append(
                {n: np.asarray(steps[n], dtype=d) for n, d in zip(STEP_COLUMNS, STEP_DTYPES)}
            )
        # the core's int32 ids go to ``on_chunk`` as they are (the events writer explodes
        # int32 ids: an int64 copy here and an int32 one there were ~5% of its thread);
        # what the recorder keeps of them is int64, as a recorded chunk's
        self._deliver(chunk, np.ascontiguousarray(block_ids))

    def _deliver(self, chunk: Columns, block_ids: np.ndarray) -> None:
        """Hand a packed chunk to ``on_chunk`` and keep what the recorder keeps of it."""
        if self.on_chunk is not None:
            self.on_chunk(chunk, block_ids)
        keep = None if self._keep_table is None else self._keep_table[chunk["kind"].view(np.uint8)]
        # the kept events' positions, found once for every column, and first blocks for
        # them alone (a streamed run keeps ~1 in 10 of its events): the whole Azure
        # conversation trace's 20 chunks 42 -> 17.5 ms (medians of 9, interleaved)
        kept = None if keep is None else np.flatnonzero(keep)
        if not self.keep_block_ids:
            # each kept event's first block, read off the whole chunk's offsets: cheaper than
            # filtering every block id by kind first
            counts = chunk["num_blocks"]
            starts = np.cumsum(counts) - counts
            if kept is not None:
                counts, starts = counts[kept], starts[kept]
            first = np.full(len(counts), -1, dtype=np.int32)
            has = counts > 0
            first[has] = block_ids[starts[has]]
            block_ids = np.empty(0, dtype=np.int64)  # not a view: it would pin the chunk's ids
        elif keep is not None and len(block_ids):
            block_ids = block_ids[np.repeat(keep, chunk["num_blocks"])].astype(np.int64)
        else:
            block_ids = block_ids.astype(np.int64, copy=False)
        if kept is not None:
            chunk = {n: c[kept] for n, c in chunk.items()}
        if not self.keep_block_ids:
            chunk = {**chunk, "first_block": first}  # a new dict: on_chunk may hold the old
        self._chunks.append((chunk, block_ids))

    def flush(self) -> None:
        """Pack the events recorded since the last chunk (hands them to ``on_chunk``)."""
        if self._rows:
            self._pack()

    def drop_kept(self) -> None:
        """Forget the kept events, for a caller done with them (a streamed run's metrics
        once computed: a million requests keep ~125 MB of them); ``columns()`` raises
        afterwards. The STEP rows (``step_columns``) stay."""
        self.flush()
        self._chunks = []
        self._dropped = True

    def columns(self) -> tuple[Columns, np.ndarray]:
        """Every kept event as columns (``EVENT_COLUMNS``, plus ``first_block`` without
        ``keep_block_ids``) and the flat block ids (empty without ``keep_block_ids``)."""
        if self._dropped:
            raise RuntimeError("the kept events were dropped (EventRecorder.drop_kept)")
        self.flush()
        if not self._chunks:
            empty = empty_columns(EVENT_COLUMNS, EVENT_DTYPES)
            if not self.keep_block_ids:
                empty["first_block"] = np.empty(0, dtype=np.int32)
            return empty, np.empty(0, dtype=np.int64)
        if len(self._chunks) > 1:
            self._chunks = [merge_chunks(self._chunks)]
        return self._chunks[0]

    def step_columns(self) -> Columns:
        """One row per STEP event (``STEP_COLUMNS``), whatever ``keep_kinds`` says."""
        self.flush()
        if not self._step_chunks:
            return empty_columns(STEP_COLUMNS, STEP_DTYPES)
        if len(self._step_chunks) == 1:  # merged already: no copy (2 M steps: 80 MB)
            return self._step_chunks[0]
        merged = {n: np.concatenate([c[n] for c in self._step_chunks]) for n in STEP_COLUMNS}
        self._step_chunks = [merged]
        return merged

    # --- conveniences for tests and notebooks (not for million-event runs) ---------------

    def kinds_of(self, seq_id: int) -> list[EventKind]:
        """The kinds of every event about ``seq_id``, in order."""
        cols, _ = self.columns()
        return [EventKind(k) for k in cols["kind"][cols["seq_id"] == seq_id]]

    def blocks_of(self, index: int) -> list[int]:
        """Block ids carried by event number ``index``."""
        cols, block_ids = self.columns()
        ends = np.cumsum(cols["num_blocks"])
        end = int(ends[index])
        return [int(b) for b in block_ids[end - int(cols["num_blocks"][index]) : end]]
