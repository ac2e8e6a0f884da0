"""BlockManager: the design's worked examples, low-level allocation and invariant checks."""

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import (
    BlockManager,
    DoubleFreeError,
    EventKind,
    EventRecorder,
    InvariantError,
    OutOfBlocksError,
    SamplingParams,
    Sequence,
)


def make_seq(seq_id: int, num_prompt_tokens: int) -> Sequence:
    return Sequence(seq_id, list(range(num_prompt_tokens)), SamplingParams(max_tokens=100))


def decode(bm: BlockManager, seq: Sequence, token: int) -> int:
    """One decode step as the scheduler drives it: slot for the input, then advance."""
    slot = bm.append_slot_for_decode(seq)
    seq.cached_token_count += 1
    seq.generated_token_ids.append(token)
    seq.last_token_id = token
    return slot.index


def test_prompt_of_40_tokens_at_block_size_16_takes_3_blocks_and_decodes_into_them():
    bm = BlockManager(num_blocks=10, block_size=16)
    seq = make_seq(0, 40)
    bm.allocate_for_prefill(seq, 40)
    assert seq.block_table == [0, 1, 2]
    assert bm.get_slot_mapping(seq, 32, 40) == list(range(32, 40))  # last block holds 8
    seq.cached_token_count = 40
    seq.generated_token_ids.append(7)
    # Token 40 goes to logical block 2 at offset 8, no new block.
    slot = bm.append_slot_for_decode(seq)
    assert (slot.physical_block_id, slot.offset, slot.index) == (2, 8, 2 * 16 + 8)
    assert seq.block_table == [0, 1, 2]
    assert seq.cached_token_count == 40  # the scheduler advances it, not the manager
    seq.cached_token_count += 1
    seq.generated_token_ids.append(8)
    for token_index in range(41, 48):
        assert decode(bm, seq, 1) == 2 * 16 + token_index - 32
    assert seq.block_table == [0, 1, 2]
    # Token 48 starts logical block 3: a fourth block, at offset 0.
    slot = bm.append_slot_for_decode(seq)
    assert seq.block_table == [0, 1, 2, 3]
    assert (slot.physical_block_id, slot.offset) == (3, 0)
    bm.check_invariants()


def test_design_example_block_size_4_prompt_a_to_f_then_g_h_i():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(0, 6)  # A B C D E F
    bm.allocate_for_prefill(seq, 6)
    assert seq.block_table == [0, 1]
    assert bm.get_slot_mapping(seq, 0, 6) == [0, 1, 2, 3, 4, 5]
    seq.cached_token_count = 6
    seq.generated_token_ids.append(ord("G"))
    seq.last_token_id = ord("G")
    g = bm.append_slot_for_decode(seq)
    assert (g.physical_block_id, g.offset) == (1, 2)
    seq.cached_token_count += 1
    seq.generated_token_ids.append(ord("H"))
    h = bm.append_slot_for_decode(seq)
    assert (h.physical_block_id, h.offset) == (1, 3)
    seq.cached_token_count += 1
    seq.generated_token_ids.append(ord("I"))
    i = bm.append_slot_for_decode(seq)
    assert (i.physical_block_id, i.offset) == (2, 0)
    assert seq.block_table == [0, 1, 2]
    bm.check_invariants()


def test_can_allocate_100_tokens_at_block_size_16_needs_7_free_blocks():
    bm = BlockManager(num_blocks=10, block_size=16)
    bm.allocate_blocks(3)
    assert bm.get_num_free_blocks() == 7
    assert bm.can_allocate(100)
    bm.allocate_blocks(1)
    assert not bm.can_allocate(100)
    assert bm.can_allocate(96)


def test_watermark_keeps_blocks_in_reserve_for_admission():
    bm = BlockManager(num_blocks=100, block_size=16, watermark=0.1)
    assert bm.can_allocate(90 * 16)
    assert not bm.can_allocate(90 * 16 + 1)  # would leave 9 < 10 reserved blocks


def test_fresh_manager_hands_out_blocks_in_order_and_freed_blocks_go_to_the_back():
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.allocate_blocks(2) == [0, 1]
    bm.free_blocks([0])
    assert bm.allocate_blocks(4) == [2, 3, 4, 5]
    assert bm.allocate_blocks(1) == [0]


def test_double_free_raises_and_changes_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    blocks = bm.allocate_blocks(2)
    bm.free_blocks(blocks)
    with pytest.raises(DoubleFreeError, match="block 0"):
        bm.free_blocks([0])
    with pytest.raises(DoubleFreeError):
        bm.free_blocks(bm.allocate_blocks(1) * 2)
    assert bm.get_num_free_blocks() == 3
    bm.check_invariants()


def test_allocating_more_than_free_raises():
    bm = BlockManager(num_blocks=4, block_size=4)
    with pytest.raises(OutOfBlocksError, match="only 4 of 4"):
        bm.allocate_blocks(5)
    seq = make_seq(0, 17)
    with pytest.raises(OutOfBlocksError):
        bm.allocate_for_prefill(seq, 17)
    assert bm.get_num_free_blocks() == 4


