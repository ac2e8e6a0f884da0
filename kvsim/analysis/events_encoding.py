"""How events.parquet is encoded: codec, encoding and statistics per column, and the sink.

The events writer's thread is the bound of a long run (docs/compiled.md: ~300 M rows for a
million requests, more CPU than the simulation), so the file is encoded for the writer's CPU
first and for size second; its schema, row order and values do not depend on any of this.
Each column of the whole Azure 2023 conversation trace's 6.5 M rows written alone (`python
benchmarks/bench_events_writer.py --per-column`; the table in docs/compiled.md):

- PLAIN values with LZ4 (Parquet's LZ4_RAW) on time_s, step, seq_id, free_blocks and
  num_tokens: the rows repeat their event's values over its blocks, which a fast byte
  compressor finds at ~1-2 ns per value, where dictionaries (3-4 ns of hashing per value) and
  zstd (a context per page, ~0.6 GB/s) took twice as long for files half as large.
- ``kind``: RLE_DICTIONARY (the Arrow column is a dictionary already, so its int8 codes are
  written as they are), uncompressed: its run-length encoded indices are small already (LZ4
  over them saved 0.26 MB for 2.7 ms).
- ``block_id``: DELTA_BINARY_PACKED, uncompressed (30 ms, 11.6 MB; PLAIN with LZ4 36 ms,
  12.0 MB).
- ``block_hash``: PLAIN with Snappy. Its keys are random 64-bit numbers on about half the rows
  and 0 elsewhere: no fast encoding makes them much smaller than the keys themselves, and
  Snappy gives up on incompressible bytes sooner than LZ4 (27 against 31 ms, 26.8 against
  25.5 MB). DELTA with zstd, before, found the EVICT rows' repeats of earlier keys (10.9 MB)
  at 92 ms: most of the size the file gave up (26.4 -> 48.7 MB in all).
- No min/max statistics: kvsim's readers filter by ``kind`` only, which row-group statistics
  cannot prune (every row group holds most kinds), and each statistic is a pass over its
  column.

Every codec and encoding here is in the Parquet format (LZ4_RAW since format 2.9, 2021) and
read by pyarrow, pandas, Polars, fastparquet, DuckDB 0.10.2+ and Spark 3.5+ (older DuckDB and
parquet-mr read no LZ4_RAW; rewriting the file with zstd makes it readable there).
"""

from __future__ import annotations

# Bytes the writer's sink holds before a write to the file: the Parquet writer writes each
# page and page header separately (~5,700 write calls for the whole Azure conversation
# trace's 6.5 M rows, ~5% of the writer thread's CPU in the kernel); a few MiB turn them into
# about a dozen.
SINK_BUFFER_BYTES = 4 << 20

# Per column: (encoding, codec); every other column PLAIN with LZ4 (module docstring: why)
_ENCODINGS = {
    "kind": ("RLE_DICTIONARY", "none"),  # the Arrow column is a dictionary already
    "block_id": ("DELTA_BINARY_PACKED", "none"),
    "block_hash": ("PLAIN", "snappy"),
}


def parquet_options(column_names: list[str]) -> dict[str, object]:
    """events.parquet's ``pyarrow.parquet.ParquetWriter`` / ``write_table`` options for these
    columns (module docstring: why each). Values go to the encoders 65,536 at a time
    (pyarrow's default 1,024 cost ~7% more CPU)."""
    encodings = {n: _ENCODINGS.get(n, ("PLAIN", "lz4")) for n in column_names}
    return {
        "compression": {n: codec for n, (_, codec) in encodings.items()},
        "write_statistics": False,
        "write_batch_size": 1 << 16,
        # the dictionary column's indices are run-length encoded (RLE_DICTIONARY)
        "use_dictionary": [n for n, (e, _) in encodings.items() if e == "RLE_DICTIONARY"],
        "column_encoding": {n: e for n, (e, _) in encodings.items() if e != "RLE_DICTIONARY"},
    }
