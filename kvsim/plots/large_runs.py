"""The occupancy map and the Gantt chart of a run whose events.parquet is too long to read
back whole (more than ``MAX_PLOTTED_EVENT_ROWS`` rows: the whole Mooncake trace writes 34.5 M).

Neither picture is skipped. The occupancy map reads the block rows of every ``stride``-th
block (``block_id % stride == 0``, at most about ``MAX_PLOTTED_EVENT_ROWS`` rows), renumbered
``block_id // stride``, and draws their map over the whole pool's axis: a sample of blocks
across the whole run, which the title says. The Gantt chart needs only its own requests'
events: it reads the rows of those seq_ids, so it is exact. Both read the file a row group at
a time (pyarrow), holding only the rows they keep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from matplotlib.figure import Figure

from kvsim.analysis.events_io import MAX_PLOTTED_EVENT_ROWS
from kvsim.analysis.occupancy import block_intervals
from kvsim.plots.occupancy_map import plot_occupancy
from kvsim.plots.requests import plot_gantt

# The rows the occupancy map and its cached layer read (block rows and cache resets).
BLOCK_KINDS = ("ALLOCATE", "APPEND_BLOCK", "FREE", "PREFIX_HIT", "CACHE", "EVICT", "CACHE_RESET")
COLUMNS = ["time_s", "step", "kind", "seq_id", "block_id", "free_blocks", "num_tokens"]


def event_rows(path: Path) -> int:
    """Rows of the events file ``path`` (from its footer, without reading it)."""
    return int(pq.ParquetFile(path).metadata.num_rows)


def is_large(path: Path | None, max_rows: int | None = None) -> bool:
    """Whether ``path`` is an events file of more than ``max_rows`` (default
    ``MAX_PLOTTED_EVENT_ROWS``): too long to read back whole for pictures."""
    limit = MAX_PLOTTED_EVENT_ROWS if max_rows is None else max_rows
    return path is not None and Path(path).is_file() and event_rows(path) > limit


@dataclass(frozen=True, slots=True)
class BlockSample:
    """The block rows of every ``stride``-th block, block ids divided by ``stride``."""

    events: pd.DataFrame
    stride: int
    total_rows: int  # rows of the whole file

    def note(self) -> str:
        """What the picture's title says of the sample."""
        which = "every block" if self.stride == 1 else f"every {_ordinal(self.stride)} block"
        kept, total = _count(len(self.events)), _count(self.total_rows)
        return f"sampled: {which}, {kept} of {total} event rows"


def _count(rows: int) -> str:
    return f"{rows / 1e6:.3g} M" if rows >= 1e6 else f"{rows:,}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


def _filtered(path: Path, keep: object) -> pd.DataFrame:
    """The rows of ``path`` for which ``keep(batch)`` (a boolean Arrow array) holds."""
    parts = []
    file = pq.ParquetFile(path)
    columns = [c for c in COLUMNS if c in file.schema_arrow.names]
    for batch in file.iter_batches(batch_size=1 << 18, columns=columns):
        mask = keep(batch)  # type: ignore[operator]
        parts.append(batch.filter(mask))
    table = pa.Table.from_batches(parts, schema=parts[0].schema) if parts else None
    if table is None:
        return pd.DataFrame({c: [] for c in columns})
    return table.to_pandas()


def sample_blocks(path: Path, max_rows: int | None = None) -> BlockSample:
    """The block rows of every ``stride``-th block of ``path``, ``stride`` the smallest that
    keeps about ``max_rows`` (default ``MAX_PLOTTED_EVENT_ROWS``; block rows spread evenly
    over blocks); cache resets kept."""
    total = event_rows(path)
    max_rows = MAX_PLOTTED_EVENT_ROWS if max_rows is None else max_rows
    stride = max(1, math.ceil(total / max_rows))
    kinds = pa.array(BLOCK_KINDS)

    def keep(batch: pa.RecordBatch) -> pa.Array:
        kind = batch.column("kind")
        if pa.types.is_dictionary(kind.type):
            kind = kind.cast(pa.string())
        block = batch.column("block_id")
        sampled = pc.equal(pc.subtract(block, pc.multiply(pc.divide(block, stride), stride)), 0)
        reset = pc.equal(kind, "CACHE_RESET")
        return pc.and_(pc.is_in(kind, value_set=kinds), pc.or_(sampled, reset))

    events = _filtered(path, keep)
    block = events["block_id"].to_numpy(np.int64)
    events["block_id"] = np.where(block >= 0, block // stride, block)
    return BlockSample(events, stride, total)


def plot_sampled_occupancy(
    path: Path,
    num_blocks: int,
    *,
    t_from: float | None = None,
    t_to: float | None = None,
    end_s: float | None = None,
    max_rows: int | None = None,
    paged: bool = True,
) -> Figure:
    """The occupancy map of a paged run from a sample of its blocks (``sample_blocks``),
    its title naming the sample. A contiguous allocator's rows name a region by its first
    slot, so no block can be left out: ``paged=False`` reads every block row."""
    sample = sample_blocks(path, max_rows if paged else event_rows(path) + 1)
    sampled_blocks = math.ceil(num_blocks / sample.stride)
    intervals = block_intervals(sample.events, end_s, regions=not paged)
    return plot_occupancy(
        sample.events, sampled_blocks, t_from=t_from, t_to=t_to, end_s=end_s,
        intervals=intervals, by_request=False, shown_blocks=num_blocks, note=sample.note(),
    )  # fmt: skip


def request_events(path: Path, seq_ids: np.ndarray) -> pd.DataFrame:
    """Every row of ``path`` whose seq_id is one of ``seq_ids``."""
    wanted = pa.array(np.asarray(seq_ids, dtype=np.int64))

    def keep(batch: pa.RecordBatch) -> pa.Array:
        seq = batch.column("seq_id")
        return pc.is_in(seq, value_set=wanted.cast(seq.type))

    return _filtered(path, keep)


def plot_gantt_of_file(
    path: Path,
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    seq_ids: np.ndarray | None,
    *,
    t_from: float | None = None,
    t_to: float | None = None,
    end_s: float | None = None,
    max_requests: int = 40,
) -> Figure:
    """The Gantt chart of ``seq_ids`` (None: the first ``max_requests`` alive in the window,
    from the requests table), from their own rows of ``path``; the title counts them against
    every request alive in the window, as ``plot_gantt`` does."""
    alive = _alive(requests, t_from, t_to, end_s)
    if seq_ids is None:
        seq_ids = np.sort(alive)[:max_requests]
    events = request_events(path, np.asarray(seq_ids))
    return plot_gantt(
        events, steps, requests=requests, seq_ids=seq_ids, max_requests=max_requests,
        t_from=t_from, t_to=t_to, end_s=end_s, alive=len(alive),
    )  # fmt: skip


def _alive(
    requests: pd.DataFrame, t_from: float | None, t_to: float | None, end_s: float | None
) -> np.ndarray:
    """seq_ids of the requests alive some time in [t_from, t_to]: arrived before its end and
    not ended (finished, rejected or aborted) before its start."""
    arrival = requests["arrival_time_s"].to_numpy(np.float64)
    last = np.inf if end_s is None else end_s
    end = requests["finish_time_s"].fillna(last).to_numpy(np.float64)
    keep = np.ones(len(requests), dtype=bool)
    if t_to is not None:
        keep &= arrival < t_to
    if t_from is not None:
        keep &= end > t_from
    return np.asarray(requests["seq_id"].to_numpy(np.int64)[keep])
