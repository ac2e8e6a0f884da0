"""The compiled block pool (engine/compiled) on hand-computed cases: free-queue order, LRU
eviction, prefix hits, unique prompts, cache resets, CPython's hashes and the block keys of
engine/v1/prefix_keys.py, and the switch that forces the pure-Python path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine.compiled
from engine import BlockManager, EventRecorder, SamplingParams, Sequence
from engine.v1.prefix_keys import UNIQUE_PREFIX, prefix_from_hash_ids

if engine.compiled.load() is None:
    pytest.skip(str(engine.compiled.unavailable_reason()), allow_module_level=True)
from engine.compiled import _core as core  # only once it is known to load

# --- hand-computed cases ---------------------------------------------------------------------


def admit(pool: Any, r: int, num_tokens: int) -> list[int]:
    """Admit request ``r`` whole (its prefix hits, then every other token); its hits."""
    hits: list[int] = pool.find_cached_prefix(r)
    assert pool.allocate_slots(
        r, 0, num_tokens - len(hits) * pool.block_size, hits,
        full_sequence_tokens=num_tokens, watermark_blocks=0, max_model_len=None,
    )  # fmt: skip
    return hits


def test_free_queue_order_without_caching() -> None:
    pool = core.BlockPool(6, 4)
    a, b = pool.add_token_request(0, range(9)), pool.add_token_request(1, range(5))
    admit(pool, a, 9)
    admit(pool, b, 5)
    assert (pool.block_table(a), pool.block_table(b)) == ([0, 1, 2], [3, 4])
    pool.free(a)  # walked in reverse, to the front as a group
    assert pool.free_queue() == [2, 1, 0, 5]
    pool.free(b)
    assert pool.free_queue() == [4, 3, 2, 1, 0, 5]
    c = pool.add_token_request(2, range(13))
    admit(pool, c, 13)
    assert pool.block_table(c) == [4, 3, 2, 1]


def test_cached_blocks_go_to_the_tail_and_leave_least_recently_freed_first() -> None:
    pool = core.BlockPool(8, 4, True)
    a = pool.add_token_request(0, range(9))
    admit(pool, a, 9)  # blocks 0, 1 full (cached), 2 partial
    pool.free(a)
    assert pool.free_queue() == [2, 3, 4, 5, 6, 7, 1, 0]
    assert (pool.get_num_free_blocks(), pool.num_cached_free_blocks) == (8, 2)
    b = pool.add_token_request(1, range(100, 128))
    admit(pool, b, 28)  # 7 blocks: the uncached ones, then cached 1 (evicted)
    assert pool.block_table(b) == [2, 3, 4, 5, 6, 7, 1]
    assert (pool.free_queue(), pool.num_cached_free_blocks, pool.num_evictions) == ([0], 1, 1)
    columns, block_ids, hashes = pool.take_events()
    kinds = columns["kind"].tolist()
    assert kinds == [3, 12, 5, 13, 3, 12]  # ALLOCATE CACHE FREE EVICT ALLOCATE CACHE
    assert columns["free_blocks"].tolist() == [5, 5, 8, 1, 1, 1]
    table = [2, 3, 4, 5, 6, 7, 1]
    assert block_ids.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 1, *table, *table]
    assert hashes[2] == hashes[1]  # EVICT of block 1: the key it was cached under
    # handed over, not copied: the arrays own the columns the pool filled
    assert block_ids.base is not None and not block_ids.flags.owndata
    assert pool.take_events()[0]["kind"].size == 0  # taken: the buffer starts over


def test_a_hit_takes_cached_free_blocks_from_the_middle_of_the_queue() -> None:
    pool = core.BlockPool(8, 4, True)
    a = pool.add_token_request(0, range(9))
    admit(pool, a, 9)
    pool.free(a)
    c = pool.add_token_request(1, [*range(8), 50, 51])
    assert admit(pool, c, 10) == [0, 1]
    assert pool.block_table(c) == [0, 1, 2]
    assert pool.free_queue() == [3, 4, 5, 6, 7]
    assert (pool.num_cached_free_blocks, pool.ref_count(0), pool.owner_of(0)) == (0, 1, 1)


def test_a_key_cached_in_several_blocks_is_found_in_its_oldest() -> None:
    """Equal prompts of whole blocks each recompute the last one (a hit leaves the last token
    to compute) and cache it again, under the same key: it is held by blocks 1, 2 and 3,
    oldest first. When block 1 is evicted, a lookup finds block 2."""
    pool = core.BlockPool(8, 2, True)
    for seq_id, block in ((0, 1), (1, 2), (2, 3)):
        r = pool.add_token_request(seq_id, [1, 2, 3, 4])
        assert admit(pool, r, 4) == ([] if seq_id == 0 else [0])
        assert pool.block_table(r) == [0, block]
        assert pool.block_key(block) == pool.block_key(1)
    for r in range(3):
        pool.free(r)
    assert pool.free_queue() == [4, 5, 6, 7, 1, 2, 3, 0]
    e = pool.add_token_request(3, [9] * 10)
    admit(pool, e, 10)  # takes 4, 5, 6, 7 and evicts 1
    d = pool.add_token_request(4, [1, 2, 3, 4, 5])
    assert pool.find_cached_prefix(d) == [0, 2]


def test_a_unique_prompt_rehits_only_its_own_blocks() -> None:
    pool = core.BlockPool(8, 2, True)
    u, v = pool.add_unique_request(0, 7), pool.add_unique_request(1, 7)
    admit(pool, u, 7)  # blocks 0..3, 0..2 cached
    pool.free(u, True)  # preempted: remembers its cached blocks
    assert pool.find_cached_prefix(v) == []
    assert pool.find_cached_prefix(u) == [0, 1, 2]
    pool.free(v)
    pool.free(u)  # nothing held: a no-op
    assert pool.free_queue() == [3, 4, 5, 6, 7, 2, 1, 0]


def test_a_unique_prompt_hits_its_earliest_cached_copy_of_a_block() -> None:
    """A victim preempted after its step was scheduled keeps the block its last prompt token
    filled cached (block 1), beyond what its own lookup reaches (all but the last token):
    resumed, it computes that block again, into block 2. Preempted again after one more
    token, its lookup reaches both copies and takes the one cached first."""
    pool = core.BlockPool(16, 2, True)
    u = pool.add_unique_request(0, 4)
    admit(pool, u, 4)  # blocks 0, 1, both cached
    pool.free(u, True)
    assert admit(pool, u, 4) == [0]
    assert pool.block_table(u) == [0, 2]
    pool.append_tokens(u, [7])  # the step ran: 5 tokens
    pool.free(u, True)
    assert pool.block_key(1) == pool.block_key(2)
    assert pool.find_cached_prefix(u) == [0, 1]


def test_reset_prefix_cache_only_when_nothing_is_held() -> None:
    pool = core.BlockPool(4, 2, True)
    a = pool.add_token_request(0, range(5))
    admit(pool, a, 5)
    assert not pool.reset_prefix_cache()
    pool.free(a)
    assert pool.num_cached_free_blocks == 2
    assert pool.reset_prefix_cache()
    assert pool.num_cached_free_blocks == 0
    assert pool.take_events()[0]["kind"].tolist()[-1] == 14  # CACHE_RESET
    assert pool.find_cached_prefix(pool.add_token_request(1, range(5))) == []


EDGE_INTS = [0, 1, -1, -2, 2**61 - 2, 2**61 - 1, 2**61, 2**63 - 1, -(2**63), -(2**61) + 1]


@given(st.lists(st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**63), 2**63 - 1))))
def test_tuple_hash_is_pythons(values: list[int]) -> None:
    assert core.tuple_hash(values) == hash(tuple(values))


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_block_keys_are_the_python_paths(block_size: int) -> None:
    """Keys of every source, prompt and generated blocks, equal Sequence.block_hashes as the
    Python path makes them (hash ids past int64 included)."""
    pool = core.BlockPool(64, block_size, True)
    # with a sink: the Python path keys a unique prompt's blocks when it caches them
    bm = BlockManager(64, block_size, event_sink=EventRecorder(), enable_prefix_caching=True)
    bm.use_v1_free_queue()
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    ids = [5, 2**70, 17, 3]
    no_limit: dict[str, Any] = {"watermark_blocks": 0, "max_model_len": None}
    for seq_id, kind in enumerate(["tokens", "hash_ids", "unique", "hash_ids_short"]):
        num_prompt = 5 * block_size + 2
        if kind == "tokens":
            seq = Sequence(seq_id, [t * 7 for t in range(num_prompt)], params)
            r = pool.add_token_request(seq_id, seq.prompt_token_ids)
        elif kind == "unique":
            seq = Sequence(seq_id, range(num_prompt), params, prefix=UNIQUE_PREFIX)
            r = pool.add_unique_request(seq_id, num_prompt)
        else:
            hbs = 4 if kind == "hash_ids" else 1  # short: the prompt outruns its hash ids
            prefix = prefix_from_hash_ids(ids, hbs, num_prompt, block_size)
            seq = Sequence(seq_id, range(num_prompt), params, prefix=prefix)
            r = pool.add_hash_id_request(seq_id, num_prompt, ids, hbs)
        hits = bm.find_cached_prefix(seq)  # hash ids share block 0 at block size 1
        assert admit(pool, r, num_prompt) == hits
        n = num_prompt - len(hits) * block_size
        assert bm.allocate_slots(seq, n, hits, full_sequence_tokens=num_prompt, **no_limit)
        seq.cached_token_count = num_prompt
        for cached in range(num_prompt, num_prompt + 3 * block_size):  # decodes
            seq.generated_token_ids.append(9)
            pool.append_tokens(r, [9])
            if cached < len(seq.block_table) * block_size:
                bm.cache_blocks(seq, cached + 1)  # generated blocks are cached as they fill
            else:
                assert bm.allocate_slots(seq, 1, [], full_sequence_tokens=0, **no_limit)
            seq.cached_token_count = cached + 1
            assert pool.allocate_slots(r, cached, 1, [], full_sequence_tokens=0, **no_limit)
        assert pool.block_keys(r) == seq.block_hashes
        assert pool.block_table(r) == seq.block_table


def test_pure_python_is_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSIM_PURE_PYTHON", "1")
    engine.compiled.cache_clear()
    try:
        assert engine.compiled.load() is None
        assert "KVSIM_PURE_PYTHON=1" in str(engine.compiled.unavailable_reason())
    finally:
        monkeypatch.delenv("KVSIM_PURE_PYTHON")
        engine.compiled.cache_clear()
    assert engine.compiled.load() is core
    assert engine.compiled.unavailable_reason() is None
