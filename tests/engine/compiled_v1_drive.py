"""Drives the Python V1Scheduler and the compiled V1Core (engine/compiled) side by side.

``Pair`` gives both the same requests, steps, aborts and clock, every sampled token the same
placeholder id, and compares after every step what each decided and counts
(tests/engine/test_compiled_v1.py says what). Import this module only once
``engine.compiled.load()`` has returned the extension.
"""

from __future__ import annotations

import random
from typing import Any

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
from tests.engine.compiled_drive import python_free_queue
from tests.engine.lockstep_drive import (
    Op,
    OperationStream,
    assert_same_events,
    assert_same_requests,
    assert_same_step,
    op_strategy,
    random_ops,
)

# the operation streams are lockstep_drive's, re-exported for test_compiled_v1.py
__all__ = [
    "SOURCE_KINDS", "Op", "Pair", "drive", "make_setup", "op_strategy", "random_ops",
    "random_setup",
]  # fmt: skip

TOKEN = 7  # every step samples this id (a token-keyed request's generated blocks share it)
SOURCE_KINDS = ("tokens", "hash_ids", "unique")


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


# --- random setups (the operation streams: lockstep_drive.random_ops) ------------------------


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
