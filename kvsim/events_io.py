"""events.parquet: one row per (event, block), written at once or streamed in chunks.

A long run has far more block rows than fit in memory (a million requests make a few hundred
million), so the CLI streams the recorder's packed chunks straight into the Parquet file while
the simulation runs and keeps only the kinds the metrics need (``METRIC_KINDS``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine import EventKind
from engine.events import EVENT_COLUMNS, EVENT_DTYPES, Columns

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


def exploded_frame(cols: Columns, block_ids: np.ndarray) -> pd.DataFrame:
    """Event columns as rows per (event, block); events without blocks get block_id -1."""
    counts = cols["num_blocks"]
    rows = np.maximum(counts, 1)
    expanded_blocks = np.full(int(rows.sum()), -1, dtype=np.int64)
    # Rows of events that carry blocks take their ids in order; the rest keep -1.
    expanded_blocks[np.repeat(counts > 0, rows)] = block_ids

    def column(name: str) -> np.ndarray:
        return np.repeat(cols[name].astype(np.int64, copy=False), rows)

    return pd.DataFrame(
        {
            "time_s": np.repeat(cols["time_s"], rows),
            "step": column("step"),
            "kind": pd.Categorical.from_codes(np.repeat(cols["kind"], rows), EVENT_KIND_NAMES),
            "seq_id": column("seq_id"),
            "block_id": expanded_blocks,
            "free_blocks": column("free_blocks"),
            "num_tokens": column("num_tokens"),
        }
    )


class EventsParquetWriter:
    """Receives the recorder's chunks (``EventRecorder(on_chunk=writer.write_chunk)``) and
    appends them to one Parquet file, a row group per chunk."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._writer: pq.ParquetWriter | None = None
        self.num_rows = 0

    def write_chunk(self, cols: Columns, block_ids: np.ndarray) -> None:
        table = pa.Table.from_pandas(exploded_frame(cols, block_ids), preserve_index=False)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema, compression="zstd")
        self._writer.write_table(table)
        self.num_rows += table.num_rows

    def close(self) -> None:
        """Finish the file (an empty run still gets a valid, empty events.parquet)."""
        if self._writer is None:
            empty = {n: np.empty(0, dtype=d) for n, d in zip(EVENT_COLUMNS, EVENT_DTYPES)}
            frame = exploded_frame(empty, np.empty(0, dtype=np.int64))
            frame.to_parquet(self.path, index=False, compression="zstd")
            return
        self._writer.close()
        self._writer = None
