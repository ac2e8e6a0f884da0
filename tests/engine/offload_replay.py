"""Replay a KV-offload golden (recorded from vLLM 0.33.0's OffloadingConnector, see
golden/offload/README.md) through kvsim's OffloadingV1Scheduler and list every difference.

The golden gives, per step, the requests that arrived before it and the transfer jobs the
worker reported done in its update; kvsim gets exactly those, so every difference is a
decision of kvsim's scheduler or connector (what it scheduled, loaded, stored, flushed,
evicted, and what the CPU tier holds), never a timing question. Job ids compare directly:
kvsim numbers its jobs the way vLLM does (one counter, loads at admission, stores at the end
of schedule()).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offload_golden import GOLDEN, Chunk, OffloadGolden, load_offload_golden
from v1_replay import SAMPLED, golden_scheduler_config, load_trace, make_sequence

from engine import BlockManager
from engine.core.sequence import Sequence
from engine.offload.connector import OffloadConfig
from engine.v1.offloading_scheduler import OffloadingV1Scheduler
from engine.v1.prefix_cache import ensure_block_hashes


@dataclass
class OffloadReplay:
    steps_compared: int
    differences: list[str]
    scheduler: OffloadingV1Scheduler


def _chunk_names(rows: list[dict[str, Any]], block_size: int, bpc: int) -> dict[int, Chunk]:
    """Each chunk key -> its canonical name (the first request, in arrival order, whose
    prompt holds it, and its index there)."""
    names: dict[int, Chunk] = {}
    for row in rows:
        seq = make_sequence({**row, "request_id": 0}, block_size)  # a copy to hash
        num_chunks = seq.num_prompt_tokens // (block_size * bpc)
        hashes = ensure_block_hashes(seq, num_chunks * bpc, block_size)
        for i in range(num_chunks):
            names.setdefault(hashes[(i + 1) * bpc - 1], (str(row["request_id"]), i))
    return names


def replay_offload(path: Path, *, max_diffs: int = 20) -> OffloadReplay:
    golden: OffloadGolden = load_offload_golden(path)
    config = golden.config
    rows = load_trace(GOLDEN / config["trace"])
    cc, oc = config["cache_config"], config["offload"]
    bs, bpc = cc["block_size"], oc["blocks_per_chunk"]
    bm = BlockManager(
        cc["num_gpu_blocks"] - 1,
        bs,
        watermark=float(config["scheduler_config"]["watermark"]),
        enable_prefix_caching=cc["enable_prefix_caching"],
    )
    sched = OffloadingV1Scheduler(
        golden_scheduler_config(config),
        bm,
        offload=OffloadConfig(oc["num_cpu_chunks"], bpc, oc["eviction_policy"]),
    )
    names = _chunk_names(rows, bs, bpc)
    seq_of = {str(row["request_id"]): i for i, row in enumerate(rows)}
    name_of = {i: str(row["request_id"]) for i, row in enumerate(rows)}
    diffs: list[str] = []

    def differ(step: int, what: str, got: Any, want: Any) -> None:
        if got != want and len(diffs) < max_diffs:
            diffs.append(f"step {step}: {what}: kvsim {got!r}, vLLM {want!r}")

    def jobs(js: Any) -> list[tuple[int, str, tuple[Chunk, ...], int]]:
        return [
            (j.job_id, name_of[j.seq_id], tuple(names[k] for k in j.keys), len(j.gpu_block_ids))
            for j in js
        ]

    seqs: dict[str, Sequence] = {}
    compared = 0
    for gs in golden.steps:
        for name in gs.raw["arrived"]:
            row = rows[seq_of[name]]
            seq = make_sequence({**row, "request_id": seq_of[name]}, bs)
            seqs[name] = seq
            sched.add_request(seq)
        out = sched.schedule()
        meta = out.connector_meta
        assert meta is not None
        n = gs.step
        differ(
            n,
            "scheduled tokens",
            {name_of[s.seq_id]: t for s, t in zip(out.seqs, out.num_new_tokens)},
            gs.num_scheduled_tokens,
        )
        differ(n, "preempted", [name_of[s.seq_id] for s in out.preempted], gs.raw["preempted"])
        differ(
            n,
            "admitted (computed tokens: prefix hit, or what a load brought)",
            {name_of[s.seq_id]: s.cached_token_count for s in out.admitted},
            {**gs.raw["new"], **gs.raw["resumed"]},
        )
        want_loads = [(j.job, j.request, j.chunks, j.gpu_blocks) for j in gs.load_jobs]
        want_stores = [(j.job, j.request, j.chunks, j.gpu_blocks) for j in gs.store_jobs]
        differ(n, "load jobs", jobs(meta.load_jobs), want_loads)
        differ(n, "store jobs", jobs(meta.store_jobs), want_stores)
        differ(n, "jobs to flush", sorted(meta.jobs_to_flush), sorted(gs.jobs_to_flush))
        loading = {name_of[j.seq_id]: seqs[name_of[j.seq_id]] for j in meta.load_jobs}
        differ(
            n,
            "loads (local hit, loaded tokens)",
            {k: (s.prefix_hit_tokens, s.offload_hit_tokens) for k, s in loading.items()},
            {k: (gs.local_hit_tokens[k], gs.external_hit_tokens[k]) for k in gs.waiting_for_kv},
        )
        differ(
            n, "CPU evictions", sorted(names[k] for k in meta.evicted_keys), sorted(gs.cpu_evicted)
        )
        tier = sched.connector.manager
        differ(n, "CPU tier chunks", tier.num_held, gs.cpu_num_chunks)
        if gs.cpu_chunks is not None:
            held = {names[k] for k in tier.policy.held_keys()}
            differ(n, "CPU tier contents", sorted(held), sorted(gs.cpu_chunks))
        in_flight = [j for j in gs.completed_jobs if sched.connector.has_job(j)]
        differ(n, "completed jobs kvsim knows", in_flight, gs.completed_jobs)
        finished = sched.update(out, [SAMPLED] * len(out.seqs), in_flight)
        differ(
            n, "finished", sorted(name_of[s.seq_id] for s in finished), sorted(gs.raw["finished"])
        )
        compared += 1
    return OffloadReplay(compared, diffs, sched)
