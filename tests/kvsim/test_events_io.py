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


def test_a_byte_budget_holds_the_caller_until_the_writer_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``max_pending_bytes`` a chunk waits for the writer to take the ones before it
    (one chunk alone always passes); the file is the same as without the wait."""
    import threading

    recorder = EventRecorder()
    record_some(recorder, 30)
    cols, block_ids = recorder.columns()
    release = threading.Event()
    original = EventsParquetWriter._write

    def slow_write(self: EventsParquetWriter, *args: object) -> None:
        release.wait(10)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(EventsParquetWriter, "_write", slow_write)
    writer = EventsParquetWriter(tmp_path / "events.parquet", max_pending_bytes=1)
    writer.write_chunk(cols, block_ids)  # alone: passes
    second = threading.Thread(target=writer.write_chunk, args=(cols, block_ids))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # held: the first chunk is not written yet
    release.set()
    second.join(10)
    assert not second.is_alive()
    writer.close()
    assert writer._pending_bytes == 0 and writer.num_rows == 120


def test_a_run_may_leave_its_events_file_to_be_finished(tmp_path: Path) -> None:
    """run(finish_events_later=True) returns with the writer still draining; finish_events
    completes the same file as a run that waited (twice is harmless)."""
    from kvsim.config import RunConfig
    from kvsim.runner import run

    config = RunConfig(trace="azure_llm_2023_conv_first_2min", num_blocks=600)
    waited = run(config, events_path=tmp_path / "waited.parquet")
    later = run(config, events_path=tmp_path / "later.parquet", finish_events_later=True)
    waited.finish_events()  # nothing left to finish
    later.finish_events()
    later.finish_events()
    assert (tmp_path / "later.parquet").read_bytes() == (tmp_path / "waited.parquet").read_bytes()


def test_the_file_is_encoded_per_column_as_events_encoding_says(tmp_path: Path) -> None:
    """Each column's codec and encoding are events_encoding's (chosen for the writer's CPU),
    with no statistics, and the file reads back as the rows it was given."""
    path = tmp_path / "events.parquet"
    writer = EventsParquetWriter(path, block_hashes=True)
    cache = int(EventKind.CACHE)
    cols = {
        "time_s": np.array([0.0, 0.5]), "step": np.array([1, 2], np.int32),
        "kind": np.array([int(EventKind.ALLOCATE), cache], np.int8),
        "seq_id": np.array([0, 0], np.int32), "free_blocks": np.array([8, 8], np.int32),
        "num_tokens": np.array([32, 0], np.int32), "num_blocks": np.array([2, 2], np.int32),
    }  # fmt: skip
    writer.write_chunk(cols, np.array([3, 4, 3, 4], np.int32), np.array([-7, 1 << 62]))
    writer.close()
    group = pq.ParquetFile(path).metadata.row_group(0)
    columns = {c.path_in_schema: c for c in map(group.column, range(group.num_columns))}
    assert {name: column.compression for name, column in columns.items()} == {
        "time_s": "LZ4", "step": "LZ4", "kind": "UNCOMPRESSED", "seq_id": "LZ4",
        "block_id": "UNCOMPRESSED", "free_blocks": "LZ4", "num_tokens": "LZ4",
        "block_hash": "SNAPPY",
    }  # fmt: skip
    assert "RLE_DICTIONARY" in columns["kind"].encodings
    assert "DELTA_BINARY_PACKED" in columns["block_id"].encodings
    assert not any(column.is_stats_set for column in columns.values())
    got = pd.read_parquet(path)
    assert got["block_hash"].tolist() == [0, 0, -7, 1 << 62]
    assert got["block_id"].tolist() == [3, 4, 3, 4]
    assert got["kind"].astype(str).tolist() == ["ALLOCATE"] * 2 + ["CACHE"] * 2
