"""CPU of the events writer: events.parquet exploded, encoded and written on its own thread.

Runs a trace once in-process (the whole Azure 2023 conversation trace by default, v1
defaults, events streamed as `kvsim run` streams them) and keeps the chunks the simulation
hands its ``EventsParquetWriter``. Then, --repeats rounds: the same chunks through a fresh
writer into a new file, in a child process per checkout (this one, and --baseline DIR's in
turn with it, e.g. the main branch from ``git archive``), reporting the medians of the writer
thread's CPU (``time.thread_time`` over its drain plus ``close``: exploding rows, Parquet
encoding and compression, the kernel's copy into the page cache) and the file's size.

--per-column: each column of the file alone, written with events.parquet's encodings and with
the ones before them (``BEFORE`` below), medians of --repeats in turns, to a new file each
time: encoding CPU and bytes per column (kvsim/analysis/events_encoding.py's reasons).

    PYTHONPATH=. python benchmarks/bench_events_writer.py [--repeats 9] [--trace NAME]
        [--baseline DIR] [--per-column]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
Chunk = tuple[dict, object, object]


def before_options(column_names: list[str]) -> dict[str, object]:
    """events.parquet's encodings before the writer was tuned for CPU (zstd level -1,
    dictionaries on kind / seq_id / num_tokens, DELTA_BINARY_PACKED on block_id / free_blocks
    / block_hash, statistics on five columns)."""
    delta = ("block_id", "free_blocks", "block_hash")
    encoding = {n: "DELTA_BINARY_PACKED" for n in delta} | {"time_s": "PLAIN", "step": "PLAIN"}
    stats = ("time_s", "step", "kind", "seq_id", "block_id")
    dictionary = ("kind", "seq_id", "num_tokens", "replica")
    return {
        "compression": "zstd",
        "compression_level": -1,
        "write_statistics": [n for n in stats if n in column_names],
        "write_batch_size": 1 << 16,
        "use_dictionary": [n for n in dictionary if n in column_names],
        "column_encoding": {n: e for n, e in encoding.items() if n in column_names},
    }


def capture_chunks(trace: str) -> list[Chunk]:
    """The chunks a streamed run of ``trace`` hands its events writer, copied."""
    from kvsim.analysis import events_io
    from kvsim.config import RunConfig
    from kvsim.runner import run

    chunks: list[Chunk] = []
    write_chunk = events_io.EventsParquetWriter.write_chunk

    def keep(self, cols, block_ids, block_hashes=None, replica=None):  # type: ignore[no-untyped-def]
        hashes = None if block_hashes is None else block_hashes.copy()
        chunks.append(({k: v.copy() for k, v in cols.items()}, block_ids.copy(), hashes))
        write_chunk(self, cols, block_ids, block_hashes, replica)

    events_io.EventsParquetWriter.write_chunk = keep  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run(RunConfig(trace=trace), events_path=Path(tmp) / "events.parquet")
    finally:
        events_io.EventsParquetWriter.write_chunk = write_chunk  # type: ignore[method-assign]
    return chunks


def replay(chunks_path: Path, out: Path) -> dict[str, float]:
    """The chunks through this checkout's writer into ``out`` (a new file): its CPU and size."""
    from kvsim.analysis.events_io import EventsParquetWriter

    class TimedWriter(EventsParquetWriter):
        drain_cpu_s = 0.0

        def _drain(self) -> None:
            start = time.thread_time()
            try:
                super()._drain()
            finally:
                self.drain_cpu_s = time.thread_time() - start

    chunks = pickle.loads(chunks_path.read_bytes())
    writer = TimedWriter(out, block_hashes=chunks[0][2] is not None)
    for cols, block_ids, hashes in chunks:
        writer.write_chunk(cols, block_ids, hashes)
    start = time.thread_time()
    writer.close()  # the last row group and the footer, on this thread
    cpu = writer.drain_cpu_s + time.thread_time() - start
    return {"cpu_s": cpu, "bytes": out.stat().st_size, "rows": writer.num_rows}


