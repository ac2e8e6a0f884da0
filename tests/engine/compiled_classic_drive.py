"""Drives the Python classic Scheduler and the compiled ClassicCore (engine/compiled) side by side.

``ClassicPair`` gives both the same requests, steps, aborts and clock, every sampled token a
placeholder, and compares after every schedule and update what each decided and counts
(tests/engine/test_compiled_classic.py says what). The Python side is the plain Scheduler or,
with ``fast``, cost mode's FastDecodeScheduler. Import this module only once
``engine.compiled.load()`` has returned the extension.
"""

from __future__ import annotations

import random
from typing import Any

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    SchedulerConfig,
    SchedulerOutput,
    Sequence,
    StepKind,
)
from engine.compiled import _core as core
from engine.factory import make_scheduler
from kvsim.sim.executor import CostModelExecutor, _counts
from tests.engine.lockstep_drive import (
    Op,
    OperationStream,
    assert_same_events,
    assert_same_requests,
    assert_same_step,
    op_strategy,
    random_ops,
)

__all__ = ["ClassicPair", "Op", "drive", "make_setup", "op_strategy", "random_ops"]

TOKEN = 0  # the placeholder every step samples
DECODE = StepKind.DECODE


class ClassicPair(OperationStream):
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
        self.token = TOKEN

    # --- operations -----------------------------------------------------------------------

    def add(self, a: int, b: int, c: int, d: int) -> None:
        """A request whose length (from ``c``) is a few blocks, sometimes more than half the
        pool (some never fit, some only alone), and whose output (from ``d``) is up to the
        setup's ``max_output`` tokens (``a`` and ``b`` are not read: no priorities, no
        shared prefixes)."""
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

    def schedule_both(self) -> SchedulerOutput:
        out = self.py.schedule()
        info = self.core.schedule()
        # the executor's own rule for the blocks a step walks (it reads nothing of itself)
        walked = CostModelExecutor.blocks_walked(None, out, self.py)  # type: ignore[arg-type]
        if self.fast and out.kind is DECODE:
            # a lazy decode step's sequences lag; every one decodes over its cache, which the
            # scheduler's count sums (what _counts gives once they are exact)
            n = len(out.seqs)
            counts = (n, n, n, self.py.num_cached_tokens + n, 0, 0, 0, walked)
        else:
            counts = _counts(out, walked, self.py)
        assert_same_step(self.core, info, out, counts)
        return out

    # --- comparisons ----------------------------------------------------------------------

    def exact(self, seq: Sequence) -> tuple[int, int]:
        """``seq``'s computed and generated tokens now. The FastDecodeScheduler's running
        sequences lag by the decode steps since their mark; they are not synced here, which
        would make it eager and hide a rule that reads a lagging count."""
        lag = 0
        if self.fast:
            state = self.py._epoch.get(seq.seq_id)  # type: ignore[attr-defined]
            if state is not None:
                lag = self.py._decodes - state[1]  # type: ignore[attr-defined]
        return seq.cached_token_count + lag, len(seq.generated_token_ids) + lag

    def compare(self, deep: bool | None = None) -> None:
        """Counters and queues; with ``deep`` (default: the setup's, else every 64th step)
        also every request's state and table, the free queue and the Python invariants."""
        py, c, bm = self.py, self.core, self.bm
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
        assert_same_requests(c, [*py.running, *py.waiting], self.exact)
        if not self.fast:  # they read the lagging counts (the tables are compared above)
            bm.check_invariants()

    def compare_events(self) -> None:
        assert_same_events(self.core, self.recorder)  # no CACHE / EVICT keys on either side


def drive(setup: dict[str, Any], ops: list[Op]) -> ClassicPair:
    """Apply ``ops``, run both to the end, and compare their events."""
    pair = ClassicPair(setup)
    pair.run_stream(ops)
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


# --- random setups (the operation streams: lockstep_drive.random_ops) ------------------------


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
