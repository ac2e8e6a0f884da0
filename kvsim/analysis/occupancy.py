"""Who holds what, when: block ownership and request states reconstructed from the events.

Everything here is computed from ``events.parquet`` (one row per (event, block)) and
``steps.parquet``, vectorised with numpy/pandas, so a run of 100,000 blocks and 100,000 steps
is reconstructed in seconds:

- ``block_intervals``: one row per time a sequence held a block, from its ``ALLOCATE``,
  ``APPEND_BLOCK`` or (v1) ``PREFIX_HIT`` row to the matching ``FREE`` row (the k-th start of
  a (block, sequence) pair ends at its k-th free, so shared blocks with reference counts
  work too).
- ``cached_intervals`` (v1 with prefix caching): when each block was cached, evictable —
  free, but keeping its prefix-cache key until a hit takes it back or an eviction reuses it.
- ``occupancy_grid``: those intervals aggregated into a pixel grid (blocks x time bins), each
  cell the share of its block-time in use, and, for pools small enough to give each block a
  row, the owning sequence at each column's centre.
- ``owners_at``: the owner of every block at one instant (the animation's frames).
- ``request_states``: one row per state a request was in (queued, prefill, decode, preempted).

Times are simulated seconds; block ids are physical block ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvsim.errors import KvsimError

FREE = -1  # owner of a free block
SHARED = -2  # owner of a block held by more than one sequence at once
START_KINDS = ("ALLOCATE", "APPEND_BLOCK", "PREFIX_HIT")  # a v1 prefix hit holds its blocks
ALLOCATION_KINDS = ("ALLOCATE", "APPEND_BLOCK")
END_KINDS = ("FINISH", "ABORT", "REJECT")
STATES = ("queued", "prefill", "decode", "preempted")


class OccupancyError(KvsimError):
    """The events do not describe a consistent history of the block pool."""


def run_end_s(events: pd.DataFrame, steps: pd.DataFrame | None = None) -> float:
    """The last moment the tables know of (s): the last event or the end of the last step."""
    end = float(events["time_s"].max()) if len(events) else 0.0
    if steps is not None and len(steps):
        end = max(end, float((steps["time_s"] + steps["duration_s"]).max()))
    return end


def _group_rank(keys: pd.DataFrame) -> np.ndarray:
    """0, 1, 2, ... within each run of equal (block_id, seq_id) rows of a sorted frame."""
    b, q = keys["block_id"].to_numpy(), keys["seq_id"].to_numpy()
    n = len(keys)
    new = np.ones(n, dtype=bool)
    new[1:] = (b[1:] != b[:-1]) | (q[1:] != q[:-1])
    index = np.arange(n)
    return index - np.maximum.accumulate(np.where(new, index, 0))


def _sorted_with_rank(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.reset_index(drop=True)
    order = np.lexsort((np.arange(len(rows)), rows["seq_id"], rows["block_id"]))
    rows = rows.iloc[order].reset_index(drop=True)
    return rows.assign(rank=_group_rank(rows))


def _region_sizes(events: pd.DataFrame) -> np.ndarray:
    """Blocks each row stands for: 1, except an allocation event of a single row whose
    free-block count drops by more than one — a contiguous allocator's region (engine/
    contiguous.py: ALLOCATE and FREE carry the region's first slot only)."""
    n = len(events)
    if n == 0:
        return np.ones(0, dtype=np.int64)
    keys = [pd.factorize(events[c])[0] for c in ("kind", "seq_id", "step", "time_s")]
    new_event = np.zeros(n, dtype=bool)
    new_event[0] = True
    for k in keys:
        new_event[1:] |= k[1:] != k[:-1]
    event_id = np.cumsum(new_event) - 1
    rows_in_event = np.bincount(event_id)[event_id]
    free = events["free_blocks"].to_numpy(np.int64)
    drop = np.concatenate([[0], free[:-1] - free[1:]])
    region = events["kind"].isin(ALLOCATION_KINDS).to_numpy() & (rows_in_event == 1) & (drop > 1)
    return np.where(region, drop, 1)


