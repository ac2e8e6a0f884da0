"""The v1 hypothesis state machine on the compiled path: the Python V1Scheduler and the
compiled V1Core (engine/compiled) in lockstep.

``CompiledV1Machine`` has test_v1_properties.V1Machine's rules (arrivals of prompts built
from shared segments, steps with and without an abort between schedule and update, aborts
between steps) over the same random setups (v1_drive.v1_setups: pools of 3 to 40 blocks,
block sizes 1 to 16, budgets, thresholds, FCFS and priority, caching, chunking, watermarks,
max_model_len), and more: every request draws its prefix source (token ids, trace hash ids
at 1, 3, 4, the block size or twice it tokens per id, or a unique prompt), arrivals between
a step's schedule and update, clock ticks, multi-step runs, and bursts of long-output
requests into the small pools (preemption pressure). Both sides run through
compiled_v1_drive.Pair, which after every schedule compares what each scheduled (seq ids and
tokens), preempted, rejected and admitted (with prefix hits) and the step's counts, after
every update the finished requests, and after both the counters and running / waiting
order (and every 64th step, or every step in the slow machine, in full). After every rule
the machine compares in full: every request's status, computed tokens, generated count,
preemptions and block table, the free queue, and the Python BlockManager's invariants. At
the end it runs both on (up to ``drain_steps`` steps, then aborts what is left) and compares
every event row (time stamps, block ids, keys, STEP rows).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from v1_drive import make_prompt, v1_setups

import engine.compiled

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)
from tests.engine.compiled_v1_drive import SOURCE_KINDS, Pair, make_setup  # needs it


@st.composite
def machine_setups(draw: st.DrawFn) -> dict[str, Any]:
    """v1_drive.v1_setups (the Python machine's), as a Pair setup: with its event sink and
    the tokens per hash id drawn too."""
    v1 = draw(v1_setups())
    bs = v1["block_size"]
    return make_setup(
        v1["num_blocks"],
        bs,
        seed=0,
        caching=v1["caching"],
        sink=draw(st.sampled_from(["events", "events", "no_cache_events", "none"])),
        watermark=v1["watermark"],
        max_num_seqs=v1["max_num_seqs"],
        max_num_batched_tokens=v1["max_num_batched_tokens"],
        max_model_len=v1["max_model_len"],
        chunked=v1["chunked"],
        threshold=v1["threshold"],
        policy=v1["policy"],
        hash_block_size=draw(st.sampled_from([1, 3, 4, bs, 2 * bs])),
    )


class CompiledV1Machine(RuleBasedStateMachine):
    """The Python V1Scheduler and the compiled V1Core side by side, rule by rule (Pair
    compares every step); full state and the BlockManager invariants after every rule."""

    pair: Pair
    deep_every_step = False  # full comparisons after every step, not only every rule
    drain_steps = 300  # steps run at the end of an example before aborting what is left

    @initialize(setup=machine_setups())
    def build(self, setup: dict[str, Any]) -> None:
        self.pair = Pair({**setup, "deep": self.deep_every_step})

    def _add(self, kind: str, mask: int, own: int, out: int, prio: int) -> None:
        """One request from the shared segments (v1_drive.make_prompt) keyed by ``kind``."""
        pair = self.pair
        seq_id = pair.next_id
        pair.next_id += 1
        prompt = make_prompt(mask, own, seq_id)
        arrival = float(seq_id // 3)
        if kind == "tokens":
            pair.submit(seq_id, out, arrival, prio, tokens=prompt)
        else:
            # one id per hash block of the prompt's tokens: prompts sharing segments share ids
            hbs = pair.setup["hash_block_size"]
            ids = [prompt[i] for i in range(0, len(prompt), hbs)] if kind == "hash_ids" else []
            pair.submit(seq_id, out, arrival, prio, length=len(prompt), hash_ids=ids)

    @rule(
        kind=st.sampled_from(SOURCE_KINDS),
        mask=st.integers(0, 31),
        own=st.integers(0, 12),
        out=st.integers(1, 30),
        prio=st.integers(0, 3),
    )
    def add(self, kind: str, mask: int, own: int, out: int, prio: int) -> None:
        self._add(kind, mask, own, out, prio)

    @rule(abort=st.one_of(st.none(), st.integers(0, 30)))
    def step(self, abort: int | None) -> None:
        self.pair.step(None if abort is None else ("abort", abort, 0, 0, 0))

    @rule(
        kind=st.sampled_from(SOURCE_KINDS),
        mask=st.integers(0, 31),
        own=st.integers(0, 12),
        out=st.integers(1, 30),
        prio=st.integers(0, 3),
    )
    def step_with_an_arrival(self, kind: str, mask: int, own: int, out: int, prio: int) -> None:
        """A request arrives between a step's schedule and its update."""
        self.pair.step(lambda: self._add(kind, mask, own, out, prio))

    @rule(steps=st.integers(2, 12))
    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.pair.step()

    @rule(seq_id=st.integers(0, 30))
    def abort_between_steps(self, seq_id: int) -> None:
        assert self.pair.core.abort(seq_id) == self.pair.py.abort(seq_id)

    @rule(
        count=st.integers(3, 8),
        kind=st.sampled_from(SOURCE_KINDS),
        mask=st.integers(0, 31),
        out=st.integers(20, 60),
        steps=st.integers(1, 8),
    )
    def burst(self, count: int, kind: str, mask: int, out: int, steps: int) -> None:
        """Preemption pressure: several long-output requests sharing a prefix, then steps
        while they all grow in the small pool."""
        for k in range(count):
            self._add(kind, mask, k % 3, out, k % 4)
        for _ in range(steps):
            self.pair.step()

    @rule(dt=st.sampled_from([0.0, 0.125, 1.0, 7.5]))
    def tick(self, dt: float) -> None:
        self.pair.tick(dt)

    @invariant()
    def both_paths_agree(self) -> None:
        if hasattr(self, "pair"):
            self.pair.compare(deep=True)  # also tables, free queue, Python invariants

    def teardown(self) -> None:
        if not hasattr(self, "pair"):
            return
        pair = self.pair
        pair.finish_or_abort(self.drain_steps)
        assert pair.core.get_num_free_blocks() == pair.bm.get_num_free_blocks()
        assert pair.bm.get_num_free_blocks() == pair.setup["num_blocks"]
        pair.bm.check_invariants()


CompiledV1Machine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestCompiledV1Machine = CompiledV1Machine.TestCase


class SlowCompiledV1Machine(CompiledV1Machine):
    """More and longer examples, compared in full after every step, run to the end."""

    deep_every_step = True
    drain_steps = 100_000


SlowCompiledV1Machine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestSlowCompiledV1Machine = pytest.mark.slow(SlowCompiledV1Machine.TestCase)
