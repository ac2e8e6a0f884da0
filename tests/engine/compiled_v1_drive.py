"""Drives the Python V1Scheduler and the compiled V1Core (engine/compiled) side by side.

``Pair`` gives both the same requests, steps, aborts and clock, every sampled token the same
placeholder id, and compares after every step what each decided and counts
(tests/engine/test_compiled_v1.py says what). Import this module only once
``engine.compiled.load()`` has returned the extension.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    Sequence,
    SequenceStatus,
)
from engine.compiled import _core as core
from engine.v1.prefix_keys import prefix_from_hash_ids
from kvsim.sim.executor import _counts
from kvsim.sim.simulation import prefill_tokens
from tests.engine.compiled_drive import python_free_queue

Op = tuple[str, int, int, int, int]
TOKEN = 7  # every step samples this id (a token-keyed request's generated blocks share it)
SOURCE_KINDS = ("tokens", "hash_ids", "unique")


class OperationStream:
    """What a lockstep pair does with an operation stream (``random_ops``): its ``add``,
    ``step``, ``abort`` and ``tick`` on both sides, and the Python ``py`` and compiled
    ``core`` schedulers run to the end (ClassicPair in compiled_classic_drive.py too)."""

    py: Scheduler
    core: Any
    next_id: int  # requests added so far (seq ids 0 .. next_id - 1)
    num_steps: int
    now: float  # the clock both sides' events are stamped with
    token: int  # what every step samples

    def add(self, a: int, b: int, c: int, d: int) -> None:
        raise NotImplementedError

    def schedule_both(self) -> SchedulerOutput:
        """Schedule a step on both and check they decided alike; the Python side's output."""
        raise NotImplementedError

    def step(self, mid: Op | Callable[[], None] | None = None) -> None:
        """One schedule / update on both; ``mid`` (an add or abort, or a function that acts
        on both) runs between them."""
        self.num_steps += 1
        out = self.schedule_both()
        self.compare()
        if callable(mid):
            mid()
        elif mid is not None:
            self.apply(mid)
        done = self.py.update(out, [self.token] * len(out.seqs))
        got = self.core.update()
        want = [(s.seq_id, s.status.value, s.finish_reason) for s in done]
        assert got == want, (got, want)
        self.compare()

    def abort(self, a: int) -> None:
        seq_id = a % max(self.next_id, 1)
        assert self.core.abort(seq_id) == self.py.abort(seq_id)

    def tick(self, dt: float) -> None:
        self.now += dt
        self.core.set_time(self.now)

    def apply(self, op: Op) -> None:
        name, a, b, c, d = op
        if name == "add":
            self.add(a, b, c, d)
        elif name == "step":
            for _ in range(a % 4 + 1):
                self.step()
        elif name == "abort":
            self.abort(a)
        elif name == "abort_mid":
            self.step(("abort", a, 0, 0, 0))
        elif name == "add_mid":
            self.step(("add", a, b, c, d))
        elif name == "tick":
            self.tick(a / 8)

    def drain(self, max_steps: int = 200_000) -> None:
        for _ in range(max_steps):
            if not self.py.has_unfinished():
                assert not self.core.has_unfinished()
                return
            self.step()
        raise AssertionError(f"unfinished after {max_steps} steps")

    def compare_events(self) -> None:
        raise NotImplementedError

    def compare(self, deep: bool | None = None) -> None:
        raise NotImplementedError

    def finish_or_abort(self, max_steps: int) -> None:
        """Run on to the end, or abort on both what is left after ``max_steps`` steps; then
        nothing is unfinished and both recorded the same events (a state machine's end)."""
        for _ in range(max_steps):
            if not self.py.has_unfinished():
                break
            self.step()
        for seq_id in range(self.next_id):
            assert self.core.abort(seq_id) == self.py.abort(seq_id)
        self.compare(deep=True)
        assert not self.core.has_unfinished() and not self.py.has_unfinished()
        self.compare_events()

    def run_stream(self, ops: list[Op]) -> None:
        """Apply ``ops``, run both to the end, and compare their events."""
        for op in ops:
            self.apply(op)
        self.drain()
        self.compare_events()


