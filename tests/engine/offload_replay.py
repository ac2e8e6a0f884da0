"""Replay a KV-offload golden (recorded from vLLM 0.33.0's OffloadingConnector, see
golden/offload/README.md) through kvsim's OffloadingV1Scheduler and list every difference.

By default the golden gives, per step, the requests that arrived before it and the transfer
jobs the worker reported done in its update; kvsim gets exactly those, so every difference is
a decision of kvsim's scheduler or connector (what it scheduled, loaded, stored, flushed,
evicted, and what the CPU tier holds), never a timing question. With ``own_clock`` kvsim keeps
its own time instead, as its simulator does (the reference's step times, kvsim's
OffloadWorker on a TransferLink with the golden's link): then arrivals, step start times,
flush waits and which completions each step reports are compared too. Job ids compare
directly: kvsim numbers its jobs the way vLLM does (one counter, loads at admission, stores
at the end of schedule()).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from offload_golden import GOLDEN, Chunk, OffloadGolden, load_offload_golden
from v1_replay import (
    SAMPLED,
    CompiledBackend,
    golden_scheduler_config,
    load_trace,
    make_sequence,
)

from engine import BlockManager
from engine.core.scheduler_output import TransferJob
from engine.core.sequence import Sequence
from engine.offload.connector import OffloadConfig
from engine.offload.cpu_manager import make_cpu_tier
from engine.offload.secondary_tier import SecondaryTierConfig
from engine.offload.transfer import make_transfer_link
from engine.offload.worker import OffloadWorker
from engine.v1.offloading_scheduler import OffloadingV1Scheduler
from engine.v1.prefix_cache import ensure_block_hashes


@dataclass
class OffloadReplay:
    steps_compared: int
    differences: list[str]
    scheduler: Any  # OffloadingV1Scheduler, or CoreScheduler


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


# What each backend replays with: the readable CPUOffloadManager and TransferLink, or the
# compiled CpuTier (csrc/offload_tier.hpp) and CompiledTransferLink (csrc/transfer_link.hpp)
# behind the same connector, worker and scheduler, or the compiled offloading scheduler and
# connector themselves (OffloadV1Core: csrc/v1_offload_passes.hpp, offload_connector.hpp;
# the worker on kvsim's own clock stays the Python one over the compiled link).
BACKENDS = ("python", "compiled-parts", "compiled-core")


class _Seq:
    """What the replay reads of a request the compiled core schedules."""

    def __init__(self, core: Any, seq_id: int) -> None:
        self.seq_id = seq_id
        hits = core.offload_hits(seq_id)  # read when the step is decided
        self.prefix_hit_tokens, self.offload_hit_tokens, self.cached_token_count = hits or (0, 0, 0)


class CoreScheduler:
    """OffloadV1Core (engine/compiled) behind the few calls the replay makes of an
    OffloadingV1Scheduler: schedule() and update() give objects with the same fields."""

    def __init__(self, config: Any, bm: BlockManager, offload: OffloadConfig) -> None:
        import engine.compiled

        core_module = engine.compiled.load()
        assert core_module is not None
        self.core = core_module.OffloadV1Core.from_config(
            config, bm.num_blocks, bm.block_size, bm.enable_prefix_caching,
            watermark=bm.watermark, token=SAMPLED,
        )  # fmt: skip
        self.core.enable_offload(offload.num_chunks, offload.blocks_per_chunk, offload.policy)
        self.connector = SimpleNamespace(
            manager=self, has_job=self.core.has_job, tiering=None
        )  # the tier's and connector's queries, answered here

    @property
    def num_held(self) -> int:
        return int(self.core.tier_num_held)

    @property
    def num_evicted(self) -> int:
        return int(self.core.tier_num_evicted)

    def held_keys(self) -> list[int]:
        return list(self.core.tier_held_keys())

    def has_unfinished(self) -> bool:
        return bool(self.core.has_unfinished())

    def add_request(self, seq: Sequence) -> None:
        """A token-id request (as offload_drive makes them), arriving now."""
        self.core.set_time(seq.arrival_time)
        max_tokens = seq.sampling_params.max_tokens
        self.core.add_token_request(
            seq.seq_id, list(seq.prompt_token_ids), max_tokens, seq.arrival_time
        )

    def add_row(self, row: dict[str, Any]) -> None:
        """A trace row, as make_sequence reads it (v1_replay.CompiledBackend.add's rules)."""
        CompiledBackend.add(self, row)  # type: ignore[arg-type]  # it reads .core only

    def schedule(self) -> SimpleNamespace:
        core = self.core
        step = core.schedule()
        ids, tokens = core.scheduled()
        meta = core.offload_meta()
        return SimpleNamespace(
            seqs=[_Seq(core, i) for i in ids],
            num_new_tokens=tokens,
            num_batched_tokens=step[1],
            is_empty=not ids,
            rejected=core.rejected(),
            preempted=[SimpleNamespace(seq_id=i) for i in core.preempted()],
            admitted=[_Seq(core, i) for i, _hits in core.admitted()],
            connector_meta=SimpleNamespace(
                load_jobs=[TransferJob(*j) for j in meta["load_jobs"]],
                store_jobs=[TransferJob(*j) for j in meta["store_jobs"]],
                jobs_to_flush=meta["jobs_to_flush"],
                evicted_keys=meta["evicted_keys"],
            ),
        )

    def update(self, out: Any, sampled: list[int], completed: list[int]) -> list[Any]:
        return [SimpleNamespace(seq_id=f[0]) for f in self.core.update_offload(completed)]


def replay_offload(
    path: Path, *, max_diffs: int = 20, own_clock: bool = False, backend: str = "python"
) -> OffloadReplay:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
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
    offload = OffloadConfig(
        oc["num_cpu_chunks"], bpc, oc["eviction_policy"], secondary_tiers=_disk_tiers(oc)
    )
    sched: Any
    if backend == "compiled-core":
        if offload.secondary_tiers:
            raise ValueError("the compiled core has no secondary tiers (they run on Python)")
        sched = CoreScheduler(golden_scheduler_config(config), bm, offload)
    else:
        sched = OffloadingV1Scheduler(golden_scheduler_config(config), bm, offload=offload)
    tiering = sched.connector.tiering
    if tiering is not None:
        tiering.log = []
    elif backend != "compiled-core":  # with secondary tiers the CPU tier stays the Python one
        sched.connector.manager = make_cpu_tier(
            oc["num_cpu_chunks"], oc["eviction_policy"], compiled=backend == "compiled-parts"
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
    worker = OffloadWorker(
        make_transfer_link(
            oc["read_bytes_per_s"],
            oc["write_bytes_per_s"],
            oc["link_latency_s"],
            compiled=backend != "python",
        ),
        oc["kv_bytes_per_block"],
    )
    base_s, per_token_s = _step_time(config)
    now, next_row = 0.0, 0
    for gs in golden.steps:
        n = gs.step
        if own_clock:
            if not sched.has_unfinished() and next_row < len(rows):
                now = max(now, rows[next_row]["arrival_time_s"])  # idle until an arrival
            differ(n, "start time", round(now, 9), round(gs.start_s, 9))
            arrived = []
            while next_row < len(rows) and rows[next_row]["arrival_time_s"] <= now:
                arrived.append(str(rows[next_row]["request_id"]))
                next_row += 1
            differ(n, "arrived", arrived, gs.raw["arrived"])
        else:
            arrived = gs.raw["arrived"]
        for name in arrived:
            row = rows[seq_of[name]]
            seq = make_sequence({**row, "request_id": seq_of[name]}, bs)
            seqs[name] = seq
            if backend == "compiled-core":
                sched.add_row({**row, "request_id": seq_of[name]})
            else:
                sched.add_request(seq)
        if tiering is not None:  # the disk tier's clock: the schedule() time
            tiering.now = now if own_clock else gs.raw["disk_clock"][0]
        out = sched.schedule()
        meta = out.connector_meta
        assert meta is not None
        completed = gs.completed_jobs
        if own_clock:
            forward = worker.start_step(meta, now)
            differ(n, "forward start", round(forward, 9), round(gs.forward_start_s, 9))
            if out.num_batched_tokens:
                completed = worker.poll(forward)
                now = forward + base_s + per_token_s * out.num_batched_tokens
            else:
                now = forward
                due = worker.next_completion_time()
                tier_due = tiering.next_event_time() if tiering is not None else None
                if tier_due is not None:
                    due = tier_due if due is None else min(due, tier_due)
                if not meta.store_jobs and due is not None:
                    arrival = rows[next_row]["arrival_time_s"] if next_row < len(rows) else due
                    now = max(now, min(due, arrival))
                completed = worker.poll(now)
            differ(n, "completed jobs", sorted(completed), sorted(gs.completed_jobs))
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
        loading = {
            name_of[j.seq_id]: seqs[name_of[j.seq_id]]
            if backend != "compiled-core"
            else _Seq(sched.core, j.seq_id)
            for j in meta.load_jobs
        }
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
            held = {names[k] for k in tier.held_keys()}
            differ(n, "CPU tier contents", sorted(held), sorted(gs.cpu_chunks))
        in_flight = [j for j in completed if sched.connector.has_job(j)]
        differ(n, "completed jobs kvsim knows", in_flight, completed)
        if tiering is not None:  # update_from_output's time: the step's end
            tiering.now = now if own_clock else gs.raw["disk_clock"][1]
        finished = sched.update(out, [SAMPLED] * len(out.seqs), in_flight)
        if tiering is not None:
            _compare_disk(n, tiering, gs.raw, names, name_of, differ)
        done = sorted(name_of[s.seq_id] for s in finished)
        differ(n, "finished", done, sorted(gs.raw["finished"]))
        compared += 1
        idle = own_clock and not out.num_batched_tokens and not worker.has_work()
        idle = idle and (tiering is None or tiering.next_event_time() is None)
        if idle and not in_flight and next_row < len(rows) and not out.preempted:
            now = max(now, rows[next_row]["arrival_time_s"])  # idle until an arrival
    return OffloadReplay(compared, diffs, sched)


def _disk_tiers(oc: dict[str, Any]) -> tuple[SecondaryTierConfig, ...]:
    """The golden's disk tier (the driver's TimedFsTier: vLLM's fs tier has no capacity)."""
    tiers = oc["kv_connector_extra_config"].get("secondary_tiers", ())
    return tuple(
        SecondaryTierConfig(
            "disk",
            1 << 62,
            oc["disk_chunk_bytes"],
            t["read_gbps"] * 1e9,
            t["write_gbps"] * 1e9,
            t["latency_us"] * 1e-6,
        )
        for t in tiers
    )


def _compare_disk(
    n: int, tiering: Any, raw: dict[str, Any], names: dict[int, Chunk], name_of: Any, differ: Any
) -> None:
    """The disk tier's jobs this step (promotions, completions reported, cascades, in
    order), how many chunks it holds and, on snapshot steps, which."""
    got = []
    for event, job_id, seq_id, keys in tiering.log:
        if event == "done":
            got.append({"event": event, "job": job_id})
        else:
            chunks = sorted(f"{c[0]}:{c[1]}" for c in (names[k] for k in keys))
            got.append(
                {"event": event, "job": job_id, "request": name_of[seq_id], "chunks": chunks}
            )
    tiering.log.clear()
    want = [{**j, "chunks": sorted(j["chunks"])} if "chunks" in j else j for j in raw["disk_jobs"]]
    differ(n, "disk jobs", got, want)
    disk = tiering.tiers[0]
    differ(n, "disk chunks", disk.num_held - disk._reserved, raw["disk_num_chunks"])
    if "disk_chunks" in raw:
        held = sorted(f"{c[0]}:{c[1]}" for c in (names[k] for k in disk.stored_keys()))
        differ(n, "disk contents", held, sorted(raw["disk_chunks"]))


def _step_time(config: dict[str, Any]) -> tuple[float, float]:
    """The reference's logical step time, base + per token (s): its time_model line."""
    model = config["time_model"].removeprefix("dt = ").removesuffix(" * num_scheduled_tokens")
    base, per_token = model.split(" + ")
    return float(base), float(per_token)
