"""Replay a golden step file (recorded from vLLM 0.33.0, see golden/v1/README.md) through
kvsim's v1 scheduler with the reference's logical clock, and list every difference.

The replay runs on either path: ``backend="python"`` drives the readable V1Scheduler over a
BlockManager (the specification), ``backend="compiled"`` the compiled V1Core
(engine/compiled). Both are reached through the same few calls (``PythonBackend``,
``CompiledBackend``), so one loop compares both against the golden steps.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine import BlockManager, SamplingParams, Scheduler, SchedulerConfig, Sequence
from engine.core.events import EventSink
from engine.v1.prefix_keys import prefix_from_hash_ids

GOLDEN = Path(__file__).parent / "golden" / "v1"
SAMPLED = 7  # the reference's sampled token
BACKENDS = ("python", "compiled")
Backend = Literal["python", "compiled"]
CHECK_EVERY = 16  # the compiled backend reads every running table each 16th step


@dataclass
class Replay:
    steps_compared: int
    differences: list[str]
    scheduler: Any  # the Python Scheduler, or the compiled V1Core
    backend: PythonBackend | CompiledBackend


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


def golden_scheduler_config(config: dict[str, Any]) -> SchedulerConfig:
    sc = config["scheduler_config"]
    return SchedulerConfig(
        max_num_seqs=sc["max_num_seqs"],
        max_num_batched_tokens=sc["max_num_batched_tokens"],
        max_model_len=config["max_model_len"],
        scheduler="v1",
        enable_chunked_prefill=sc["enable_chunked_prefill"],
        long_prefill_token_threshold=sc["long_prefill_token_threshold"],
        policy=sc["policy"],
    )


@dataclass
class Step:
    """What one schedule() decided, in the terms the golden steps use (seq ids as ints)."""

    tokens: list[tuple[int, int]]  # (seq_id, new tokens), in batch order
    preempted: list[int]
    rejected: list[int]
    admitted: list[tuple[int, int, bool]]  # (seq_id, prefix-hit tokens, resumed)
    num_batched_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_batched_tokens = sum(n for _, n in self.tokens)


class PythonBackend:
    """The readable V1Scheduler over a BlockManager."""

    def __init__(self, config: dict[str, Any], event_sink: EventSink | None = None) -> None:
        sc, cc = config["scheduler_config"], config["cache_config"]
        self.block_size = cc["block_size"]
        self.bm = BlockManager(
            cc["num_gpu_blocks"] - 1,
            self.block_size,
            watermark=float(sc["watermark"]),
            enable_prefix_caching=cc["enable_prefix_caching"],
        )
        self.sched = Scheduler(golden_scheduler_config(config), self.bm)
        if event_sink is not None:
            self.sched.event_sink = self.bm.event_sink = event_sink
        self.seqs: dict[int, Sequence] = {}
        self.out: Any = None

    @property
    def scheduler(self) -> Scheduler:
        return self.sched

    def set_time(self, now: float) -> None:
        pass  # the Python path's events take no time stamp here (its sink has no clock)

    def add(self, row: dict[str, Any]) -> None:
        seq = make_sequence(row, self.block_size)
        self.seqs[seq.seq_id] = seq
        self.sched.add_request(seq)

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished()

    def num_free_blocks(self) -> int:
        return self.bm.get_num_free_blocks()

    def running_tables(self) -> dict[int, int]:
        return {s.seq_id: len(s.block_table) for s in self.sched.running}

    def schedule(self) -> Step:
        out = self.out = self.sched.schedule()
        return Step(
            [(s.seq_id, n) for s, n in zip(out.seqs, out.num_new_tokens)],
            [s.seq_id for s in out.preempted],
            [s.seq_id for s in out.rejected],
            [(s.seq_id, s.prefix_hit_tokens, s.num_preemptions > 0) for s in out.admitted],
        )

    def block_table(self, seq_id: int) -> list[int]:
        return self.seqs[seq_id].block_table

    def update(self) -> list[tuple[int, str]]:
        out, self.out = self.out, None
        finished = self.sched.update(out, [SAMPLED] * out.num_seqs)
        return [(s.seq_id, s.status.value) for s in finished]

    def counts(self) -> tuple[int, int]:
        return self.sched.num_running, self.sched.num_waiting

    def check_end(self) -> None:
        """The pool is sound and empty of holders once everything finished."""
        self.bm.check_invariants()
        assert self.bm.num_used_blocks == 0


class CompiledBackend:
    """The compiled V1Core (engine/compiled), every sampled token ``SAMPLED``."""

    def __init__(self, config: dict[str, Any], event_sink: EventSink | None = None) -> None:
        import engine.compiled

        core = engine.compiled.load()
        if core is None:
            raise RuntimeError(f"compiled core unavailable: {engine.compiled.unavailable_reason()}")
        if event_sink is not None:
            raise ValueError("the compiled backend keeps its events (V1Core.take_events)")
        sc, cc = config["scheduler_config"], config["cache_config"]
        self.block_size = cc["block_size"]
        self.core = core.V1Core.from_config(
            golden_scheduler_config(config),
            cc["num_gpu_blocks"] - 1,
            self.block_size,
            cc["enable_prefix_caching"],
            watermark=float(sc["watermark"]),
            token=SAMPLED,
        )
        # Block-table lengths as last read (replay() reads the table of every request
        # scheduled; a table changes only when its request is scheduled, preempted or
        # finished): reading every running table before each step would copy the Mooncake
        # golden's 7,000-block tables thousands of times. running_tables() checks these
        # against the real tables every CHECK_EVERY steps.
        self.lengths: dict[int, int] = {}
        self.num_steps = 0

    @property
    def scheduler(self) -> Any:
        return self.core

    def set_time(self, now: float) -> None:
        self.core.set_time(now)

    def add(self, row: dict[str, Any]) -> None:
        """As make_sequence: token ids if the row has them, else its hash ids (if any),
        else a unique prompt."""
        seq_id = int(row["request_id"])
        max_tokens = int(row["output_tokens"])
        arrival = float(row["arrival_time_s"])
        priority = int(row.get("priority") or 0)
        c = self.core
        if row.get("prompt_token_ids") is not None:
            c.add_token_request(seq_id, row["prompt_token_ids"], max_tokens, arrival, priority)
        elif row.get("hash_ids"):
            c.add_hash_id_request(
                seq_id, int(row["prompt_tokens"]), row["hash_ids"],
                int(row["hash_block_size"]), max_tokens, arrival, priority,
            )  # fmt: skip
        else:
            c.add_unique_request(seq_id, int(row["prompt_tokens"]), max_tokens, arrival, priority)

    def has_unfinished(self) -> bool:
        return bool(self.core.has_unfinished())

    def num_free_blocks(self) -> int:
        return int(self.core.get_num_free_blocks())

    def running_tables(self) -> dict[int, int]:
        running = self.core.running()
        held = {seq_id: self.lengths[seq_id] for seq_id in running}
        if self.num_steps % CHECK_EVERY == 0:
            real = {seq_id: len(self.block_table(seq_id)) for seq_id in running}
            assert real == held, f"a table changed while its request was not scheduled: {real}"
        return held

    def schedule(self) -> Step:
        c = self.core
        self.num_steps += 1
        c.schedule()
        ids, tokens = c.scheduled()
        admitted = []
        for seq_id, hits in c.admitted():
            state = c.request(seq_id)
            assert state is not None
            admitted.append((seq_id, hits, state["num_preemptions"] > 0))
        return Step(list(zip(ids, tokens)), c.preempted(), c.rejected(), admitted)

    def block_table(self, seq_id: int) -> list[int]:
        state = self.core.request(seq_id)
        assert state is not None, f"request {seq_id} is not held"
        table: list[int] = state["block_table"]
        self.lengths[seq_id] = len(table)
        return table

    def update(self) -> list[tuple[int, str]]:
        return [(seq_id, status) for seq_id, status, _ in self.core.update()]

    def counts(self) -> tuple[int, int]:
        return self.core.num_running, self.core.num_waiting

    def check_end(self) -> None:
        """Every block is back in the free queue once everything finished."""
        c = self.core
        assert c.num_used_blocks == 0 and c.num_cached_tokens == 0
        assert sorted(c.free_queue()) == list(range(c.num_blocks))
        assert c.running() == [] and c.waiting() == []


def make_backend(
    backend: Backend, config: dict[str, Any], event_sink: EventSink | None = None
) -> PythonBackend | CompiledBackend:
    if backend == "python":
        return PythonBackend(config, event_sink)
    if backend == "compiled":
        return CompiledBackend(config, event_sink)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def replay(
    name: str,
    max_diffs: int = 20,
    event_sink: EventSink | None = None,
    backend: Backend = "python",
) -> Replay:
    """Replay golden ``name`` on ``backend`` ("python" or "compiled"); ``event_sink`` (e.g.
    an EventRecorder, Python backend only) receives the engine's events."""
    config, golden_steps, _ = load_golden(GOLDEN / f"{name}.steps.jsonl.gz")
    options: list[str] = config["driver_options"]
    trace = load_trace(GOLDEN / config["trace"])
    sched = make_backend(backend, config, event_sink)
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

    def differ(step: int, what: str, got: Any, want: Any) -> None:
        if got != want and len(diffs) < max_diffs:
            diffs.append(
                f"step {step} ({compared}th compared): {what}: kvsim {got!r} != vLLM {want!r}"
            )

    while True:
        sched.set_time(now)
        while pending and (all_at_once or float(pending[0]["arrival_time_s"]) <= now):
            sched.add(pending.pop(0))
        if not sched.has_unfinished():
            if not pending:
                break
            now = max(now, float(pending[0]["arrival_time_s"]))
            continue
        held = sched.running_tables()
        free_before = sched.num_free_blocks()
        out = sched.schedule()
        n = out.num_batched_tokens
        if not n:
            finished = sched.update()
            if any(status != "finished_rejected" for _, status in finished):
                diffs.append(f"an empty step finished {[seq_id for seq_id, _ in finished]}")
            if pending:
                now = max(now, float(pending[0]["arrival_time_s"]))
                continue
            if sched.has_unfinished() and not out.rejected:
                diffs.append(f"kvsim stalled at t={now} with {sched.counts()[1]} waiting")
                break
            continue
        want = next(expected, None)
        if want is None:
            diffs.append(f"kvsim scheduled step at t={now} past the golden's last step")
            break
        step = want["step"]
        compared += 1
        differ(step, "time", round(now, 9), want["time"])
        got_tokens = [[str(seq_id), k] for seq_id, k in out.tokens]
        differ(
            step,
            "scheduled tokens",
            got_tokens,
            [list(kv) for kv in want["num_scheduled_tokens"].items()],
        )
        differ(
            step, "preempted", sorted(str(seq_id) for seq_id in out.preempted), want["preempted"]
        )
        new = {str(seq_id): hits for seq_id, hits, resumed in out.admitted if not resumed}
        resumed_hits = {str(seq_id): hits for seq_id, hits, resumed in out.admitted if resumed}
        differ(step, "new (prefix hit tokens)", new, want["new"])
        differ(step, "resumed (prefix hit tokens)", resumed_hits, want["resumed"])
        differ(step, "free blocks before", free_before, want["free_blocks_before"])
        differ(
            step,
            "free blocks after schedule",
            sched.num_free_blocks(),
            want["free_blocks_after_schedule"],
        )
        tables = {
            str(seq_id): [b + 1 for b in sched.block_table(seq_id)] for seq_id, _, _ in out.admitted
        }
        appended = {}
        for seq_id, _ in out.tokens:
            if seq_id in held:
                table = sched.block_table(seq_id)
                if len(table) > held[seq_id]:
                    appended[str(seq_id)] = [b + 1 for b in table[held[seq_id] :]]
        if "block_ids" in want:
            differ(step, "block ids of admitted", tables, want["block_ids"])
            differ(step, "appended block ids", appended, want["appended_block_ids"])
        finished = sched.update()
        differ(step, "finished", [str(seq_id) for seq_id, _ in finished], want["finished"])
        differ(
            step,
            "free blocks after update",
            sched.num_free_blocks(),
            want["free_blocks_after_update"],
        )
        differ(
            step, "running / waiting", sched.counts(), (want["num_running"], want["num_waiting"])
        )
        now += base + per_token * n
        if len(diffs) >= max_diffs:
            break
    if next(expected, None) is not None and len(diffs) < max_diffs:
        diffs.append("the golden has steps kvsim never scheduled")
    return Replay(compared, diffs, sched.scheduler, sched)
