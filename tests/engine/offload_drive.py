"""Drive a V1Scheduler with a CPU offload tier the way kvsim's simulator does (the worker's
submissions, flush waits and polls on a logical clock: a step lasts BASE + PER_TOKEN x its
tokens), for the offload tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offload_replay import CoreScheduler

from engine import BlockManager, SamplingParams, SchedulerConfig, Sequence
from engine.offload.connector import OffloadConfig
from engine.offload.cpu_manager import make_cpu_tier
from engine.offload.transfer import make_transfer_link
from engine.offload.worker import OffloadWorker
from engine.v1.offloading_scheduler import OffloadingV1Scheduler
from engine.v1.scheduler import V1Scheduler

BASE_S, PER_TOKEN_S = 0.005, 1e-5


@dataclass
class StepRecord:
    time_s: float
    tokens: list[tuple[int, int]]  # (seq_id, scheduled tokens)
    admitted: list[tuple[int, int, int]]  # (seq_id, prefix hit tokens, offload hit tokens)
    loads: list[tuple[int, tuple[int, ...]]]  # (seq_id, chunk keys)
    stores: list[tuple[int, tuple[int, ...]]]
    flushed: list[int]
    completed: list[int]
    preempted: list[int]


@dataclass
class Drive:
    sched: Any  # V1Scheduler, or OffloadingV1Scheduler with a tier
    worker: OffloadWorker | None
    seqs: list[Sequence]
    steps: list[StepRecord] = field(default_factory=list)
    end_s: float = 0.0
    # after each step, with record_tier: (chunks held, evicted so far, held keys sorted)
    tier: list[tuple[int, int, list[int]]] = field(default_factory=list)


def make_seq(seq_id: int, prompt: list[int], max_tokens: int, arrival: float) -> Sequence:
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival)


def drive(
    requests: list[tuple[list[int], int, float]],
    *,
    num_blocks: int,
    block_size: int = 4,
    num_chunks: int | None = 16,
    blocks_per_chunk: int = 1,
    policy: str = "lru",
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 64,
    bytes_per_block: int = 1000,
    bandwidth: float = 1e6,
    latency_s: float = 0.0,
    check: bool = True,
    max_steps: int = 20_000,
    compiled: bool | None = None,
    record_tier: bool = False,
    core: bool = False,
) -> Drive:
    """Replay ``requests`` ((prompt, output tokens, arrival s) each, in arrival order) with a
    tier of ``num_chunks`` chunks (None: no offloading). ``compiled``: the CPU tier's and
    the link's implementation (make_cpu_tier's and make_transfer_link's: None = compiled
    when built); ``core``: the compiled offloading scheduler and connector themselves
    (OffloadV1Core, through offload_replay.CoreScheduler), the worker on the compiled link."""
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, scheduler="v1"
    )
    offload = None if num_chunks is None else OffloadConfig(num_chunks, blocks_per_chunk, policy)
    sched: V1Scheduler
    worker = None
    if offload is None:
        sched = V1Scheduler(config, bm)
    elif core:
        sched = CoreScheduler(config, bm, offload)  # type: ignore[assignment]
        worker = OffloadWorker(make_transfer_link(bandwidth, bandwidth, latency_s), bytes_per_block)
    else:
        sched = OffloadingV1Scheduler(config, bm, offload=offload)
        sched.connector.manager = make_cpu_tier(offload.num_chunks, policy, compiled=compiled)
        link = make_transfer_link(bandwidth, bandwidth, latency_s, compiled=compiled)
        worker = OffloadWorker(link, bytes_per_block)
    seqs = [make_seq(i, p, n, t) for i, (p, n, t) in enumerate(requests)]
    result = Drive(sched, worker, seqs)
    now, k = 0.0, 0
    for _ in range(max_steps):
        if k == len(seqs) and not sched.has_unfinished():
            break
        while k < len(seqs) and seqs[k].arrival_time <= now:
            sched.add_request(seqs[k])
            k += 1
        out = sched.schedule()
        completed: list[int] = []
        meta = out.connector_meta
        if worker is not None and meta is not None:
            now = worker.start_step(meta, now)
            if out.is_empty and not out.rejected and not out.preempted and not meta.store_jobs:
                due = [t for t in (worker.next_completion_time(),) if t is not None]
                if k < len(seqs):
                    due.append(seqs[k].arrival_time)
                if due:
                    now = max(now, min(due))
            completed = worker.poll(now)
        result.steps.append(
            StepRecord(
                now,
                [(s.seq_id, n) for s, n in zip(out.seqs, out.num_new_tokens)],
                [(s.seq_id, s.prefix_hit_tokens, s.offload_hit_tokens) for s in out.admitted],
                [] if meta is None else [(j.seq_id, j.keys) for j in meta.load_jobs],
                [] if meta is None else [(j.seq_id, j.keys) for j in meta.store_jobs],
                [] if meta is None else sorted(meta.jobs_to_flush),
                completed,
                [s.seq_id for s in out.preempted],
            )
        )
        extra = () if worker is None else (completed,)
        if out.is_empty:
            sched.update(out, [], *extra)
            if worker is None and k < len(seqs) and not out.preempted and not out.rejected:
                now = max(now, seqs[k].arrival_time)
        else:
            now += BASE_S + PER_TOKEN_S * out.num_batched_tokens
            sched.update(out, [7] * len(out.seqs), *extra)
        if check and not core:
            bm.check_invariants()
            if isinstance(sched, OffloadingV1Scheduler):
                manager = sched.connector.manager
                assert 0 <= manager.num_held <= manager.num_chunks
        if record_tier and offload is not None:
            manager = sched.connector.manager
            result.tier.append((manager.num_held, manager.num_evicted, sorted(manager.held_keys())))
    else:
        raise AssertionError(f"not done after {max_steps} steps")
    result.end_s = now
    return result
