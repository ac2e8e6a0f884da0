"""Drives the Python classic Scheduler and the compiled ClassicCore (engine/compiled) side by side.

``ClassicPair`` gives both the same requests, steps, aborts and clock, every sampled token a
placeholder, and compares after every schedule and update what each decided and counts
(tests/engine/test_compiled_classic.py says what). The Python side is the plain Scheduler or,
with ``fast``, cost mode's FastDecodeScheduler. Import this module only once
``engine.compiled.load()`` has returned the extension.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

from engine import BlockManager, EventRecorder, SamplingParams, SchedulerConfig, Sequence
from engine.compiled import _core as core
from engine.factory import make_scheduler
from kvsim.sim.executor import CostModelExecutor, _counts
from kvsim.sim.simulation import prefill_tokens
from tests.engine.compiled_v1_drive import assert_column

Op = tuple[str, int, int, int, int]
TOKEN = 0  # the placeholder every step samples


class ClassicPair:
    """A Python classic Scheduler over a BlockManager and a ClassicCore, in lockstep."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self.setup = setup
        self.bs = setup["block_size"]
        self.now = 0.0
        self.recorder = None
        if setup["sink"] != "none":
            self.recorder = EventRecorder(clock=lambda: self.now)
        self.bm = BlockManager(
            setup["num_blocks"], self.bs, setup["watermark"], event_sink=self.recorder
        )
        config = SchedulerConfig(
            scheduler="classic",
            max_num_seqs=setup["max_num_seqs"],
            max_num_batched_tokens=setup["max_num_batched_tokens"],
            max_model_len=setup["max_model_len"],
        )
        self.fast = setup["fast"]
        token = {"token": TOKEN} if self.fast else {}
        self.py = make_scheduler(config, self.bm, fast=self.fast, **token)
        self.core = core.ClassicCore.from_config(
            config, setup["num_blocks"], self.bs, watermark=setup["watermark"],
            record_events=setup["sink"] != "none",
        )  # fmt: skip
        self.next_id = 0
        self.num_steps = 0

    # --- operations -----------------------------------------------------------------------

    def tick(self, dt: float) -> None:
        self.now += dt
        self.core.set_time(self.now)

    def add(self, c: int, d: int) -> None:
        """A request whose length (from ``c``) is a few blocks, sometimes more than half the
        pool (some never fit, some only alone), and whose output (from ``d``) is up to the
        setup's ``max_output`` tokens."""
        setup, bs = self.setup, self.bs
        length = (1 + c % 4) * bs + (c // 4 % bs if c % 3 else 0)
        if c % 13 == 0:
            length += setup["num_blocks"] * bs // 2
        self.submit(length, 1 + d % setup["max_output"])

    def submit(self, length: int, max_tokens: int) -> Sequence:
        """Add a ``length``-token prompt generating ``max_tokens`` to both; returns the
        Python side's Sequence."""
        seq_id = self.next_id
        self.next_id += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        seq = Sequence(seq_id, range(length), params, self.now)
        self.py.add_request(seq)
        self.core.add_request(seq_id, length, max_tokens)
        return seq

    def abort(self, a: int) -> None:
        seq_id = a % max(self.next_id, 1)
        assert self.core.abort(seq_id) == self.py.abort(seq_id)

    def step(self, mid: Op | Callable[[], None] | None = None) -> None:
        """One schedule / update on both; ``mid`` (an add or abort) runs between them."""
        py, c = self.py, self.core
        self.num_steps += 1
        out = py.schedule()
        info = c.schedule()
        self.sync()
        assert c.scheduled() == ([s.seq_id for s in out.seqs], out.num_new_tokens)
        assert c.preempted() == [s.seq_id for s in out.preempted]
        assert c.rejected() == [s.seq_id for s in out.rejected]
        # the executor's own rule for the blocks a step walks (it reads nothing of itself)
        walked = CostModelExecutor.blocks_walked(None, out, py)  # type: ignore[arg-type]
        expected = (
            *_counts(out, walked, py),
            int(out.kind),
            prefill_tokens(out),
            len(out.preempted),
            len(out.rejected),
        )
        assert info == expected, (info, expected)
        assert (info[0] == 0) == out.is_empty
        self.compare()
        if callable(mid):
            mid()
        elif mid is not None:
            self.apply(mid)
        done = py.update(out, [TOKEN] * len(out.seqs))
        got = c.update()
        assert got == [(s.seq_id, s.status.value, s.finish_reason) for s in done]
        self.compare()

    def apply(self, op: Op) -> None:
        name, a, b, c, d = op
        if name == "add":
            self.add(c, d)
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

    # --- comparisons ----------------------------------------------------------------------

    def sync(self) -> None:
        """Bring the FastDecodeScheduler's lazy running sequences up to date."""
        if self.fast:
            self.py.sync()  # type: ignore[attr-defined]

    def compare(self, deep: bool | None = None) -> None:
        """Counters and queues; with ``deep`` (default: the setup's, else every 64th step)
        also every request's state and table, the free queue and the Python invariants."""
        py, c, bm = self.py, self.core, self.bm
        self.sync()
        assert c.has_unfinished() == py.has_unfinished()
        assert (c.num_running, c.num_waiting) == (py.num_running, py.num_waiting)
        assert c.num_cached_tokens == py.num_cached_tokens
        assert c.get_num_free_blocks() == bm.get_num_free_blocks()
        assert c.num_used_blocks == bm.num_used_blocks
        assert c.step == py.step
        assert c.running() == [s.seq_id for s in py.running]
        assert c.waiting() == [s.seq_id for s in py.waiting]
        if deep is None:
            deep = self.setup["deep"] or self.num_steps % 64 == 0
        if not deep:
            return
        assert c.free_queue() == bm._free[bm._head :]
        for seq in [*py.running, *py.waiting]:
            state = c.request(seq.seq_id)
            assert state is not None
            assert state["status"] == seq.status.value
            assert state["cached_token_count"] == seq.cached_token_count
            assert state["num_generated"] == len(seq.generated_token_ids)
            assert state["num_preemptions"] == seq.num_preemptions
            assert state["block_table"] == seq.block_table
        bm.check_invariants()

    def compare_events(self) -> None:
        columns, block_ids, hashes, steps = self.core.take_events()
        assert len(hashes) == 0  # nothing is cached
        if self.recorder is None:
            assert len(columns["kind"]) == 0 and len(steps["kind"]) == 0
            return
        expected, expected_ids = self.recorder.columns()
        for name in ("kind", "step", "seq_id", "free_blocks", "num_tokens", "num_blocks"):
            assert_column(name, columns[name], expected[name])
        assert_column("time_s", columns["time_s"], expected["time_s"])
        np.testing.assert_array_equal(block_ids, expected_ids)
        for name, column in self.recorder.step_columns().items():
            assert_column(f"step {name}", steps[name], column)


def drive(setup: dict[str, Any], ops: list[Op]) -> ClassicPair:
    """Apply ``ops``, run both to the end, and compare their events."""
    pair = ClassicPair(setup)
    for op in ops:
        pair.apply(op)
    pair.drain()
    pair.compare_events()
    return pair


def make_setup(num_blocks: int, block_size: int, **extra: Any) -> dict[str, Any]:
    setup: dict[str, Any] = {
        "num_blocks": num_blocks,
        "block_size": block_size,
        "sink": "events",  # or "none"
        "watermark": 0.0,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 4 * block_size + 3,
        "max_model_len": None,
        "max_output": 2 * block_size + 3,
        "fast": False,  # the Python side: the plain Scheduler, or the FastDecodeScheduler
        "deep": True,  # compare tables, free queue and invariants every step (else every 64)
    }
    setup.update(extra)
    return setup


# --- random operation streams ----------------------------------------------------------------

NAMES = ("add", "add", "add", "step", "step", "step", "step", "tick")
RARE = ("abort", "abort_mid", "add_mid")


def random_ops(rng: random.Random, count: int) -> list[Op]:
    ops = []
    for _ in range(count):
        name = rng.choice(RARE) if rng.random() < 0.08 else rng.choice(NAMES)
        a, b, c, d = (rng.randrange(1000) for _ in range(4))
        ops.append((name, a, b, c, d))
    return ops


def random_setup(rng: random.Random, **extra: Any) -> dict[str, Any]:
    """A setup drawn from every option's values."""
    bs = rng.choice([1, 2, 3, 4, 8, 16, 64, 512])
    setup = make_setup(
        num_blocks=rng.choice([1, 2, 3, 5, 8, 13, 40, 200, 2000]),
        block_size=bs,
        sink=rng.choice(["events", "events", "none"]),
        watermark=rng.choice([0.0, 0.0, 0.05, 0.3]),
        max_num_seqs=rng.choice([1, 2, 4, 8, 64]),
        max_num_batched_tokens=max(1, int(bs * rng.choice([0.5, 1, 3, 8, 64]))),
        max_model_len=rng.choice([None, None, 3 * bs + 1, 6 * bs]),
        max_output=rng.choice([3, min(2 * bs + 3, 40), min(8 * bs, 200)]),
        fast=rng.random() < 0.5,
    )
    setup["deep"] = setup["num_blocks"] <= 40
    setup.update(extra)
    return setup
