"""events.parquet: one row per (event, block), written at once or streamed in chunks.

A long run has far more block rows than fit in memory (a million requests make a few hundred
million), so the CLI streams the recorder's packed chunks straight into the Parquet file while
the simulation runs and keeps only the kinds the metrics need (``METRIC_KINDS``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine import EventKind
from engine.compiled import load
from engine.core.events import EVENT_COLUMNS, EVENT_DTYPES, Columns, EventRecorder
from kvsim.analysis.events_encoding import SINK_BUFFER_BYTES, parquet_options
from kvsim.analysis.exploded_rows import (
    EVENT_KIND_NAMES,
    EXPLODED_DTYPES,
    HASHED_KINDS,
    arrow_table,
    exploded_columns,
    exploded_columns_numpy,
    exploded_frame,
    exploded_table,
    hashed_events,
    num_hashed_blocks,
)
from kvsim.errors import KvsimError

KeyedChunkCallback = Callable[[Columns, np.ndarray, np.ndarray], None]
# What requests_frame, summarize and the run plots read from the in-memory stream (RESUME,
# PREFIX_HIT: a v1 run's prefix-cache metrics).
METRIC_KINDS = (
    EventKind.ARRIVE,
    EventKind.ADMIT,
    EventKind.RESUME,
    EventKind.PREFIX_HIT,
    EventKind.PREEMPT,
    EventKind.FINISH,
    EventKind.ABORT,
    EventKind.REJECT,
    EventKind.OFFLOAD_LOAD,  # a load's lookup counts at its step (kvsim/analysis/prefix_metrics.py)
    EventKind.FIRST_TOKEN,
)


class EventsWriteError(KvsimError, RuntimeError):
    """Writing events.parquet failed (the cause is chained)."""


# Rows per row group of events.parquet: about 12 MB of exploded rows held before a write.
ROW_GROUP_ROWS = 1 << 18
# Chunks waiting for the writer thread, in bytes: the whole Azure conversation trace's 20
# chunks hold ~90 MB. With room for two chunks only, the simulation waited for the writer
# whenever it was two chunks ahead (0.4-0.6 s of a loaded run); with room, the simulation
# ends first and `kvsim run` writes the rest of its folder while the writer drains
# (``RunResult.finish_events``).
MAX_PENDING_BYTES = 64 << 20
# Above this many rows the pictures do not read events.parquet back whole: the occupancy map
# samples its blocks and the Gantt chart reads its requests' rows (kvsim/plots/large_runs.py).
MAX_PLOTTED_EVENT_ROWS = 5_000_000


class EventsParquetWriter:
    """Receives the recorder's chunks (``EventRecorder(on_chunk=writer.write_chunk)``) and
    appends them to one Parquet file, in order, in row groups of exactly ``ROW_GROUP_ROWS``
    rows (the last one shorter): how the engine happened to batch its events (the Python or
    the compiled path, chunk sizes) never shows in the file, so equal runs write equal bytes.
    (A fleet's chunks, ``replica_column``, come from several replicas in the order they were
    handed over: each replica's rows in order, the replicas' interleaved by chunk.)

    The exploding and Parquet encoding run on a background thread (pyarrow encodes without
    the GIL), so on a machine with a spare core the simulation does not wait for them; at
    most ``max_pending`` chunks of at most ``max_pending_bytes`` between them (one chunk
    may be larger alone) wait in between, which bounds memory. A failure on that thread is
    raised by the next ``write_chunk`` or by ``close``, never dropped."""

    def __init__(
        self,
        path: Path,
        max_pending: int = 64,
        *,
        block_hashes: bool = False,
        replica_column: bool = False,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        """With ``block_hashes`` every chunk comes with its CACHE / EVICT blocks' keys, and
        the file has a ``block_hash`` column (a v1 run with prefix caching). With
        ``replica_column`` every chunk comes with the replica that recorded it (a fleet's
        ``--fleet-events all``), the file's last column."""
        self.path = Path(path)
        self.block_hashes = block_hashes
        self.replica_column = replica_column
        self._writer: pq.ParquetWriter | None = None
        # The file, opened here (not by the ParquetWriter) so that close() closes it whatever
        # fails: a writer left to the garbage collector after a failed write kept its file,
        # and a full disk's mount, busy (kvsim run's folder is written while it drains).
        # The writer writes to a buffer over it (SINK_BUFFER_BYTES), which close() flushes.
        self._file: pa.NativeFile | None = None
        self._sink: pa.NativeFile | None = None
        self.num_rows = 0
        # The next row group, filled chunk by chunk: ROW_GROUP_ROWS rows per column, made
        # once and reused (see _write), of which the first _num_held are rows not yet written.
        self._group: dict[str, np.ndarray] | None = None
        self._num_held = 0
        # (columns, block ids, block keys, replica, bytes) per chunk
        self._pending: queue.Queue[
            tuple[Columns, np.ndarray, np.ndarray | None, int | None, int] | None
        ] = queue.Queue(max_pending)
        self._max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0  # of the chunks queued and not yet written
        self._room = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._drain, name="kvsim-events-parquet", daemon=True
        )
        self._thread.start()

    def write_chunk(
        self,
        cols: Columns,
        block_ids: np.ndarray,
        block_hashes: np.ndarray | None = None,
        replica: int | None = None,
    ) -> None:
        self._raise_if_failed()
        size = sum(c.nbytes for c in cols.values()) + block_ids.nbytes
        size += 0 if block_hashes is None else block_hashes.nbytes
        with self._room:
            while self._pending_bytes and self._pending_bytes + size > self._max_pending_bytes:
                self._room.wait()
            self._pending_bytes += size
        # the recorder never changes a chunk it handed out
        self._pending.put((cols, block_ids, block_hashes, replica, size))

    def _drain(self) -> None:
        while (item := self._pending.get()) is not None:
            cols, block_ids, block_hashes, replica, size = item
            if self._error is None:
                try:
                    self._write(cols, block_ids, block_hashes, replica)
                except BaseException as error:  # re-raised on the caller's thread
                    self._error = error
            with self._room:
                self._pending_bytes -= size
                self._room.notify()

    def _write(
        self,
        cols: Columns,
        block_ids: np.ndarray,
        hashes: np.ndarray | None,
        replica: int | None = None,
    ) -> None:
        if self.block_hashes != (hashes is not None):
            raise ValueError("block keys must come with every chunk, or with none")
        if self.replica_column != (replica is not None):
            raise ValueError("a replica must come with every chunk, or with none")
        if self._writer is None:
            self._group = {n: np.empty(ROW_GROUP_ROWS, d) for n, d in EXPLODED_DTYPES.items()}
            if hashes is not None:
                self._group["block_hash"] = np.empty(ROW_GROUP_ROWS, np.int64)
            if replica is not None:  # the last column (ExplodeCursor.fill leaves it alone)
                self._group["replica"] = np.empty(ROW_GROUP_ROWS, np.int32)
            schema = arrow_table({n: c[:0] for n, c in self._group.items()}).schema
            self._file = pa.OSFile(str(self.path), "wb")
            self._sink = pa.BufferedOutputStream(self._file, SINK_BUFFER_BYTES)
            self._writer = pq.ParquetWriter(self._sink, schema, **parquet_options(schema.names))
        # The rows go into the one row-group buffer, written whenever it is full (one
        # contiguous array per column: the pages, and so the bytes, do not depend on the
        # chunking). Concatenating each group's chunks in fresh Arrow memory instead
        # (combine_chunks) made the kernel fault in and zero ~370 MB of new pages for the
        # whole Azure conversation trace: the writer thread's CPU 0.83 -> 0.66 s.
        group = self._group
        assert group is not None  # made with the writer
        core = load()
        if core is not None:
            # the compiled core explodes straight into the buffer (no rows copied twice)
            cursor = core.ExplodeCursor(cols, block_ids, hashes)
            while not cursor.done:
                start = self._num_held
                self._num_held += cursor.fill(group, start)
                if replica is not None:
                    group["replica"][start : self._num_held] = replica
                if self._num_held == ROW_GROUP_ROWS:
                    self._write_held()
            self.num_rows += cursor.rows
            return
        columns = exploded_columns_numpy(cols, block_ids, hashes)
        num_rows = len(columns["step"])
        start = 0
        while start < num_rows:
            take = min(num_rows - start, ROW_GROUP_ROWS - self._num_held)
            for name, column in columns.items():
                group[name][self._num_held : self._num_held + take] = column[start : start + take]
            if replica is not None:
                group["replica"][self._num_held : self._num_held + take] = replica
            self._num_held += take
            start += take
            if self._num_held == ROW_GROUP_ROWS:
                self._write_held()
        self.num_rows += num_rows

    def _write_held(self) -> None:
        """Write the rows held as one row group (the writer is done with the buffer when
        write_table returns: it encodes the rows into pages it owns)."""
        if self._num_held and self._writer is not None and self._group is not None:
            table = arrow_table({n: c[: self._num_held] for n, c in self._group.items()})
            self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self._num_held = 0

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise EventsWriteError(f"{self.path}: writing events failed: {self._error}") from (
                self._error
            )

    def close(self) -> None:
        """Write what is pending and finish the file (an empty run still gets a valid, empty
        events.parquet). Raises ``EventsWriteError`` if any write failed."""
        if self._thread.is_alive():
            self._pending.put(None)
            self._thread.join()
        if self._error is None:
            try:
                self._write_held()
            except BaseException as error:  # reported below, as the thread's errors are
                self._error = error
        writer, self._writer = self._writer, None
        try:
            if self._error is not None and writer is not None:
                with contextlib.suppress(Exception):  # the write error below is what matters
                    writer.close()
            self._raise_if_failed()
            if writer is None:
                empty = {n: np.empty(0, dtype=d) for n, d in zip(EVENT_COLUMNS, EVENT_DTYPES)}
                none = np.empty(0, dtype=np.int64)
                columns = exploded_columns(empty, none, none if self.block_hashes else None)
                if self.replica_column:
                    columns["replica"] = np.empty(0, dtype=np.int32)
                table = arrow_table(columns)
                pq.write_table(table, self.path, **parquet_options(table.column_names))
                return
            writer.close()
            if self._sink is not None:
                self._sink.close()  # writes the buffer's tail: a full disk may raise here
        finally:
            # the buffer does not close its file when its last write fails
            for stream in (self._sink, self._file):
                if stream is not None:
                    with contextlib.suppress(Exception):  # a write error is raised already
                        stream.close()
            self._sink = self._file = None


