"""events.parquet's rows: the recorder's packed event columns exploded into one row per
(event, block), as numpy columns, a DataFrame or an Arrow table (kind by name), with the
CACHE / EVICT blocks' prefix-cache keys where a run keeps them. kvsim/analysis/events_io.py
writes them to the file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from engine import EventKind
from engine.compiled import load
from engine.core.events import Columns
from kvsim.analysis.table import dictionary_array, numeric_array

if TYPE_CHECKING:
    import pandas as pd

EVENT_KIND_NAMES = [k.name for k in EventKind]


# events.parquet's columns and their dtypes, in order (and block_hash, int64, where keyed).
EXPLODED_DTYPES = {
    "time_s": np.float64, "step": np.int64, "kind": np.int8, "seq_id": np.int64,
    "block_id": np.int64, "free_blocks": np.int64, "num_tokens": np.int64,
}  # fmt: skip

# Events whose blocks carry their prefix-cache keys (block_hash; engine/core/events.py).
HASHED_KINDS = (EventKind.CACHE, EventKind.EVICT)


def hashed_events(kind: np.ndarray) -> np.ndarray:
    """Which events (by their ``kind`` codes) are CACHE or EVICT: those whose blocks carry
    keys. (Two comparisons: np.isin took 1.6 ms per 65,536-event chunk, ~7x as long.)"""
    cache, evict = HASHED_KINDS
    return (kind == cache) | (kind == evict)  # type: ignore[no-any-return]


def num_hashed_blocks(cols: Columns) -> int:
    """Blocks of the CACHE and EVICT events in ``cols``: the keys they carry."""
    return int(cols["num_blocks"][hashed_events(cols["kind"])].sum())


def exploded_columns(
    cols: Columns, block_ids: np.ndarray, block_hashes: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Event columns as rows per (event, block): ``exploded_columns_numpy``, or its compiled
    twin (``engine.compiled._core.explode_events``, the same arrays; it runs without the GIL,
    so the writer thread does not hold up the simulation) where the extension is built."""
    core = load()
    if core is not None:
        exploded: dict[str, np.ndarray] = core.explode_events(cols, block_ids, block_hashes)
        return exploded
    return exploded_columns_numpy(cols, block_ids, block_hashes)


def exploded_columns_numpy(
    cols: Columns, block_ids: np.ndarray, block_hashes: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Event columns as rows per (event, block); events without blocks get block_id -1. The
    kind column holds the EventKind codes. With ``block_hashes`` (the keys of the CACHE and
    EVICT blocks, in order) a ``block_hash`` column holds them, 0 on every other row."""
    counts = cols["num_blocks"]
    rows = np.maximum(counts, 1)
    expanded_blocks = np.full(int(rows.sum()), -1, dtype=np.int64)
    # Rows of events that carry blocks take their ids in order; the rest keep -1.
    expanded_blocks[np.repeat(counts > 0, rows)] = block_ids

    def column(name: str) -> np.ndarray:
        return np.repeat(cols[name].astype(np.int64, copy=False), rows)

    out = {
        "time_s": np.repeat(cols["time_s"], rows),
        "step": column("step"),
        "kind": np.repeat(cols["kind"].astype(np.int8, copy=False), rows),
        "seq_id": column("seq_id"),
        "block_id": expanded_blocks,
        "free_blocks": column("free_blocks"),
        "num_tokens": column("num_tokens"),
    }
    if block_hashes is not None:
        # which events carry keys, decided per event and then repeated: np.isin on every
        # row took 45 ms of a 6.5M-row run's 450
        keyed = hashed_events(cols["kind"]) & (counts > 0)
        num_hashed = int(counts[keyed].sum())
        if num_hashed != len(block_hashes):
            raise ValueError(f"{len(block_hashes)} block keys for {num_hashed} CACHE/EVICT blocks")
        keys = np.zeros(len(expanded_blocks), dtype=np.int64)
        keys[np.repeat(keyed, rows)] = block_hashes
        out["block_hash"] = keys
    return out


def exploded_frame(
    cols: Columns, block_ids: np.ndarray, block_hashes: np.ndarray | None = None
) -> pd.DataFrame:
    """events.parquet's rows as a DataFrame (kind categorical, by name)."""
    import pandas as pd  # here: the run itself writes Arrow and needs no pandas

    columns = exploded_columns(cols, block_ids, block_hashes)
    kind = pd.Categorical.from_codes(columns["kind"], EVENT_KIND_NAMES)
    # copy=False: the frame takes the fresh columns as they are instead of stacking the int64
    # ones into one 2-D block (a copy of every row: the full Azure conversation trace's
    # 6.5M-row v1 events, 0.9 s -> 2 ms); nobody else holds them
    return pd.DataFrame({**columns, "kind": kind}, copy=False)


def exploded_table(
    cols: Columns, block_ids: np.ndarray, block_hashes: np.ndarray | None = None
) -> pa.Table:
    """events.parquet's rows as an Arrow table, built straight from the numpy columns (no
    DataFrame in between: the writer thread then holds the GIL for a fraction of the time).
    Read back with pandas it equals ``exploded_frame``."""
    return arrow_table(exploded_columns(cols, block_ids, block_hashes))


def arrow_table(columns: dict[str, np.ndarray]) -> pa.Table:
    """Exploded columns as an Arrow table that shares their memory (kind a dictionary), every
    column non-nullable: events have no missing values, and Parquet then stores no definition
    levels (REQUIRED columns): the writer's encoding CPU for the whole Azure conversation
    trace's 6.5 M rows 0.71 -> 0.61 s (medians of 7, interleaved; the same file size), and
    readers get the same values and dtypes."""
    arrays = [
        dictionary_array(column, EVENT_KIND_NAMES) if name == "kind" else numeric_array(column)
        for name, column in columns.items()
    ]
    schema = pa.schema(
        [pa.field(name, array.type, nullable=False) for name, array in zip(columns, arrays)]
    )
    return pa.Table.from_arrays(arrays, schema=schema)
