"""Views of a KV offloading run's tables (docs/metrics.md, "KV offloading"): its transfers
rebuilt from ``events.parquet``, and the TTFT of the requests that loaded, split.

Each load or store is an ``OFFLOAD_LOAD`` / ``OFFLOAD_STORE`` row per GPU block when the
scheduler issues it and an ``OFFLOAD_LOAD_DONE`` / ``OFFLOAD_STORE_DONE`` row per block when it
sees the transfer complete (a step's completions are polled after its forward launch, so at
step granularity). A GPU block is held by at most one transfer at a time (vLLM keeps a stored
block until its store is done; a loaded block belongs to the loading request), so the k-th issue
of a block pairs with its k-th completion.

- ``transfer_intervals``: one row per (transfer, GPU block): when the block was being stored or
  loaded (the occupancy map's offload layer).
- ``transfer_jobs``: one row per transfer: direction, seq_id, issue and completion (s), blocks.
- ``ttft_split``: the TTFT of each request that loaded at its first admission, as queueing,
  loading and computing; ``loading_share``: the loading part of their TTFT, all together.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.analysis.loading_share import loading_share

__all__ = ["loading_share", "transfer_intervals", "transfer_jobs", "ttft_split"]

# Issue kind -> completion kind, by direction.
DIRECTIONS = {
    "store": ("OFFLOAD_STORE", "OFFLOAD_STORE_DONE"),
    "load": ("OFFLOAD_LOAD", "OFFLOAD_LOAD_DONE"),
}
OFFLOAD_KINDS = tuple(kind for pair in DIRECTIONS.values() for kind in pair)


def has_offload_events(events: pd.DataFrame | None) -> bool:
    """Whether ``events`` holds any offload transfer row."""
    return events is not None and bool(events["kind"].isin(OFFLOAD_KINDS).any())


def _rank(blocks: np.ndarray) -> np.ndarray:
    """Each row's occurrence number among the rows of its block, in stream order."""
    order = np.argsort(blocks, kind="stable")
    ordered = blocks[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[starts, len(blocks)])
    rank = np.empty(len(blocks), dtype=np.int64)
    rank[order] = np.arange(len(blocks)) - np.repeat(starts, sizes)
    return rank


def transfer_intervals(events: pd.DataFrame, end_s: float | None = None) -> pd.DataFrame:
    """One row per (transfer, GPU block): direction ("store" or "load"), block_id, seq_id,
    start_s (issued), end_s (completion seen; ``end_s``, default the last event, for one
    still in flight when the events stop). Sorted by start_s."""
    if end_s is None:
        end_s = float(events["time_s"].max()) if len(events) else 0.0
    kind = events["kind"]  # compared as it is: a categorical column is not turned into strings
    blocks = events["block_id"].to_numpy(np.int64)
    times = events["time_s"].to_numpy(np.float64)
    seqs = events["seq_id"].to_numpy(np.int64)
    frames = []
    for direction, (issue_kind, done_kind) in DIRECTIONS.items():
        issued = (kind == issue_kind).to_numpy()
        done = (kind == done_kind).to_numpy()
        bi, bd = blocks[issued], blocks[done]
        ri, rd = _rank(bi), _rank(bd)
        # the k-th issue of a block pairs with its k-th completion: match (block, k) keys
        scale = max(len(bi), len(bd)) + 1
        key_i, key_d = bi * scale + ri, bd * scale + rd
        order = np.argsort(key_d, kind="stable")
        sorted_d = key_d[order]
        at = np.minimum(np.searchsorted(sorted_d, key_i), max(len(sorted_d) - 1, 0))
        found = (at < len(sorted_d)) & (sorted_d[at] == key_i) if len(sorted_d) else at < 0
        ends = np.where(found, times[done][order][at] if len(sorted_d) else end_s, end_s)
        columns = {
            "direction": direction,
            "block_id": bi,
            "seq_id": seqs[issued],
            "start_s": times[issued],
            "end_s": ends.astype(np.float64),
        }
        frames.append(pd.DataFrame(columns))
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["start_s", "block_id"], kind="stable", ignore_index=True)


def transfer_jobs(events: pd.DataFrame, end_s: float | None = None) -> pd.DataFrame:
    """One row per transfer: direction, seq_id, start_s (issued), end_s (completion seen by
    the scheduler), held_s (end_s - start_s: how long its GPU blocks were held by it) and
    blocks (GPU blocks moved). A job is the blocks of one request issued at one instant in one
    direction that completed together."""
    intervals = transfer_intervals(events, end_s)
    keys = ["direction", "seq_id", "start_s", "end_s"]
    jobs = intervals.groupby(keys, sort=False).size().reset_index(name="blocks")
    jobs["held_s"] = jobs["end_s"] - jobs["start_s"]
    return jobs.sort_values("start_s", kind="stable", ignore_index=True)


def ttft_split(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests that loaded from the CPU tier at their first admission
    (``offload_hit_tokens`` > 0) and have a first token: seq_id, queueing (arrival to the load's
    issue), loading (issue to admission), computing (admission to first token) and ttft (s;
    the three sum to it), sorted by ttft."""
    r = requests[requests["offload_hit_tokens"] > 0].dropna(
        subset=["offload_load_start_s", "admit_time_s", "first_token_time_s"]
    )
    start, admit = r["offload_load_start_s"], r["admit_time_s"]
    out = pd.DataFrame(
        {"seq_id": r["seq_id"], "queueing": start - r["arrival_time_s"],
         "loading": admit - start, "computing": r["first_token_time_s"] - admit}
    )  # fmt: skip
    out["ttft"] = out["queueing"] + out["loading"] + out["computing"]
    return out.sort_values("ttft", kind="stable", ignore_index=True)
