"""A v1 run's prefix-cache history in vLLM's KV-event schema (``kvsim export-kv-events``).

vLLM (``vllm/distributed/kv_events.py``) publishes, once per engine step that has any, a
``KVEventBatch(ts, events)`` of ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``
(msgpack over ZMQ, structs tagged with ``"type"``). The export writes one such batch per line,
as ``msgspec.json.encode(batch)`` would: ``[ts, [event, ...], null]`` (the batch is an
array-like struct: ``ts``, ``events``, ``data_parallel_rank``), so
``msgspec.json.decode(line, type=KVEventBatch)`` reads it back with vLLM's own classes.

From the run's events.parquet (a v1 run with prefix caching stores each CACHE and EVICT
block's key in ``block_hash``):

- a CACHE event is one ``BlockStored``: its blocks' keys in table order, ``parent_block_hash``
  the key of the sequence's block before the first (its previous CACHE's last block, or its
  last prefix-hit block; null at table index 0), ``block_size``, ``medium`` "GPU",
  ``token_ids`` empty (cost mode simulates no token ids), ``lora_id`` / ``lora_name`` null —
  as vLLM's ``BlockPool.cache_full_blocks`` groups them;
- an EVICT event is one ``BlockRemoved`` per block, as ``BlockPool`` emits them;
- CACHE_RESET is ``AllBlocksCleared``.

Keys are kvsim's 64-bit block keys written as unsigned integers (vLLM's
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` form); equal keys mean equal content in this run.
``ts`` is the simulated end of the step (vLLM publishes after the step's output).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.atomic import output_file
from kvsim.errors import KvsimError

MEDIUM = "GPU"
_UNSIGNED = (1 << 64) - 1
_KINDS = ("PREFIX_HIT", "CACHE", "EVICT", "CACHE_RESET", "FREE")


class KvEventsError(KvsimError):
    """The run cannot be exported as KV events (one line: which run and why)."""


def _events(
    frame: pd.DataFrame,
) -> Iterator[tuple[str, int, int, float, int, list[int], list[int]]]:
    """(kind, seq_id, step, time_s, num_tokens, block ids, keys) per event of ``_KINDS``: its
    consecutive rows (one per block) grouped. Two events in a row never look alike: each
    changes the free count or belongs to another sequence or step."""
    rows = frame[frame["kind"].isin(_KINDS)]
    keys = ["kind", "seq_id", "step", "time_s", "num_tokens", "free_blocks"]
    values = [rows[k].astype(str).to_numpy() if k == "kind" else rows[k].to_numpy() for k in keys]
    n = len(rows)
    if not n:
        return
    new = np.ones(n, dtype=bool)
    new[1:] = np.any([v[1:] != v[:-1] for v in values], axis=0)
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)
    blocks = rows["block_id"].to_numpy()
    hashes = rows["block_hash"].to_numpy()
    kind, seq, step, t, tokens = (v.tolist() for v in values[:5])
    for a, b in zip(starts.tolist(), ends.tolist()):
        block_list = blocks[a:b].tolist()
        if block_list == [-1]:
            block_list = []
        yield kind[a], seq[a], step[a], t[a], tokens[a], block_list, hashes[a:b].tolist()


def kv_event_batches(
    events: pd.DataFrame, steps: pd.DataFrame, block_size: int
) -> Iterator[list[Any]]:
    """The run's KV events as vLLM ``KVEventBatch`` arrays ``[ts, events, None]``, one per
    step with any, in order (see the module docstring)."""
    step_end = dict(zip(steps["step"].tolist(), (steps["time_s"] + steps["duration_s"]).tolist()))
    block_key: dict[int, int] = {}  # block id -> its key while cached
    last_key: dict[int, int] = {}  # seq -> key of its last cached-prefix block (held)
    batch: list[dict[str, Any]] = []
    batch_step: int | None = None
    batch_ts = 0.0
    for kind, seq, step, t, first_index, blocks, keys in _events(events):
        if kind == "FREE":
            last_key.pop(seq, None)
            continue
        if kind == "PREFIX_HIT":
            last_key[seq] = block_key[blocks[-1]]
            continue
        if batch and step != batch_step:
            yield [batch_ts, batch, None]
            batch = []
        batch_step, batch_ts = step, step_end.get(step, t)
        if kind == "CACHE":
            parent = last_key.get(seq) if first_index > 0 else None
            if first_index > 0 and parent is None:
                raise KvEventsError(f"step {step}: sequence {seq} caches block {first_index} "
                                 "without a cached block before it")  # fmt: skip
            batch.append(
                {
                    "type": "BlockStored",
                    "block_hashes": [k & _UNSIGNED for k in keys],
                    "parent_block_hash": None if parent is None else parent & _UNSIGNED,
                    "token_ids": [],
                    "block_size": block_size,
                    "lora_id": None,
                    "medium": MEDIUM,
                    "lora_name": None,
                }
            )
            block_key.update(zip(blocks, keys))
            last_key[seq] = keys[-1]
        elif kind == "EVICT":
            for b, k in zip(blocks, keys):
                block_key.pop(b, None)
                batch.append({"type": "BlockRemoved", "block_hashes": [k & _UNSIGNED],
                              "medium": MEDIUM})  # fmt: skip
        else:  # CACHE_RESET
            block_key.clear()
            batch.append({"type": "AllBlocksCleared"})
    if batch:
        yield [batch_ts, batch, None]


def check_exportable(run: Any) -> None:
    """Raise ``KvEventsError`` unless ``run`` (a RunFolder) is a v1 run with prefix caching
    whose events.parquet stores the block keys."""
    config = run.config
    if config.resolved_scheduler() != "v1":
        raise KvEventsError(
            f"{run.path}: a --scheduler {config.resolved_scheduler()} run has no prefix cache "
            "to export; rerun with --scheduler v1"
        )
    if not config.enable_prefix_caching:
        raise KvEventsError(
            f"{run.path}: ran with --no-enable-prefix-caching: no block was ever cached"
        )
    if run.events is None:
        raise KvEventsError(f"{run.path}: has no events.parquet (a sweep point without --events)")
    if "replica" in run.events:
        raise KvEventsError(
            f"{run.path}: a fleet run's events.parquet holds its routing decisions (ROUTE), "
            "not its replicas' KV events (docs/fleet.md); a one-replica run keeps them"
        )
    if "block_hash" not in run.events:
        raise KvEventsError(
            f"{run.path}: events.parquet has no block_hash column (written before kvsim "
            "stored block keys); rerun it"
        )


def write_kv_events(run: Any, path: Path, *, force: bool = False) -> tuple[int, int]:
    """Write ``run``'s KV events to ``path`` (JSON Lines, one batch per line) by kvsim's one
    output rule (kvsim.atomic.output_file): written whole or not at all, an existing file
    replaced only with ``force`` and only if kvsim wrote it, never the run's own tables.
    Returns (batches, events) written."""
    check_exportable(run)
    path = Path(path)
    inputs = [Path(run.path) / f"{t}.parquet" for t in ("requests", "steps", "events")]
    inputs += [Path(run.path) / "config.json", Path(run.path) / "summary.json"]
    num_batches = num_events = 0
    with (
        output_file(path, force=force, inputs=inputs) as tmp,
        open(tmp, "w", encoding="utf-8") as f,
    ):
        batches = kv_event_batches(run.events, run.steps, int(run.summary["block_size"]))
        for batch in batches:
            f.write(json.dumps(batch, separators=(",", ":"), allow_nan=False))
            f.write("\n")
            num_batches += 1
            num_events += len(batch[1])
    return num_batches, num_events
