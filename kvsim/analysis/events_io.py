"""events.parquet: one row per (event, block), written at once or streamed in chunks.

A long run has far more block rows than fit in memory (a million requests make a few hundred
million), so the CLI streams the recorder's packed chunks straight into the Parquet file while
the simulation runs and keeps only the kinds the metrics need (``METRIC_KINDS``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine import EventKind
from engine.events import EVENT_COLUMNS, EVENT_DTYPES, Columns
from kvsim.errors import KvsimError

EVENT_KIND_NAMES = [k.name for k in EventKind]
# What requests_frame, summarize and the run plots read from the in-memory stream.
METRIC_KINDS = (
    EventKind.ARRIVE,
    EventKind.ADMIT,
    EventKind.PREEMPT,
    EventKind.FINISH,
    EventKind.ABORT,
    EventKind.REJECT,
)


def _exploded_columns(cols: Columns, block_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Event columns as rows per (event, block); events without blocks get block_id -1. The
    kind column holds the EventKind codes."""
    counts = cols["num_blocks"]
    rows = np.maximum(counts, 1)
    expanded_blocks = np.full(int(rows.sum()), -1, dtype=np.int64)
    # Rows of events that carry blocks take their ids in order; the rest keep -1.
    expanded_blocks[np.repeat(counts > 0, rows)] = block_ids

    def column(name: str) -> np.ndarray:
        return np.repeat(cols[name].astype(np.int64, copy=False), rows)

    return {
        "time_s": np.repeat(cols["time_s"], rows),
        "step": column("step"),
        "kind": np.repeat(cols["kind"].astype(np.int8, copy=False), rows),
        "seq_id": column("seq_id"),
        "block_id": expanded_blocks,
        "free_blocks": column("free_blocks"),
        "num_tokens": column("num_tokens"),
    }


def exploded_frame(cols: Columns, block_ids: np.ndarray) -> pd.DataFrame:
    """events.parquet's rows as a DataFrame (kind categorical, by name)."""
    columns = _exploded_columns(cols, block_ids)
    kind = pd.Categorical.from_codes(columns["kind"], EVENT_KIND_NAMES)
    return pd.DataFrame({**columns, "kind": kind})


_KIND_DICTIONARY = pa.array(EVENT_KIND_NAMES, type=pa.string())


def exploded_table(cols: Columns, block_ids: np.ndarray) -> pa.Table:
    """events.parquet's rows as an Arrow table, built straight from the numpy columns (no
    DataFrame in between: the writer thread then holds the GIL for a fraction of the time).
    Read back with pandas it equals ``exploded_frame``."""
    columns = _exploded_columns(cols, block_ids)
    return pa.table(
        {
            name: pa.DictionaryArray.from_arrays(pa.array(column), _KIND_DICTIONARY)
            if name == "kind"
            else pa.array(column)
            for name, column in columns.items()
        }
    )


class EventsWriteError(KvsimError, RuntimeError):
    """Writing events.parquet failed (the cause is chained)."""


class EventsParquetWriter:
    """Receives the recorder's chunks (``EventRecorder(on_chunk=writer.write_chunk)``) and
    appends them to one Parquet file, a row group per chunk, in order.

    The exploding and Parquet encoding run on a background thread (pyarrow encodes without
    the GIL), so on a machine with a spare core the simulation does not wait for them; at
    most ``max_pending`` chunks wait in between, which bounds memory. A failure on that
    thread is raised by the next ``write_chunk`` or by ``close``, never dropped."""

    def __init__(self, path: Path, max_pending: int = 2) -> None:
        self.path = Path(path)
        self._writer: pq.ParquetWriter | None = None
        self.num_rows = 0
        self._pending: queue.Queue[tuple[Columns, np.ndarray] | None] = queue.Queue(max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._drain, name="kvsim-events-parquet", daemon=True
        )
        self._thread.start()

    def write_chunk(self, cols: Columns, block_ids: np.ndarray) -> None:
        self._raise_if_failed()
        self._pending.put((cols, block_ids))  # the recorder never changes a chunk it handed out

    def _drain(self) -> None:
        while (item := self._pending.get()) is not None:
            if self._error is None:
                try:
                    self._write(*item)
                except BaseException as error:  # re-raised on the caller's thread
                    self._error = error

    def _write(self, cols: Columns, block_ids: np.ndarray) -> None:
        table = exploded_table(cols, block_ids)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema, compression="zstd")
        self._writer.write_table(table)
        self.num_rows += table.num_rows

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
        if self._error is not None and self._writer is not None:
            with contextlib.suppress(Exception):  # the write error below is what matters
                self._writer.close()  # release the file (a full disk keeps it open otherwise)
            self._writer = None
        self._raise_if_failed()
        if self._writer is None:
            empty = {n: np.empty(0, dtype=d) for n, d in zip(EVENT_COLUMNS, EVENT_DTYPES)}
            table = exploded_table(empty, np.empty(0, dtype=np.int64))
            pq.write_table(table, self.path, compression="zstd")
            return
        self._writer.close()
        self._writer = None
