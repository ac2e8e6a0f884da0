"""What the lockstep drivers of the compiled cores share (compiled_v1_drive.py's Pair,
compiled_classic_drive.py's ClassicPair): the random operation streams, how a pair applies
them and steps both sides, and the comparisons of a step, a request and the event rows.
Import this module only once ``engine.compiled.load()`` has returned the extension.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from engine import EventRecorder, Scheduler, SchedulerOutput, Sequence
from kvsim.sim.simulation import prefill_tokens

Op = tuple[str, int, int, int, int]


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
