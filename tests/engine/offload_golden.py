"""Read a KV-offload golden step file (recorded from vLLM 0.33.0's OffloadingConnector, see
golden/offload/README.md) into Python structures, and check it is self-consistent.

Chunks are named canonically: "R:C" is chunk C (0-based, in offload chunks of
`tokens_per_chunk` tokens) of request R, the first request in arrival order whose prompt has
that chunk (the same token prefix up to the chunk's end). `parse_chunk` / `chunk_name`
convert. Needs nothing but the standard library (no vLLM).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "golden" / "offload"

Chunk = tuple[str, int]  # (request id, chunk index)


def parse_chunk(name: str) -> Chunk:
    """'r12:3' -> ('r12', 3). The index follows the last colon (request ids may hold one)."""
    request, _, index = name.rpartition(":")
    return request, int(index)


def chunk_name(request: str, index: int) -> str:
    return f"{request}:{index}"


@dataclass(frozen=True)
class TransferJob:
    job: int  # vLLM's job id (loads and stores share one counter)
    kind: str  # "load" (CPU -> GPU) or "store" (GPU -> CPU)
    request: str
    chunks: tuple[Chunk, ...]  # in the request's chunk order
    gpu_blocks: int  # GPU blocks moved; bytes = gpu_blocks x kv_bytes_per_block


@dataclass
class OffloadStep:
    step: int
    start_s: float
    forward_start_s: float  # later than start_s when the step waited for flushed stores
    end_s: float
    num_scheduled_tokens: dict[str, int]
    load_jobs: list[TransferJob]
    store_jobs: list[TransferJob]
    jobs_to_flush: list[int]
    completed_jobs: list[int]  # reported in this step's update
    waiting_for_kv: list[str]  # entered WAITING_FOR_REMOTE_KVS (one load each)
    kv_lookup_delayed: dict[str, str]  # request -> reason the connector answered "not yet"
    local_hit_tokens: dict[str, int]  # for the requests that load: GPU prefix-cache hit
    external_hit_tokens: dict[str, int]  # ... and the tokens loaded from the CPU tier
    cpu_added: set[Chunk]  # inserted (pending) into the CPU tier by this step's stores
    cpu_evicted: set[Chunk]
    cpu_num_chunks: int  # chunks held after the step (ready or pending)
    cpu_chunks: set[Chunk] | None  # full contents, on snapshot steps only
    raw: dict[str, Any] = field(repr=False)  # the whole line (new, resumed, preempted, ...)


@dataclass
class OffloadGolden:
    config: dict[str, Any]  # the driver's config line; config["offload"] has the tier's shape
    steps: list[OffloadStep]
    summary: dict[str, Any]

    @property
    def num_cpu_chunks(self) -> int:
        return int(self.config["offload"]["num_cpu_chunks"])


def _jobs(rows: list[dict[str, Any]], kind: str) -> list[TransferJob]:
    return [
        TransferJob(
            job=int(r["job"]),
            kind=kind,
            request=str(r["request"]),
            chunks=tuple(parse_chunk(c) for c in r["chunks"]),
            gpu_blocks=int(r["gpu_blocks"]),
        )
        for r in rows
    ]


def parse_step(row: dict[str, Any]) -> OffloadStep:
    stores = _jobs(row["store_jobs"], "store")
    if "cpu_added" in row:  # written only where it differs from the store jobs' chunks
        added = {parse_chunk(c) for c in row["cpu_added"]}
    else:
        added = {c for j in stores for c in j.chunks}
    snapshot = row.get("cpu_chunks")
    return OffloadStep(
        step=int(row["step"]),
        start_s=float(row["time"]),  # the driver's step_start_s (dropped as a duplicate)
        forward_start_s=float(row.get("forward_start_s", row["time"])),
        end_s=float(row["step_end_s"]),
        num_scheduled_tokens=dict(row["num_scheduled_tokens"]),
        load_jobs=_jobs(row["load_jobs"], "load"),
        store_jobs=stores,
        jobs_to_flush=list(row["jobs_to_flush"]),
        completed_jobs=list(row["completed_jobs"]),
        waiting_for_kv=list(row["waiting_for_kv"]),
        kv_lookup_delayed=dict(row["kv_lookup_delayed"]),
        local_hit_tokens=dict(row["local_hit_tokens"]),
        external_hit_tokens=dict(row["external_hit_tokens"]),
        cpu_added=added,
        cpu_evicted={parse_chunk(c) for c in row["cpu_evicted"]},
        cpu_num_chunks=int(row["cpu_num_chunks"]),
        cpu_chunks=None if snapshot is None else {parse_chunk(c) for c in snapshot},
        raw=row,
    )


def load_offload_golden(path: Path) -> OffloadGolden:
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return OffloadGolden(rows[0], [parse_step(r) for r in rows[1:-1]], rows[-1])


def check_consistency(golden: OffloadGolden) -> list[str]:
    """Every way the file contradicts itself, as readable lines (empty: consistent).

    Replays the CPU tier from the per-step deltas and checks: each completed job was issued
    at or before the step reporting it, exactly once, and every job completes; a flushed job
    completes in its own step (the forward waited for it); a load reads only chunks whose
    store had been reported complete (ready) before the step; the tier never holds more than
    its capacity and matches every snapshot and the summary's final list; step times are
    ordered; loads match the requests entering WAITING_FOR_REMOTE_KVS."""
    problems: list[str] = []
    issued: dict[int, TransferJob] = {}
    completed: set[int] = set()
    tier: set[Chunk] = set()
    ready: set[Chunk] = set()
    promotions: dict[int, set[Chunk]] = {}
    last_end = 0.0
    bpc = int(golden.config["offload"]["blocks_per_chunk"])
    for s in golden.steps:
        where = f"step {s.step}"
        if not s.start_s >= last_end - 1e-9:
            problems.append(f"{where}: starts at {s.start_s} before the last step ended")
        if not s.start_s <= s.forward_start_s <= s.end_s:
            problems.append(f"{where}: times out of order")
        last_end = s.end_s
        # a disk tier's promotion makes its chunks ready in the CPU tier when it is reported
        # done (in schedule(), before the step's loads are built)
        for e in s.raw.get("disk_jobs", ()):
            if e["event"] == "promotion":
                promotions[e["job"]] = {parse_chunk(c) for c in e["chunks"]}
            elif e["event"] == "done" and e["job"] in promotions:
                ready |= promotions.pop(e["job"])
        for j in s.load_jobs:
            missing = [c for c in j.chunks if c not in ready]
            if missing:
                problems.append(f"{where}: load {j.job} reads chunks not ready: {missing}")
            if j.gpu_blocks > len(j.chunks) * bpc:
                problems.append(f"{where}: load {j.job} moves more blocks than its chunks")
        for j in s.store_jobs:
            if j.gpu_blocks != len(j.chunks) * bpc:
                problems.append(f"{where}: store {j.job} blocks != chunks x blocks_per_chunk")
        for j in [*s.load_jobs, *s.store_jobs]:
            if j.job in issued:
                problems.append(f"{where}: job {j.job} issued twice")
            issued[j.job] = j
        if sorted(s.waiting_for_kv) != sorted(j.request for j in s.load_jobs):
            problems.append(f"{where}: waiting_for_kv does not match the load jobs")
        if set(s.external_hit_tokens) != set(s.waiting_for_kv):
            problems.append(f"{where}: external hits do not match the loading requests")
        # the tier after the step: this step's evictions, then its stores' inserts
        gone = s.cpu_evicted - tier
        if gone:
            problems.append(f"{where}: evicts chunks not held: {sorted(gone)}")
        dup = s.cpu_added & (tier - s.cpu_evicted)
        if dup:
            problems.append(f"{where}: inserts chunks already held: {sorted(dup)}")
        tier = (tier - s.cpu_evicted) | s.cpu_added
        ready -= s.cpu_evicted
        if len(tier) != s.cpu_num_chunks:
            problems.append(
                f"{where}: replayed tier has {len(tier)} chunks, line says {s.cpu_num_chunks}"
            )
        if len(tier) > golden.num_cpu_chunks:
            problems.append(f"{where}: tier holds {len(tier)} > {golden.num_cpu_chunks}")
        if s.cpu_chunks is not None and s.cpu_chunks != tier:
            problems.append(f"{where}: snapshot differs from the replayed tier")
        for job_id in s.completed_jobs:
            if job_id not in issued:
                problems.append(f"{where}: job {job_id} completed but never issued")
            elif job_id in completed:
                problems.append(f"{where}: job {job_id} completed twice")
            else:
                completed.add(job_id)
                j = issued[job_id]
                if j.kind == "store":
                    ready |= set(j.chunks) & tier
        for job_id in s.jobs_to_flush:
            if job_id not in s.completed_jobs:
                problems.append(f"{where}: flushed job {job_id} not completed in its step")
            elif issued[job_id].kind != "store":
                problems.append(f"{where}: flushed job {job_id} is not a store")
    never = sorted(set(issued) - completed)
    if never:
        problems.append(f"jobs never completed: {never}")
    final = {parse_chunk(c) for c in golden.summary["offload"]["final_cpu_chunks"]}
    if final != tier:
        problems.append("the summary's final CPU chunks differ from the replayed tier")
    return problems