class Pair(OperationStream):
    """A Python V1Scheduler over a BlockManager and a V1Core, driven in lockstep."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self.setup = setup
        self.bs = bs = setup["block_size"]
        self.now = 0.0
        sink = setup["sink"]
        self.recorder = None
        if sink != "none":
            self.recorder = EventRecorder(
                clock=lambda: self.now,
                keep_block_hashes=True,
                prefix_cache_events=sink == "events",
            )
        self.bm = BlockManager(
            setup["num_blocks"],
            bs,
            setup["watermark"],
            event_sink=self.recorder,
            enable_prefix_caching=setup["caching"],
        )
        config = SchedulerConfig(
            scheduler="v1",
            max_num_seqs=setup["max_num_seqs"],
            max_num_batched_tokens=setup["max_num_batched_tokens"],
            max_model_len=setup["max_model_len"],
            enable_chunked_prefill=setup["chunked"],
            long_prefill_token_threshold=setup["threshold"],
            policy=setup["policy"],
        )
        self.py = Scheduler(config, self.bm)
        self.core = core.V1Core.from_config(
            config, setup["num_blocks"], bs, setup["caching"],
            watermark=setup["watermark"], token=TOKEN,
            record_events=sink != "none", prefix_cache_events=sink == "events",
        )  # fmt: skip
        rng = random.Random(setup["seed"])
        self.token_bases = [[rng.randrange(50) for _ in range(6 * bs + 7)] for _ in range(3)]
        self.id_bases = [[rng.randrange(1 << 62) for _ in range(8)] for _ in range(3)]
        self.next_id = 0
        self.num_steps = 0
        self.token = TOKEN

    # --- operations -----------------------------------------------------------------------

    def add(self, a: int, b: int, c: int, d: int) -> None:
        setup, bs, seq_id = self.setup, self.bs, self.next_id
        self.next_id += 1
        kind = setup["kinds"][a % len(setup["kinds"])]
        max_tokens = 1 + d % setup["max_output"]
        length = (1 + c % 4) * bs + (c // 4 % bs if c % 3 else 0)
        if c % 13 == 0:
            length += setup["num_blocks"] * bs // 2  # some never fit, some only alone
        own = d % 4 == 0  # a part nobody shares after the shared one
        priority = b % 3 if setup["policy"] == "priority" else 0
        arrival = self.now - (a % 2)  # ties, and arrivals out of order
        if kind == "tokens":
            base = self.token_bases[b % 3]
            prompt = (base * (1 + length // len(base)))[:length]
            if own:
                prompt = prompt + [1000 + seq_id * 100 + j for j in range(1 + d % (bs + 1))]
            self.submit(seq_id, max_tokens, arrival, priority, tokens=prompt)
        else:
            hbs = setup["hash_block_size"]
            ids: list[int] = []
            if kind == "hash_ids":
                ids = self.id_bases[b % 3][: 1 + length // hbs]
                if own:
                    ids = ids + [seq_id * 10 + j for j in range(1 + d % 3)]
                    length += d % (2 * hbs)  # may run past the hashed tokens: unique keys
            self.submit(seq_id, max_tokens, arrival, priority, length=length, hash_ids=ids)

    def submit(
        self,
        seq_id: int,
        max_tokens: int,
        arrival: float,
        priority: int,
        *,
        tokens: list[int] | None = None,
        length: int = 0,
        hash_ids: list[int] | None = None,
    ) -> None:
        """Add one request to both: keyed by its token ids (``tokens``), else a ``length``-
        token prompt keyed by ``hash_ids`` (at the setup's ``hash_block_size``), or unique
        when there are none."""
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        if tokens is not None:
            seq = Sequence(seq_id, tokens, params, arrival, priority)
            queued = self.core.add_token_request(seq_id, tokens, max_tokens, arrival, priority)
        else:
            hbs = self.setup["hash_block_size"]
            ids = hash_ids or []
            prefix = prefix_from_hash_ids(ids, hbs, length, self.bs)
            seq = Sequence(seq_id, range(length), params, arrival, priority, prefix=prefix)
            queued = self.core.add_hash_id_request(
                seq_id, length, ids, hbs, max_tokens, arrival, priority
            )
        self.py.add_request(seq)
        assert queued == (seq.status is not SequenceStatus.FINISHED_REJECTED)

    def schedule_both(self) -> SchedulerOutput:
        py, c = self.py, self.core
        out = py.schedule()
        info = c.schedule()
        assert c.admitted() == [(s.seq_id, s.prefix_hit_tokens) for s in out.admitted]
        assert_same_step(c, info, out, _counts(out, self.bm.num_used_blocks, py))
        return out

    # --- comparisons ----------------------------------------------------------------------

    def compare(self, deep: bool | None = None) -> None:
        """Counters and queues; with ``deep`` (default: the setup's, else every 64th step)
        also every request's state and table, the free queue and the Python invariants."""
        py, c, bm = self.py, self.core, self.bm
        assert c.has_unfinished() == py.has_unfinished()
        assert (c.num_running, c.num_waiting) == (py.num_running, py.num_waiting)
        assert c.num_cached_tokens == py.num_cached_tokens
        assert c.get_num_free_blocks() == bm.get_num_free_blocks()
        assert c.num_cached_free_blocks == bm.num_cached_free_blocks
        if self.setup["caching"]:
            assert c.num_evictions == bm.num_evictions
        assert c.running() == [s.seq_id for s in py.running]
        assert c.waiting() == [s.seq_id for s in py.waiting]
        if deep is None:
            deep = self.setup["deep"] or self.num_steps % 64 == 0
        if not deep:
            return
        assert c.free_queue() == python_free_queue(bm)
        assert_same_requests(c, [*py.running, *py.waiting])
        bm.check_invariants()

    def compare_events(self) -> None:
        assert_same_events(self.core, self.recorder)


def assert_same_step(
    core: Any, info: tuple[int, ...], out: SchedulerOutput, counts: tuple[int, ...]
) -> None:
    """``core`` scheduled (``info``: its step tuple) what the Python side did (``out``),
    priced by the executor's eight ``counts`` (kvsim/sim/executor.py's ``_counts``)."""
    assert core.scheduled() == ([s.seq_id for s in out.seqs], out.num_new_tokens)
    assert core.preempted() == [s.seq_id for s in out.preempted]
    assert core.rejected() == [s.seq_id for s in out.rejected]
    expected = (*counts, int(out.kind), prefill_tokens(out), len(out.preempted), len(out.rejected))
    assert info == expected, (info, expected)
    assert (info[0] == 0) == out.is_empty


def assert_same_requests(
    core: Any,
    seqs: list[Sequence],
    exact: Callable[[Sequence], tuple[int, int]] | None = None,
) -> None:
    """Each of ``seqs`` (the Python side's unfinished sequences) has the same status, computed
    and generated tokens, preemptions and block table in ``core``. ``exact`` gives a
    sequence's (computed, generated) tokens where its fields may lag (a lazy scheduler)."""
    for seq in seqs:
        state = core.request(seq.seq_id)
        assert state is not None
        assert state["status"] == seq.status.value
        cached, generated = (
            exact(seq) if exact else (seq.cached_token_count, len(seq.generated_token_ids))
        )
        assert (state["cached_token_count"], state["num_generated"]) == (cached, generated)
        assert state["num_preemptions"] == seq.num_preemptions
        assert state["block_table"] == seq.block_table


def assert_same_events(core: Any, recorder: EventRecorder | None) -> None:
    """The events ``core`` (V1Core or ClassicCore) recorded are ``recorder``'s (none without
    one): every column, block id, CACHE / EVICT key and STEP row."""
    columns, block_ids, hashes, steps = core.take_events()
    if recorder is None:
        assert len(columns["kind"]) == 0 and len(steps["kind"]) == 0
        return
    expected, expected_ids = recorder.columns()
    for name in ("kind", "step", "seq_id", "free_blocks", "num_tokens", "num_blocks"):
        assert_column(name, columns[name], expected[name])
    assert_column("time_s", columns["time_s"], expected["time_s"])
    np.testing.assert_array_equal(block_ids, expected_ids)
    np.testing.assert_array_equal(hashes, recorder.block_hashes())
    for name, column in recorder.step_columns().items():
        assert_column(f"step {name}", steps[name], column)


def assert_column(name: str, got: np.ndarray, want: np.ndarray) -> None:
    if len(got) == len(want) and np.array_equal(got, want):
        return
    n = min(len(got), len(want))
    at = int(np.argmax(got[:n] != want[:n])) if n and not np.array_equal(got[:n], want[:n]) else n
    raise AssertionError(
        f"column {name} differs from row {at} ({len(got)} vs {len(want)} rows): "
        f"{got[max(at - 3, 0) : at + 3]} vs {want[max(at - 3, 0) : at + 3]}"
    )


def drive(setup: dict[str, Any], ops: list[Op]) -> Pair:
    """Apply ``ops``, run both to the end, and compare their events."""
    pair = Pair(setup)
    pair.run_stream(ops)
    return pair


def make_setup(num_blocks: int, block_size: int, seed: int, **extra: Any) -> dict[str, Any]:
    setup: dict[str, Any] = {
        "num_blocks": num_blocks,
        "block_size": block_size,
        "seed": seed,
        "caching": True,
        "sink": "events",  # "events", "no_cache_events" (prefix_cache_events=False), "none"
        "watermark": 0.0,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 4 * block_size + 3,
        "max_model_len": None,
        "chunked": True,
        "threshold": 0,
        "policy": "fcfs",
        "hash_block_size": block_size,
        "kinds": SOURCE_KINDS,
        "max_output": 2 * block_size + 3,
        "deep": True,  # compare tables, free queue and invariants every step (else every 64)
    }
    setup.update(extra)
    return setup


# --- random operation streams ----------------------------------------------------------------

NAMES = ("add", "add", "add", "step", "step", "step", "step", "tick")
RARE = ("abort", "abort_mid", "add_mid")
# hypothesis' operations: the same names, small arguments
op_strategy = st.tuples(
    st.sampled_from(NAMES + RARE),
    st.integers(0, 60),
    st.integers(0, 60),
    st.integers(0, 60),
    st.integers(0, 60),
)


def random_ops(rng: random.Random, count: int) -> list[Op]:
    ops = []
    for _ in range(count):
        name = rng.choice(RARE) if rng.random() < 0.08 else rng.choice(NAMES)
        a, b, c, d = (rng.randrange(1000) for _ in range(4))
        ops.append((name, a, b, c, d))
    return ops


def random_setup(rng: random.Random, seed: int, **extra: Any) -> dict[str, Any]:
    """A setup drawn from every option's values (the seeded streams')."""
    bs = rng.choice([1, 2, 3, 4, 8, 16, 64, 512])
    setup = make_setup(
        num_blocks=rng.choice([1, 2, 3, 5, 8, 13, 40, 200]),
        block_size=bs,
        seed=seed,
        caching=rng.random() < 0.7,
        sink=rng.choice(["events", "events", "no_cache_events", "none"]),
        watermark=rng.choice([0.0, 0.0, 0.05, 0.3]),
        max_num_seqs=rng.choice([1, 2, 4, 8, 64]),
        max_num_batched_tokens=max(1, int(bs * rng.choice([0.5, 1, 3, 8, 64]))),
        max_model_len=rng.choice([None, None, 3 * bs + 1, 6 * bs]),
        chunked=rng.random() < 0.7,
        threshold=rng.choice([0, 0, 1 if bs < 8 else bs // 4, bs, 3 * bs]),
        policy=rng.choice(["fcfs", "priority"]),
        hash_block_size=rng.choice([1, 3, bs, 2 * bs]),
        kinds=rng.choice([("tokens",), ("hash_ids",), ("unique",), SOURCE_KINDS]),
        max_output=rng.choice([3, min(2 * bs + 3, 40), min(8 * bs, 200)]),
    )
    setup["deep"] = setup["num_blocks"] <= 40
    setup.update(extra)
    return setup