def replay_in(root: Path, chunks_path: Path, out: Path) -> dict[str, float]:
    """``replay`` in a child process that imports kvsim from ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, __file__, "--replay", str(chunks_path), "--out", str(out)],
        cwd=root, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_writer(chunks_path: Path, repeats: int, baseline: Path | None, tmp: Path) -> None:
    trees = {"this": REPO} | ({"baseline": baseline} if baseline else {})
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_ in range(repeats):
        for name, root in trees.items():  # in turns: the machine's speed drifts
            out = tmp / f"{name}-{round_}.parquet"
            results[name].append(replay_in(root, chunks_path, out))
            out.unlink()
    print(f"events writer, medians of {repeats} rounds in turns (a new file each)")
    for name, rounds in results.items():
        cpu = statistics.median(r["cpu_s"] for r in rounds)
        rows, size = rounds[0]["rows"], rounds[0]["bytes"]
        print(
            f"  {name:9s} writer CPU {cpu * 1000:6.0f} ms ({cpu / rows * 1e9:4.1f} ns per row, "
            f"{rows / 1e6:.2f} M rows)  file {size / 1e6:6.2f} MB ({size / rows:4.1f} B per row)"
        )
    if baseline:
        this = statistics.median(r["cpu_s"] for r in results["this"])
        base = statistics.median(r["cpu_s"] for r in results["baseline"])
        print(f"  this / baseline writer CPU = {this / base:.2f}")


def bench_columns(chunks: list[Chunk], repeats: int, tmp: Path) -> None:
    import pyarrow.parquet as pq

    from kvsim.analysis.events_encoding import parquet_options
    from kvsim.analysis.events_io import ROW_GROUP_ROWS
    from kvsim.analysis.exploded_rows import arrow_table, exploded_columns

    exploded = [exploded_columns(*chunk) for chunk in chunks]
    table = arrow_table({n: np.concatenate([e[n] for e in exploded]) for n in exploded[0]})
    groups = [table.slice(s, ROW_GROUP_ROWS) for s in range(0, table.num_rows, ROW_GROUP_ROWS)]
    schemes = {"now": parquet_options, "before": before_options}
    print(f"per column, {table.num_rows / 1e6:.2f} M rows, medians of {repeats} (ms, MB)")
    for name in table.column_names:
        cpu: dict[str, list[float]] = {s: [] for s in schemes}
        size: dict[str, int] = {}
        for round_ in range(repeats):
            for scheme, options in schemes.items():
                path = tmp / f"{name}-{scheme}-{round_}.parquet"
                start = time.thread_time()
                with pq.ParquetWriter(path, groups[0].select([name]).schema,
                                      **options([name])) as writer:  # fmt: skip
                    for group in groups:
                        writer.write_table(group.select([name]), row_group_size=ROW_GROUP_ROWS)
                cpu[scheme].append(time.thread_time() - start)
                size[scheme] = path.stat().st_size
                path.unlink()
        print(
            f"  {name:12s}"
            + "".join(
                f"  {s} {statistics.median(cpu[s]) * 1000:6.1f} ms {size[s] / 1e6:6.2f} MB"
                for s in schemes
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--trace", default="azure_llm_2023_conv")
    parser.add_argument("--baseline", type=Path, help="another kvsim checkout, run A/B")
    parser.add_argument("--per-column", action="store_true")
    parser.add_argument("--replay", type=Path, help=argparse.SUPPRESS)  # the child's part
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        print(json.dumps(replay(args.replay, args.out)))
        return
    chunks = capture_chunks(args.trace)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.per_column:
            bench_columns(chunks, args.repeats, tmp)
            return
        chunks_path = tmp / "chunks.pickle"
        chunks_path.write_bytes(pickle.dumps(chunks, protocol=5))
        bench_writer(chunks_path, args.repeats, args.baseline, tmp)


if __name__ == "__main__":
    main()
