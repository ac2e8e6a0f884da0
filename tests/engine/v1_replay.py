"""Replay a golden step file (recorded from vLLM 0.33.0, see golden/v1/README.md) through
kvsim's v1 scheduler with the reference's logical clock, and list every difference."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import BlockManager, SamplingParams, Scheduler, SchedulerConfig, Sequence
from engine.core.events import EventSink
from engine.v1.prefix_keys import prefix_from_hash_ids

GOLDEN = Path(__file__).parent / "golden" / "v1"
SAMPLED = 7  # the reference's sampled token


@dataclass
class Replay:
    steps_compared: int
    differences: list[str]
    scheduler: Scheduler


def load_golden(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return rows[0], rows[1:-1], rows[-1]


def load_trace(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            if "kvsim_trace" not in row:
                rows.append(row)
    return rows


def option(options: list[str], name: str, default: str | None = None) -> str | None:
    return options[options.index(name) + 1] if name in options else default


def make_sequence(row: dict[str, Any], block_size: int) -> Sequence:
    seq_id = int(row["request_id"])
    params = SamplingParams(max_tokens=int(row["output_tokens"]), ignore_eos=True)
    arrival = float(row["arrival_time_s"])
    priority = int(row.get("priority") or 0)
    if row.get("prompt_token_ids") is not None:
        return Sequence(seq_id, list(row["prompt_token_ids"]), params, arrival, priority)
    num_prompt = int(row["prompt_tokens"])
    prefix = prefix_from_hash_ids(
        row.get("hash_ids"), row.get("hash_block_size"), num_prompt, block_size
    )
    return Sequence(seq_id, range(num_prompt), params, arrival, priority, prefix=prefix)


def replay(name: str, max_diffs: int = 20, event_sink: EventSink | None = None) -> Replay:
    """Replay golden ``name``; ``event_sink`` (e.g. an EventRecorder) receives the engine's
    events."""
    config, golden_steps, _ = load_golden(GOLDEN / f"{name}.steps.jsonl.gz")
    options: list[str] = config["driver_options"]
    trace = load_trace(GOLDEN / config["trace"])
    sc, cc = config["scheduler_config"], config["cache_config"]
    bs = cc["block_size"]
    bm = BlockManager(
        cc["num_gpu_blocks"] - 1,
        bs,
        watermark=float(sc["watermark"]),
        enable_prefix_caching=cc["enable_prefix_caching"],
    )
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=sc["max_num_seqs"],
            max_num_batched_tokens=sc["max_num_batched_tokens"],
            max_model_len=config["max_model_len"],
            scheduler="v1",
            enable_chunked_prefill=sc["enable_chunked_prefill"],
            long_prefill_token_threshold=sc["long_prefill_token_threshold"],
            policy=sc["policy"],
        ),
        bm,
    )
    if event_sink is not None:
        sched.event_sink = bm.event_sink = event_sink
    base = float(option(options, "--step-base-s", "0.005") or 0)
    per_token = float(option(options, "--step-per-token-s", "1e-5") or 0)
    all_at_once = "--all-at-once" in options
    rejected = set(config["rejected"])
    pending = sorted(
        (r for r in trace if r["request_id"] not in rejected),
        key=lambda r: (0.0 if all_at_once else float(r["arrival_time_s"]), trace.index(r)),
    )
    expected = iter(s for s in golden_steps if s["num_scheduled_tokens"])
    diffs: list[str] = []
    now = 0.0
    compared = 0
    seqs: dict[str, Sequence] = {}

    def differ(step: int, what: str, got: Any, want: Any) -> None:
        if got != want and len(diffs) < max_diffs:
            diffs.append(
                f"step {step} ({compared}th compared): {what}: kvsim {got!r} != vLLM {want!r}"
            )

    while True:
        while pending and (all_at_once or float(pending[0]["arrival_time_s"]) <= now):
            row = pending.pop(0)
            seq = make_sequence(row, bs)
            seqs[row["request_id"]] = seq
            sched.add_request(seq)
        if not sched.has_unfinished():
            if not pending:
                break
            now = max(now, float(pending[0]["arrival_time_s"]))
            continue
        held = {s.seq_id: len(s.block_table) for s in sched.running}
        free_before = bm.get_num_free_blocks()
        out = sched.schedule()
        n = out.num_batched_tokens
        if not n:
            finished = sched.update(out, [])
            if finished and any(s.status.name != "FINISHED_REJECTED" for s in finished):
                diffs.append(f"an empty step finished {[s.seq_id for s in finished]}")
            if pending:
                now = max(now, float(pending[0]["arrival_time_s"]))
                continue
            if sched.has_unfinished() and not out.rejected:
                diffs.append(f"kvsim stalled at t={now} with {sched.num_waiting} waiting")
                break
            continue
        want = next(expected, None)
        if want is None:
            diffs.append(f"kvsim scheduled step at t={now} past the golden's last step")
            break
        step = want["step"]
        compared += 1
        differ(step, "time", round(now, 9), want["time"])
        got_tokens = [[str(s.seq_id), k] for s, k in zip(out.seqs, out.num_new_tokens)]
        differ(
            step,
            "scheduled tokens",
            got_tokens,
            [list(kv) for kv in want["num_scheduled_tokens"].items()],
        )
        differ(step, "preempted", sorted(str(s.seq_id) for s in out.preempted), want["preempted"])
        new = {str(s.seq_id): s.prefix_hit_tokens for s in out.admitted if not s.num_preemptions}
        resumed = {str(s.seq_id): s.prefix_hit_tokens for s in out.admitted if s.num_preemptions}
        differ(step, "new (prefix hit tokens)", new, want["new"])
        differ(step, "resumed (prefix hit tokens)", resumed, want["resumed"])
        differ(step, "free blocks before", free_before, want["free_blocks_before"])
        differ(
            step,
            "free blocks after schedule",
            bm.get_num_free_blocks(),
            want["free_blocks_after_schedule"],
        )
        if "block_ids" in want:
            tables = {str(s.seq_id): [b + 1 for b in s.block_table] for s in out.admitted}
            differ(step, "block ids of admitted", tables, want["block_ids"])
            appended = {}
            for s in out.seqs:
                if s.seq_id in held and len(s.block_table) > held[s.seq_id]:
                    appended[str(s.seq_id)] = [b + 1 for b in s.block_table[held[s.seq_id] :]]
            differ(step, "appended block ids", appended, want["appended_block_ids"])
        finished = sched.update(out, [SAMPLED] * out.num_seqs)
        differ(step, "finished", [str(s.seq_id) for s in finished], want["finished"])
        differ(
            step,
            "free blocks after update",
            bm.get_num_free_blocks(),
            want["free_blocks_after_update"],
        )
        differ(
            step,
            "running / waiting",
            (sched.num_running, sched.num_waiting),
            (want["num_running"], want["num_waiting"]),
        )
        now += base + per_token * n
        if len(diffs) >= max_diffs:
            break
    if next(expected, None) is not None and len(diffs) < max_diffs:
        diffs.append("the golden has steps kvsim never scheduled")
    return Replay(compared, diffs, sched)
