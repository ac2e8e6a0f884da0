"""How EventRecorder keeps events before it packs them, and how it packs them.

A recorded row is a packed struct (``_ROW``) in a bytearray; some rows stand for several events
(a run of APPEND_BLOCK events, a whole plain decode step, a decode pass's block run) and are
expanded with vectorised numpy when a chunk is packed (``event_records``). ``merge_chunks``
concatenates packed chunks.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable

import numpy as np

from engine.core.event_kinds import NO_SEQ, EventKind, StepKind

EVENT_COLUMNS = ("time_s", "step", "kind", "seq_id", "free_blocks", "num_tokens", "num_blocks")
# int32 where it is ample (steps, sequence ids, block and token counts): a million-request run
# keeps tens of millions of event rows in memory.
EVENT_DTYPES = ("f8", "i4", "i1", "i4", "i4", "i4", "i4")
STEP_COLUMNS = ("time_s", "step", "kind", "num_seqs", "num_batched_tokens", "free_blocks")
STEP_DTYPES = ("f8", "i8", "i1", "i8", "i8", "i8")

Columns = dict[str, np.ndarray]
ChunkCallback = Callable[[Columns, np.ndarray], None]


# How the recorder stores a row until it packs a chunk: the columns above, packed without
# padding. One struct.pack per event and a zero-copy view when packing cost about a third of
# a list of tuples turned into a record array (which converted every field of every tuple).
_ROW = struct.Struct("<dibiiii")
_ROW_RECORD = np.dtype(
    {
        "names": list(EVENT_COLUMNS),
        "formats": ["<f8", "<i4", "i1", "<i4", "<i4", "<i4", "<i4"],
        "offsets": [0, 8, 12, 13, 17, 21, 25],
        "itemsize": _ROW.size,
    }
)
# Rows that stand for several events, expanded when packing; they never leave the recorder.
# A run of APPEND_BLOCK events (record_appends): its seq_id column holds the run's length,
# the run's sequence ids are kept aside.
_APPEND_RUN = -1
# A decode step (record_decode_step): its appends as a run, then its STEP event; seq_id and
# num_blocks hold the number of appends, free_blocks the count after them, num_tokens the
# step's tokens.
_DECODE_STEP = -2
# A run of single-block APPEND_BLOCK / EVICT / CACHE events (record_block_events): seq_id
# holds the run's length, free_blocks the count before it; kinds, sequence ids and token
# counts are kept aside. One row per pass instead of one or two sink calls per block: a v1
# decode step with prefix caching takes, evicts and caches blocks for a tenth of its batch.
_BLOCK_RUN = -3
_STEP = int(EventKind.STEP)
_APPEND_BLOCK = int(EventKind.APPEND_BLOCK)
_EVICT = int(EventKind.EVICT)
_DECODE = int(StepKind.DECODE)


def empty_columns(names: tuple[str, ...], dtypes: tuple[str, ...]) -> Columns:
    return {n: np.empty(0, dtype=d) for n, d in zip(names, dtypes)}


def event_records(
    rows: bytes | bytearray, run_seq_ids: list[int], block_run: BlockRunColumns | None = None
) -> np.ndarray:
    """The recorded rows (packed ``_ROW`` structs) as one record array, each APPEND run,
    decode-step row and block run expanded into its events with vectorised numpy."""
    records = np.frombuffer(rows, dtype=_ROW_RECORD)
    kind = records["kind"]
    is_run = kind == _APPEND_RUN
    is_decode = kind == _DECODE_STEP
    is_block_run = kind == _BLOCK_RUN if block_run is not None else None
    if not run_seq_ids and not is_decode.any() and is_block_run is None:
        return records
    num_appends = np.where(is_run | is_decode, records["seq_id"], 0)
    # a run row is only its appends; a decode row ends in STEP; a block run is its events
    counts = num_appends + ~is_run
    if is_block_run is not None:
        counts = np.where(is_block_run, records["seq_id"], counts)
    # free_blocks after each group's first append; each later one has one fewer
    first_free = records["free_blocks"] + np.where(is_decode, num_appends - 1, 0)
    records = np.repeat(records, counts)
    offset = np.arange(len(records)) - np.repeat(np.cumsum(counts) - counts, counts)
    is_append = offset < np.repeat(num_appends, counts)
    closes_decode = np.repeat(is_decode, counts) & ~is_append
    records["kind"][is_append] = _APPEND_BLOCK
    records["seq_id"][is_append] = run_seq_ids
    records["free_blocks"][is_append] = (np.repeat(first_free, counts) - offset)[is_append]
    records["num_tokens"][is_append] = 1
    records["num_blocks"][is_append] = 1
    records["kind"][closes_decode] = _STEP
    records["seq_id"][closes_decode] = NO_SEQ
    records["num_blocks"][closes_decode] = 0
    if is_block_run is not None and block_run is not None:
        in_run = np.repeat(is_block_run, counts)
        kinds = np.frombuffer(block_run.kinds, dtype=np.int8)
        appends = kinds == _APPEND_BLOCK
        takes = appends | (kinds == _EVICT)  # an EVICT comes right before its take
        # blocks taken before each event of its run (a run's events are contiguous)
        taken = np.cumsum(appends) - appends
        first = offset[in_run] == 0
        taken -= np.repeat(taken[first], counts[is_block_run])
        records["kind"][in_run] = kinds
        records["seq_id"][in_run] = np.frombuffer(block_run.seq_ids, dtype=np.int32)
        records["num_tokens"][in_run] = np.frombuffer(block_run.num_tokens, dtype=np.int32)
        records["num_blocks"][in_run] = 1
        records["free_blocks"][in_run] -= taken + takes
    return records


class BlockRunColumns:
    """The per-event columns of the block runs in a recorder's unpacked rows."""

    __slots__ = ("kinds", "num_tokens", "seq_ids")

    def __init__(self) -> None:
        self.kinds = array("b")
        self.seq_ids = array("i")
        self.num_tokens = array("i")

    def __len__(self) -> int:
        return len(self.kinds)


def merge_chunks(chunks: list[tuple[Columns, np.ndarray]]) -> tuple[Columns, np.ndarray]:
    """Concatenate ``chunks`` (emptying the list as it goes), so the peak is the merged
    columns plus one chunk rather than twice every event."""
    names = list(chunks[0][0])
    num_events = sum(len(c[names[0]]) for c, _ in chunks)
    num_blocks = sum(len(b) for _, b in chunks)
    merged = {n: np.empty(num_events, dtype=chunks[0][0][n].dtype) for n in names}
    block_ids = np.empty(num_blocks, dtype=np.int64)
    at = block_at = 0
    chunks.reverse()
    while chunks:
        chunk, blocks = chunks.pop()
        end = at + len(chunk[names[0]])
        for n in names:
            merged[n][at:end] = chunk[n]
        block_ids[block_at : block_at + len(blocks)] = blocks
        at, block_at = end, block_at + len(blocks)
    return merged, block_ids
