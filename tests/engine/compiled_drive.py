"""Drives the compiled block pool (engine/compiled) and the Python BlockManager side by side.

``Pair`` applies one operation stream to both, the way the v1 schedulers drive the pool, and
compares everything observable after each operation (tests/engine/test_compiled_pool.py says
what). Import this module only once ``engine.compiled.load()`` has returned the extension.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import numpy as np

from engine import BlockManager, EventRecorder, SamplingParams, Sequence
from engine.compiled import _core as core
from engine.v1.prefix_keys import prefix_from_hash_ids

Op = tuple[str, int, int, int, int]
GEN_TOKENS = (7, 8)  # sampled ids of token-keyed requests: generated blocks can be shared
SOURCE_KINDS = ("tokens", "hash_ids", "unique")  # where a request's block keys come from


class Pair:
    """A Python BlockManager and a compiled BlockPool driven in lockstep (module docstring)."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self.setup = setup
        self.bs = bs = setup["block_size"]
        self.mml: int | None = setup["max_model_len"]
        sink = setup["sink"]
        self.recorder = None
        if sink != "none":
            self.recorder = EventRecorder(
                keep_block_hashes=True, prefix_cache_events=sink == "events"
            )
        caching = setup["caching"]
        self.bm = BlockManager(
            setup["num_blocks"], bs, event_sink=self.recorder, enable_prefix_caching=caching
        )
        self.bm.use_v1_free_queue()
        self.pool = core.BlockPool(
            setup["num_blocks"], bs, caching,
            record_events=sink != "none", prefix_cache_events=sink == "events",
        )  # fmt: skip
        rng = random.Random(setup["seed"])
        self.token_bases = [[rng.randrange(50) for _ in range(6 * bs + 7)] for _ in range(3)]
        self.id_bases = [[rng.randrange(1 << 62) for _ in range(8)] for _ in range(3)]
        self.handles: dict[int, int] = {}  # seq_id -> the pool's request handle
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.next_id = 0
        self.step = 0

    # --- requests -------------------------------------------------------------------------

    def add(self, a: int, b: int, c: int, d: int) -> None:
        bs, seq_id = self.bs, self.next_id
        self.next_id += 1
        kind = self.setup["kinds"][a % len(self.setup["kinds"])]
        params = SamplingParams(max_tokens=1 + d % (2 * bs + 3), ignore_eos=True)
        # Lengths of whole blocks are frequent: a prompt equal to a cached one then re-hits
        # all but its last block and caches that one again, under a key already cached.
        length = (1 + c % 4) * bs + (c // 4 % bs if c % 3 else 0)
        own = d % 4 == 0  # a part nobody shares after the shared one
        if kind == "tokens":
            prompt = self.token_bases[b % 3][:length]
            if own:
                prompt = prompt + [1000 + seq_id * 100 + j for j in range(1 + d % (bs + 1))]
            seq = Sequence(seq_id, prompt, params)
            h = self.pool.add_token_request(seq_id, prompt)
        else:
            hbs = self.setup["hash_block_size"]
            ids: list[int] = []
            if kind == "hash_ids":
                ids = self.id_bases[b % 3][: 1 + length // hbs]
                if own:
                    ids = ids + [seq_id * 10 + j for j in range(1 + d % 3)]
                    length += d % (2 * hbs)  # may run past the hashed tokens: unique keys
            prefix = prefix_from_hash_ids(ids, hbs, length, bs)
            seq = Sequence(seq_id, range(length), params, prefix=prefix)
            h = self.pool.add_hash_id_request(seq_id, length, ids, hbs)  # none: unique
        if self.mml is not None:
            if seq.num_prompt_tokens >= self.mml:
                self.pool.remove_request(h)  # the scheduler rejects it on arrival
                return
            seq._finish_cached_count = min(seq._finish_cached_count, self.mml - 1)
        self.handles[seq_id] = h
        self.waiting.append(seq)

    def drop(self, seq: Sequence, preempted: bool = False) -> None:
        """Free ``seq``'s blocks on both sides (a finish, abort, rejection or preemption)."""
        self.bm.free_sequence_v1(seq, preempted=preempted)
        self.pool.free(self.handles[seq.seq_id], preempted)
        if not preempted:
            self.pool.remove_request(self.handles.pop(seq.seq_id))

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.drop(seq, preempted=True)
        seq.cached_token_count = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def advance(self, seq: Sequence, n: int) -> None:
        """The scheduler's update() of ``seq`` after a step of ``n`` tokens."""
        seq.cached_token_count += n
        if seq.cached_token_count < seq.num_tokens:
            return  # a prefill chunk: nothing sampled
        token = GEN_TOKENS[(seq.seq_id + seq.num_tokens) % 2]
        seq.generated_token_ids.append(token)
        self.pool.append_tokens(self.handles[seq.seq_id], [token])
        if seq.cached_token_count >= seq._finish_cached_count:
            self.running.remove(seq)
            self.drop(seq)

    def chunk(self, missing: int, b: int) -> int:
        return missing if b % 3 == 0 else 1 + b % missing

    # --- operations -----------------------------------------------------------------------

    def admit(self, i: int, b: int, c: int) -> None:
        if not self.waiting:
            return
        seq = self.waiting[i % len(self.waiting)]
        full = seq.num_tokens if self.mml is None else min(seq.num_tokens, self.mml)
        if -(-full // self.bs) > self.setup["num_blocks"]:  # can never run: rejected
            self.waiting.remove(seq)
            self.drop(seq)
            return
        h = self.handles[seq.seq_id]
        hits = self.bm.find_cached_prefix(seq)
        assert self.pool.find_cached_prefix(h) == hits
        n = self.chunk(seq.num_tokens - len(hits) * self.bs, b)
        kwargs: dict[str, Any] = {
            "full_sequence_tokens": full,
            "watermark_blocks": c % 3 if self.running else 0,
            "max_model_len": self.mml,
        }
        ok = self.bm.allocate_slots(seq, n, list(hits), **kwargs)
        assert self.pool.allocate_slots(h, 0, n, hits, **kwargs) == ok
        if ok:
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.cached_token_count = len(hits) * self.bs
            self.advance(seq, n)

    def run(self, i: int, b: int, unscheduled: bool = False) -> None:
        """One running sequence's share of a step: only caching what it fills when its table
        covers the tokens, else allocate_slots, preempting it when blocks run out.
        ``unscheduled``: then preempted before the step runs (a priority victim scheduled
        earlier in the step: the blocks it cached stay cached, even one its last token
        fills, which its own lookup will not reach)."""
        if not self.running:
            return
        seq = self.running[i % len(self.running)]
        cached, bs = seq.cached_token_count, self.bs
        n = self.chunk(seq.num_tokens - cached, b)
        if self.mml is not None:
            n = min(n, self.mml - cached - 1)
        if n <= 0:
            return
        h = self.handles[seq.seq_id]
        if cached + n <= len(seq.block_table) * bs:
            if self.setup["caching"]:
                self.bm.cache_blocks(seq, cached + n)
                self.pool.cache_blocks(h, cached + n)
        else:
            kwargs: dict[str, Any] = {
                "full_sequence_tokens": 0,
                "watermark_blocks": 0,
                "max_model_len": self.mml,
            }
            ok = self.bm.allocate_slots(seq, n, [], **kwargs)
            assert self.pool.allocate_slots(h, cached, n, [], **kwargs) == ok
            if not ok:
                self.preempt(seq)
                return
        if unscheduled:
            self.preempt(seq)
        else:
            self.advance(seq, n)

    def decode_pass(self) -> None:
        """FastV1Scheduler's decode pass on the Python side (engine/v1/decode_blocks.py:
        one-block takes and caches of every decoder, in running order, as one batch), and
        allocate_slots / cache_blocks per decoder on the compiled side."""
        bs, caching = self.bs, self.setup["caching"]
        decoders = [s for s in self.running if s.num_tokens - s.cached_token_count == 1]
        needing = [s for s in decoders if s.cached_token_count == len(s.block_table) * bs]
        if len(needing) > self.bm.get_num_free_blocks():
            return  # FastV1Scheduler's plain path would preempt: not this pass
        filling = []
        if caching:
            filling = [s for s in decoders if (s.cached_token_count + 1) % bs == 0]
        order = {s.seq_id: k for k, s in enumerate(self.running)}
        if bs == 1 and caching:
            assert filling == needing  # FastV1Scheduler then passes one list for both
            filling = needing
        self.bm.decode_blocks(needing, filling, order)
        kwargs: dict[str, Any] = {
            "full_sequence_tokens": 0,
            "watermark_blocks": 0,
            "max_model_len": self.mml,
        }
        for seq in decoders:
            h, cached = self.handles[seq.seq_id], seq.cached_token_count
            if seq in needing:
                assert self.pool.allocate_slots(h, cached, 1, [], **kwargs)
            elif caching:
                self.pool.cache_blocks(h, cached + 1)
        for seq in decoders:
            self.advance(seq, 1)

    def apply(self, op: Op) -> None:
        name, a, b, c, d = op
        self.step += 1
        if self.recorder is not None:
            self.recorder.begin_step(self.step)
        self.pool.begin_step(self.step)
        if name == "add":
            self.add(a, b, c, d)
        elif name == "admit":
            self.admit(a, b, c)
        elif name == "run":
            self.run(a, b)
        elif name == "run_preempt":
            self.run(a, b, unscheduled=True)
        elif name == "decode":
            self.decode_pass()
        elif name == "finish" and self.running:
            seq = self.running.pop(a % len(self.running))
            self.drop(seq)
        elif name == "preempt" and self.running:
            self.preempt(self.running[a % len(self.running)])
        elif name == "abort" and self.waiting:
            seq = self.waiting[a % len(self.waiting)]
            self.waiting.remove(seq)
            self.drop(seq)
        elif name == "reset":
            assert self.pool.reset_prefix_cache() == self.bm.reset_prefix_cache()
        self.compare()

    # --- comparisons ----------------------------------------------------------------------

    def compare(self) -> None:
        bm, pool = self.bm, self.pool
        assert pool.get_num_free_blocks() == bm.get_num_free_blocks()
        assert pool.num_cached_free_blocks == bm.num_cached_free_blocks
        if self.setup["caching"]:
            assert pool.num_evictions == bm.num_evictions
        assert pool.free_queue() == python_free_queue(bm)
        held = self.setup["sink"] != "none"  # else a unique prompt's held blocks are unkeyed
        for b in range(bm.num_blocks):
            assert pool.ref_count(b) == bm._ref_counts[b]
            assert pool.owner_of(b) == bm.owner_of(b)
            if self.setup["caching"] and (held or not bm._ref_counts[b]):
                key = int(bm._block_key[b]) if bm._has_key[b] else None
                assert pool.block_key(b) == key, b
        for seq in [*self.waiting, *self.running]:
            h = self.handles[seq.seq_id]
            assert pool.block_table(h) == seq.block_table
            assert pool.num_cached_blocks(h) == seq._num_cached_blocks
            keys, py_keys = pool.block_keys(h), seq.block_hashes
            assert keys[: len(py_keys)] == py_keys[: len(keys)]
        bm.check_invariants()

    def compare_events(self) -> None:
        columns, block_ids, hashes = self.pool.take_events()
        if self.recorder is None:
            assert len(columns["kind"]) == 0
            return
        expected, expected_ids = self.recorder.columns()
        for name in ("kind", "step", "seq_id", "free_blocks", "num_tokens", "num_blocks"):
            got, want = columns[name], expected[name]
            if not np.array_equal(got, want):
                at = int(np.argmax(got[: len(want)] != want[: len(got)])) if len(got) else 0
                raise AssertionError(f"column {name} differs from event {at}: {got} vs {want}")
        np.testing.assert_array_equal(block_ids, expected_ids)
        np.testing.assert_array_equal(hashes, self.recorder.block_hashes())


def python_free_queue(bm: BlockManager) -> list[int]:
    """The Python v1 free queue, front to back: its list from ``_head``, dead entries (blocks
    that left from the middle) skipped (engine/v1/kv_cache_manager.py)."""
    pos = bm._queue_pos
    return [b for i, b in enumerate(bm._free[bm._head :], bm._head) if pos[b] == i]


def drive(setup: dict[str, Any], ops: list[Op]) -> Pair:
    pair = Pair(setup)
    for op in ops:
        pair.apply(op)
    # everything ends free, and the pools still agree on what is cached
    for seq in [*pair.running, *pair.waiting]:
        pair.drop(seq)
    pair.running.clear()
    pair.waiting.clear()
    pair.compare()
    assert pair.pool.reset_prefix_cache() == pair.bm.reset_prefix_cache()
    pair.compare_events()
    return pair


def make_setup(
    num_blocks: int, block_size: int, caching: bool, sink: str, seed: int, **extra: Any
) -> dict[str, Any]:
    setup = {
        "num_blocks": num_blocks,
        "block_size": block_size,
        "caching": caching,
        "sink": sink,  # "events", "no_cache_events" (prefix_cache_events=False) or "none"
        "seed": seed,
        "max_model_len": None,
        "hash_block_size": block_size,
        "kinds": SOURCE_KINDS,
    }
    setup.update(extra)
    return setup


# --- random operation streams ----------------------------------------------------------------

NAMES = ("add", "add", "admit", "admit", "admit", "run", "run", "run", "run", "decode", "decode",
         "finish", "preempt")  # fmt: skip
RARE = ("abort", "reset", "run_preempt")


def random_ops(rng: random.Random, count: int) -> list[Op]:
    ops = []
    for _ in range(count):
        name = rng.choice(RARE) if rng.random() < 0.06 else rng.choice(NAMES)
        a, b, c, d = (rng.randrange(1000) for _ in range(4))
        ops.append((name, a, b, c, d))
    return ops