def block_intervals(
    events: pd.DataFrame, end_s: float | None = None, *, regions: bool = True
) -> pd.DataFrame:
    """One row per (block, sequence) holding: block_id, seq_id, start_s, end_s, start_step,
    end_step. A block still held when the events stop ends at ``end_s`` (default: the last
    event's time) with ``end_step`` -1. A contiguous allocator's region (one ALLOCATE row
    naming its first slot) becomes one row per slot, its size read from the drop in
    ``free_blocks``; ``regions=False`` reads every row as one block (a paged run's rows of a
    sample of blocks, whose free-block counts drop between rows by blocks left out). Raises
    ``OccupancyError`` for a free with no allocation before it."""
    cols = ["time_s", "step", "seq_id", "block_id"]
    kind = events["kind"]
    is_start = kind.isin(START_KINDS).to_numpy()
    sizes = _region_sizes(events) if regions else np.ones(len(events), dtype=np.int64)
    starts = events.loc[is_start, cols].assign(size=sizes[is_start])
    starts = _sorted_with_rank(starts)
    ends = _sorted_with_rank(events.loc[kind == "FREE", cols])
    keys = ["block_id", "seq_id", "rank"]
    merged = starts.merge(ends, on=keys, how="left", suffixes=("_start", "_end"))
    if len(ends):
        matched = ends.merge(starts[keys], on=keys, how="left", indicator=True)
        orphan = matched[matched["_merge"] == "left_only"]
        if len(orphan):
            row = orphan.iloc[0]
            raise OccupancyError(
                f"FREE of block {row['block_id']} by sequence {row['seq_id']} at "
                f"{row['time_s']} s has no ALLOCATE or APPEND_BLOCK before it"
            )
    if end_s is None:
        end_s = float(events["time_s"].max()) if len(events) else 0.0
    open_ = merged["time_s_end"].isna().to_numpy()
    size = merged["size"].to_numpy(np.int64)
    # A region of `size` slots: repeat its row, block ids first, first + 1, ...
    offset = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
    out = pd.DataFrame(
        {
            "block_id": np.repeat(merged["block_id"].to_numpy(np.int64), size) + offset,
            "seq_id": np.repeat(merged["seq_id"].to_numpy(np.int64), size),
            "start_s": np.repeat(merged["time_s_start"].to_numpy(np.float64), size),
            "end_s": np.repeat(
                np.where(open_, end_s, merged["time_s_end"].to_numpy(np.float64)), size
            ),
            "start_step": np.repeat(merged["step_start"].to_numpy(np.int64), size),
            "end_step": np.repeat(
                np.where(open_, -1, merged["step_end"].fillna(-1)).astype(np.int64), size
            ),
        }
    )
    if (out["end_s"] < out["start_s"]).any():
        bad = out[out["end_s"] < out["start_s"]].iloc[0]
        raise OccupancyError(
            f"block {bad['block_id']} is freed by sequence {bad['seq_id']} before it is "
            f"allocated ({bad['end_s']} s < {bad['start_s']} s)"
        )
    return out.sort_values(["start_s", "block_id"], kind="stable", ignore_index=True)


def cached_intervals(
    events: pd.DataFrame, num_blocks: int, end_s: float | None = None
) -> pd.DataFrame:
    """One row per time a block was cached, evictable (v1): block_id, start_s (its last
    holder freed it, with its key), end_s (a prefix hit took it, the free queue evicted it,
    or a cache reset; still cached when the events stop: ``end_s``, default the last
    event). Empty for runs without prefix caching."""
    from engine import EventKind
    from kvsim.analysis.block_states import BlockStateTracker

    if end_s is None:
        end_s = float(events["time_s"].max()) if len(events) else 0.0
    empty = pd.DataFrame({"block_id": [], "seq_id": [], "start_s": [], "end_s": []})
    if not len(events) or not events["kind"].isin(["CACHE"]).any():
        return empty.astype({"block_id": np.int64, "seq_id": np.int64})
    blocks = events["block_id"].to_numpy(np.int64)
    kind = (
        pd.Categorical(events["kind"].astype(str))
        if events["kind"].dtype != "category"
        else (events["kind"].array)
    )
    codes = np.array([EventKind[str(c)].value for c in kind.categories], dtype=np.int8)
    cols = {  # each row an event of its one block (or none)
        "kind": codes[np.asarray(kind.codes)],
        "time_s": events["time_s"].to_numpy(np.float64),
        "num_blocks": (blocks >= 0).astype(np.int32),
    }
    tracker = BlockStateTracker(num_blocks, keep_transitions=True, keep_residency=False)
    tracker.consume(cols, blocks[blocks >= 0])
    t, b, change = tracker.transitions()
    order = np.lexsort((np.arange(len(t)), b))
    t, b, change = t[order], b[order], change[order]
    starts = np.flatnonzero(change > 0)
    # each start's end: the block's next transition (a -1), if any
    has_end = (starts + 1 < len(b)) & (b[np.minimum(starts + 1, len(b) - 1)] == b[starts])
    end = np.where(has_end, t[np.minimum(starts + 1, len(t) - 1)], end_s)
    out = pd.DataFrame(
        {"block_id": b[starts], "seq_id": np.full(len(starts), FREE, dtype=np.int64),
         "start_s": t[starts], "end_s": end}
    )  # fmt: skip
    return out.sort_values(["start_s", "block_id"], kind="stable", ignore_index=True)