def test_free_sequence_returns_all_blocks_and_a_second_call_is_a_no_op():
    recorder = EventRecorder()
    bm = BlockManager(num_blocks=8, block_size=4, event_sink=recorder)
    seq = make_seq(3, 9)
    bm.allocate_for_prefill(seq, 9)
    bm.free_sequence(seq)
    bm.free_sequence(seq)
    assert seq.block_table == []
    assert bm.get_num_free_blocks() == 8
    assert recorder.kinds_of(3) == [EventKind.ALLOCATE, EventKind.FREE]
    assert recorder.blocks_of(1) == [0, 1, 2]
    bm.check_invariants()


def test_check_invariants_names_the_block_and_sequence():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = make_seq(1, 4), make_seq(2, 4)
    bm.allocate_for_prefill(a, 4)
    bm.allocate_for_prefill(b, 4)
    b.block_table.append(a.block_table[0])  # corrupt: a block in two tables
    with pytest.raises(InvariantError, match=r"block 0 .* sequences 1 and 2"):
        bm.check_invariants()


def test_check_invariants_catches_a_table_that_does_not_cover_cached_tokens():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(5, 8)
    bm.allocate_for_prefill(seq, 8)
    seq.cached_token_count = 9  # claims a token beyond its two blocks
    with pytest.raises(InvariantError, match="sequence 5"):
        bm.check_invariants()


def test_freeing_a_table_that_names_a_free_block_raises_and_names_it():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = make_seq(1, 8), make_seq(2, 4)
    bm.allocate_for_prefill(a, 8)
    bm.allocate_for_prefill(b, 4)
    bm.free_sequence(b)
    a.block_table.append(b_block := 2)  # corrupt: a's table claims b's freed block
    assert bm.owner_of(b_block) == -1
    with pytest.raises(InvariantError, match=r"block 2 in sequence 1's table was already free"):
        bm.free_sequence(a)


def test_a_shared_block_outlives_the_first_table_that_frees_it():
    # Ref counts above 1 are for shared prefix blocks (not handed out yet): freeing one
    # holder's table drops a reference and leaves the block held, out of the free queue.
    bm = BlockManager(num_blocks=6, block_size=4)
    seq = make_seq(1, 12)
    bm.allocate_for_prefill(seq, 12)  # blocks 0, 1, 2
    bm._ref_counts[1] += 1  # white box: a second holder of block 1
    bm.free_sequence(seq)
    assert bm.get_num_free_blocks() == 5
    assert 1 not in bm.allocate_blocks(5)  # the free queue: 3, 4, 5, 0, 2
    bm.free_blocks([1])
    assert bm.allocate_blocks(1) == [1]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 2500)), min_size=1, max_size=40))
def test_the_free_queue_is_fifo_across_compactions(ops):
    # The free queue is a list read from a head index and compacted once more than 4,096
    # taken blocks are half of it; a deque is the model of what it must hand out.
    bm = BlockManager(num_blocks=9000, block_size=1)
    model = deque(range(9000))
    held: list[int] = []
    for take, n in ops:
        if take:
            n = min(n, len(model))
            got = bm.allocate_blocks(n)
            assert got == [model.popleft() for _ in range(n)]
            held += got
        else:
            back, held = held[:n], held[n:]
            bm.free_blocks(back)
            model.extend(back)
        assert bm.get_num_free_blocks() == len(model)
        assert bm.num_used_blocks == len(held)
    bm.check_invariants()


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(1, 3000), st.integers(0, 3)), min_size=1, max_size=40
    ),
    caching=st.booleans(),
)
def test_the_v1_free_queue_keeps_vllms_order_across_compactions(ops, caching):
    # vLLM's free queue (engine/v1/kv_cache_manager.py) as a list read from a head index, with
    # blocks put at the front into the room before it (rebuilt when there is none), hit
    # blocks leaving from the middle, and compaction past 4,096 taken blocks; a deque is the
    # model: takes from the left, a freed table reversed, its uncached blocks to the left as
    # a group and its cached ones to the right.
    from engine.v1.prefix_keys import prefix_from_hash_ids

    bm = BlockManager(num_blocks=9000, block_size=1, enable_prefix_caching=caching)
    bm.use_v1_free_queue()
    model = deque(range(9000))
    held: list[Sequence] = []
    for i, (admit, n, shared) in enumerate(ops):
        if admit or not held:
            # shared > 0: the prompt's first 64 tokens are shared prefix `shared`
            prefix = prefix_from_hash_ids([shared] if shared else None, 64, n, 1)
            seq = Sequence(i, range(n), SamplingParams(max_tokens=1), prefix=prefix)
            hits = bm.find_cached_prefix(seq)
            need = n - len(hits) + sum(1 for b in hits if b in model)
            if need > len(model):
                continue
            for b in hits:
                if b in model:
                    model.remove(b)  # a cached free block hit leaves from the middle
            assert bm.allocate_slots(
                seq, n - len(hits), hits, full_sequence_tokens=n, watermark_blocks=0,
                max_model_len=None,
            )  # fmt: skip
            new = seq.block_table[len(hits) :]
            assert new == [model.popleft() for _ in new]
            held.append(seq)
        else:
            seq = held.pop(n % len(held))
            table = list(seq.block_table)
            bm.free_sequence_v1(seq)
            still_held = {b for s in held for b in s.block_table}
            released = [b for b in reversed(table) if b not in still_held]
            cached = [b for b in released if caching and bm._has_key[b]]
            model.extendleft(reversed([b for b in released if b not in cached]))
            model.extend(cached)
        assert bm.get_num_free_blocks() == len(model)
    bm.check_invariants()
