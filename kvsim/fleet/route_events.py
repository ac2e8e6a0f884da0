"""A fleet's events.parquet: one ROUTE event per routing decision (docs/fleet.md, "Outputs").

events.parquet's columns (docs/metrics.md) and a ``replica`` column: the replica the router
chose. A ROUTE row is what the replica's ARRIVE would say, from the router's side: the
arrival time, the chosen replica's last step begun and free blocks at that moment, the
request's seq_id there, and in ``num_tokens`` the prompt tokens the router saw cached there
(its KV-event view, ``--router-event-delay`` late: routing.parquet's
``router_prefix_blocks`` x block size). A P/D fleet routes a disaggregated request twice at
its arrival, its decode replica first (seq_id -1 when the request never got there), then
its prefill replica.

The replicas' own events (blocks allocated, cached, evicted) are written only with
``--fleet-events all`` (kvsim/fleet/run.py streams them, each ROUTE then recorded in the
chosen replica's own stream before its ARRIVE); by default a fleet keeps each replica's
events only as long as its metrics need them (docs/fleet.md has the cost of both).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from engine import EventKind
from kvsim.analysis.events_encoding import parquet_options
from kvsim.analysis.events_io import arrow_table


def route_columns(
    time_s: np.ndarray,
    step: np.ndarray,
    replica: np.ndarray,
    seq_id: np.ndarray,
    free_blocks: np.ndarray,
    cached_tokens: np.ndarray,
) -> dict[str, np.ndarray]:
    """ROUTE rows, one per decision in the order given (s, step, replica, seq_id, blocks,
    tokens), in events.parquet's column order with ``replica`` last."""
    n = len(time_s)
    return {
        "time_s": np.asarray(time_s, dtype=np.float64),
        "step": np.asarray(step, dtype=np.int64),
        "kind": np.full(n, int(EventKind.ROUTE), dtype=np.int8),
        "seq_id": np.asarray(seq_id, dtype=np.int64),
        "block_id": np.full(n, -1, dtype=np.int64),
        "free_blocks": np.asarray(free_blocks, dtype=np.int64),
        "num_tokens": np.asarray(cached_tokens, dtype=np.int64),
        "replica": np.asarray(replica, dtype=np.int32),
    }


def write_route_events(path: Path, columns: dict[str, np.ndarray]) -> None:
    """events.parquet at ``path`` from ``route_columns``' rows (the encodings of a
    one-replica run's events.parquet, kvsim.analysis.events_encoding.parquet_options)."""
    table = arrow_table(columns)
    pq.write_table(table, path, **parquet_options(table.column_names))