class KeyedChunks:
    """An ``on_chunk`` callback that hands ``write`` each chunk with its CACHE / EVICT
    blocks' keys, taken from ``recorder`` (which must keep them): a chunk waits until its
    keys have been recorded (a chunk ending in a CACHE event is packed before its keys
    arrive). Call ``close`` once the recorder is flushed."""

    def __init__(self, recorder: EventRecorder, write: KeyedChunkCallback) -> None:
        self._recorder = recorder
        self._write = write
        self._pending: list[tuple[Columns, np.ndarray, int]] = []

    def __call__(self, cols: Columns, block_ids: np.ndarray) -> None:
        self._pending.append((cols, block_ids, num_hashed_blocks(cols)))
        self._drain()

    def _drain(self) -> None:
        recorder = self._recorder
        while self._pending and recorder.num_block_hashes >= self._pending[0][2]:
            cols, block_ids, need = self._pending.pop(0)
            self._write(cols, block_ids, recorder.pop_block_hashes(need))

    def close(self) -> None:
        """Write what waits; raises if keys are missing (the recorder kept none)."""
        self._drain()
        if self._pending:
            need = sum(p[2] for p in self._pending)
            raise ValueError(f"{need} CACHE/EVICT block keys were never recorded")


__all__ = [
    "EVENT_KIND_NAMES",
    "EXPLODED_DTYPES",
    "HASHED_KINDS",
    "MAX_PENDING_BYTES",
    "MAX_PLOTTED_EVENT_ROWS",
    "METRIC_KINDS",
    "ROW_GROUP_ROWS",
    "EventsParquetWriter",
    "EventsWriteError",
    "KeyedChunkCallback",
    "KeyedChunks",
    "arrow_table",
    "exploded_columns_numpy",
    "exploded_frame",
    "exploded_table",
    "hashed_events",
    "num_hashed_blocks",
]