# --- the pixel grid ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OccupancyGrid:
    """Blocks x time aggregated into cells.

    ``share[r, c]``: share (0..1) of the block-seconds of row ``r`` (blocks
    ``row_edges[r] .. row_edges[r+1]-1``) and column ``c`` (``time_edges[c] ..
    time_edges[c+1]`` s) during which a block was in use. ``owner[r, c]``: with one row per
    block, the seq_id holding the block at the column's centre, ``FREE`` or ``SHARED``;
    None when rows aggregate several blocks.
    """

    share: np.ndarray
    row_edges: np.ndarray
    time_edges: np.ndarray
    owner: np.ndarray | None


def _clip_to_window(
    intervals: pd.DataFrame, t_from: float, t_to: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    s = np.maximum(intervals["start_s"].to_numpy(np.float64), t_from)
    e = np.minimum(intervals["end_s"].to_numpy(np.float64), t_to)
    keep = e > s
    blocks = intervals["block_id"].to_numpy(np.int64)[keep]
    return blocks, intervals["seq_id"].to_numpy(np.int64)[keep], s[keep], e[keep]


def occupancy_grid(
    intervals: pd.DataFrame,
    num_blocks: int,
    t_from: float,
    t_to: float,
    *,
    max_rows: int = 400,
    cols: int = 800,
) -> OccupancyGrid:
    """Aggregate ``intervals`` (``block_intervals``) over [t_from, t_to] s into at most
    ``max_rows`` rows of consecutive blocks and ``cols`` equal time bins. Exact: each cell
    holds the in-use share of its block-seconds, so no short holding is lost."""
    if not t_to > t_from:
        raise OccupancyError(f"empty time window: from {t_from} s to {t_to} s")
    nrows, width = min(num_blocks, max_rows), (t_to - t_from) / cols
    row_of_block = np.arange(num_blocks, dtype=np.int64) * nrows // num_blocks
    blocks_per_row = np.bincount(row_of_block, minlength=nrows)
    row_edges = np.searchsorted(row_of_block, np.arange(nrows + 1), side="left")
    blocks, seqs, s, e = _clip_to_window(intervals, t_from, t_to)
    r = row_of_block[blocks]
    # Positions in bin units; j0, j1: the bins holding each end.
    x0, x1 = (s - t_from) / width, (e - t_from) / width
    j0 = np.minimum(x0.astype(np.int64), cols - 1)
    j1 = np.minimum(x1.astype(np.int64), cols - 1)
    same = j0 == j1
    weights = np.where(same, x1 - x0, j0 + 1 - x0)
    cover = np.bincount(r * cols + j0, weights, minlength=nrows * cols)
    cover += np.bincount(r[~same] * cols + j1[~same], (x1 - j1)[~same], minlength=nrows * cols)
    # Bins strictly between j0 and j1 are covered whole: a difference array along time.
    full = np.zeros((nrows, cols + 1))
    np.add.at(full, (r[~same], j0[~same] + 1), 1.0)
    np.add.at(full, (r[~same], j1[~same]), -1.0)
    share = cover.reshape(nrows, cols) + np.cumsum(full, axis=1)[:, :cols]
    share = np.clip(share / blocks_per_row[:, None], 0.0, 1.0)
    owner = None
    if nrows == num_blocks:
        owner = _owner_grid(blocks, seqs, x0, x1, num_blocks, cols)
    time_edges = np.linspace(t_from, t_to, cols + 1)
    return OccupancyGrid(share, row_edges, time_edges, owner)


def _owner_grid(
    blocks: np.ndarray, seqs: np.ndarray, x0: np.ndarray, x1: np.ndarray, num_blocks: int, cols: int
) -> np.ndarray:
    """Owner of each block at each column centre (bin units: centre of column c is c + 0.5)."""
    c0 = np.clip(np.ceil(x0 - 0.5), 0, cols).astype(np.int64)
    c1 = np.clip(np.ceil(x1 - 0.5), 0, cols).astype(np.int64)
    keep = c1 > c0
    count = np.zeros((num_blocks, cols + 1), dtype=np.int64)
    value = np.zeros((num_blocks, cols + 1), dtype=np.int64)
    b, v = blocks[keep], seqs[keep] + 1
    np.add.at(count, (b, c0[keep]), 1)
    np.add.at(count, (b, c1[keep]), -1)
    np.add.at(value, (b, c0[keep]), v)
    np.add.at(value, (b, c1[keep]), -v)
    count, value = np.cumsum(count, axis=1)[:, :cols], np.cumsum(value, axis=1)[:, :cols]
    return np.where(count == 1, value - 1, np.where(count > 1, SHARED, FREE))


def owners_at(intervals: pd.DataFrame, t: float, num_blocks: int) -> np.ndarray:
    """The seq_id holding each block at time ``t`` (s): ``FREE`` or ``SHARED`` otherwise.
    A block is held over [start_s, end_s)."""
    live = (intervals["start_s"].to_numpy() <= t) & (intervals["end_s"].to_numpy() > t)
    blocks = intervals["block_id"].to_numpy()[live]
    seqs = intervals["seq_id"].to_numpy()[live]
    owner = np.full(num_blocks, FREE, dtype=np.int64)
    count = np.bincount(blocks, minlength=num_blocks)
    owner[blocks] = seqs
    owner[count > 1] = SHARED
    return owner


# --- request states -------------------------------------------------------------------------


def request_states(
    events: pd.DataFrame, steps: pd.DataFrame, end_s: float | None = None
) -> pd.DataFrame:
    """One row per state of each request: seq_id, state (queued / prefill / decode /
    preempted), start_s, end_s. A request is queued from ARRIVE, in prefill from ADMIT or
    RESUME to the end of that step, then in decode until PREEMPT (then preempted until its
    RESUME), FINISH, ABORT or REJECT. States still open end at ``end_s`` (default: the run's
    last moment); empty states are dropped."""
    if end_s is None:
        end_s = run_end_s(events, steps)
    kinds = ("ARRIVE", "ADMIT", "RESUME", "PREEMPT", *END_KINDS)
    ev = events.loc[events["kind"].isin(kinds), ["time_s", "step", "kind", "seq_id"]]
    ev = ev.iloc[np.lexsort((np.arange(len(ev)), ev["seq_id"].to_numpy()))]
    seq = ev["seq_id"].to_numpy(np.int64)
    t = ev["time_s"].to_numpy(np.float64)
    kind = ev["kind"].astype(str).to_numpy()
    last = np.ones(len(ev), dtype=bool)
    last[:-1] = seq[1:] != seq[:-1]
    next_t = np.where(last, end_s, np.roll(t, -1))
    step_end = pd.Series(
        (steps["time_s"] + steps["duration_s"]).to_numpy(), index=steps["step"].to_numpy()
    )
    run = (kind == "ADMIT") | (kind == "RESUME")
    prefill_end = step_end.reindex(ev["step"].to_numpy()).to_numpy()
    prefill_end = np.minimum(np.where(np.isnan(prefill_end), t, prefill_end), next_t)
    queued = np.where(kind == "PREEMPT", "preempted", "queued")
    parts = [
        (seq[~run], queued[~run], t[~run], next_t[~run], np.isin(kind[~run], END_KINDS)),
        (seq[run], "prefill", t[run], prefill_end[run], False),
        (seq[run], "decode", prefill_end[run], next_t[run], False),
    ]
    frames = [
        pd.DataFrame({"seq_id": q, "state": st, "start_s": a, "end_s": b, "_drop": d})
        for q, st, a, b, d in parts
    ]
    out = pd.concat(frames, ignore_index=True)
    out = out[~out["_drop"] & (out["end_s"] > out["start_s"])].drop(columns="_drop")
    out = out.sort_values(["seq_id", "start_s"], kind="stable", ignore_index=True)
    out["state"] = pd.Categorical(out["state"], categories=list(STATES))
    return out
