"""events.parquet streaming: chunks are written in order on a background thread, and a failed
write is raised to the caller, never dropped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from frame_equality import assert_frame_equal

from engine import EventKind, EventRecorder
from kvsim.analysis import events_io
from kvsim.analysis.events_io import EventsParquetWriter, EventsWriteError, exploded_frame


def record_some(recorder: EventRecorder, n: int) -> None:
    for i in range(n):
        recorder.begin_step(i)
        recorder.record(EventKind.ALLOCATE, i, 100 - i, [2 * i, 2 * i + 1], 3)


def test_streamed_file_holds_every_chunk_in_order(tmp_path: Path) -> None:
    writer = EventsParquetWriter(tmp_path / "events.parquet", max_pending=1)
    streamed = EventRecorder(chunk_size=7, on_chunk=writer.write_chunk)
    record_some(streamed, 100)
    streamed.flush()
    writer.close()
    kept = EventRecorder()
    record_some(kept, 100)
    expected = exploded_frame(*kept.columns())
    got = pd.read_parquet(tmp_path / "events.parquet")
    assert_frame_equal(got, expected)
    assert writer.num_rows == 200


def test_row_groups_and_bytes_do_not_depend_on_the_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks straddle row groups and one holds several: every row lands once, in order,
    in groups of exactly ROW_GROUP_ROWS rows (the last shorter), and the file's bytes are
    the same however the recorder cut its chunks (the writer refills one buffer)."""
    monkeypatch.setattr(events_io, "ROW_GROUP_ROWS", 16)
    kept = EventRecorder()
    record_some(kept, 100)
    expected = exploded_frame(*kept.columns())
    files = []
    for chunk_size in (7, 40, 1000):
        path = tmp_path / f"events-{chunk_size}.parquet"
        writer = EventsParquetWriter(path, max_pending=1)
        streamed = EventRecorder(chunk_size=chunk_size, on_chunk=writer.write_chunk)
        record_some(streamed, 100)
        streamed.flush()
        writer.close()
        assert_frame_equal(pd.read_parquet(path), expected)
        metadata = pq.ParquetFile(path).metadata
        sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        assert sizes == [16] * 12 + [8]
        files.append(path.read_bytes())
    assert files[0] == files[1] == files[2]


def test_a_failed_write_is_raised_not_dropped(tmp_path: Path) -> None:
    writer = EventsParquetWriter(tmp_path / "missing-folder" / "events.parquet")
    recorder = EventRecorder(chunk_size=5, on_chunk=writer.write_chunk)
    with pytest.raises(EventsWriteError, match="missing-folder"):
        record_some(recorder, 50)  # a later chunk sees the first one's failure ...
        recorder.flush()
        writer.close()  # ... or close does
    with pytest.raises(EventsWriteError):
        writer.close()  # and it stays failed


def test_an_empty_stream_gives_an_empty_file(tmp_path: Path) -> None:
    writer = EventsParquetWriter(tmp_path / "events.parquet")
    writer.close()
    frame = pd.read_parquet(tmp_path / "events.parquet")
    assert len(frame) == 0 and "block_id" in frame
    assert np.issubdtype(frame["step"].dtype, np.integer)
