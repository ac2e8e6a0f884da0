"""BuddyAllocator: rounding, split and merge, placement, errors, and random-traffic properties
(no overlap, free space conserved, free buddies always merged)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.contiguous.buddy import BuddyAllocator, order_of
from engine.core.errors import DoubleFreeError, OutOfBlocksError


def test_order_of_rounds_up_to_a_power_of_two() -> None:
    assert [order_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 1024, 1025)] == [0, 1, 2, 2, 3, 3, 4, 10, 11]


def test_split_takes_the_lowest_block_and_frees_the_high_halves() -> None:
    b = BuddyAllocator(16)
    assert b.allocate(3) == 0  # rounded to 4: 16 -> 8 + 8 -> 4 + 4, keep [0, 4)
    assert b.num_free_slots == 12
    assert b.allocate(1) == 4  # the free 4 at 4 splits into 2 + 2, then 1 + 1
    assert b.allocate(8) == 8
    assert b.largest_free_block() == 2
    b.check_invariants()


def test_free_merges_buddies_back_to_the_root() -> None:
    b = BuddyAllocator(16)
    starts = [b.allocate(4) for _ in range(4)]
    assert starts == [0, 4, 8, 12]
    assert not b.can_allocate(1)
    for s in (4, 12, 0, 8):
        b.free(s)
        b.check_invariants()
    assert b.num_free_slots == 16 and b.largest_free_block() == 16


def test_non_power_of_two_range_is_cut_largest_first_and_roots_never_merge() -> None:
    b = BuddyAllocator(100)  # roots: 64 at 0, 32 at 64, 4 at 96
    assert b.max_order == 6
    assert b.allocate(33) == 0  # 64
    assert b.allocate(32) == 64
    assert b.allocate(4) == 96
    assert not b.can_allocate(1)
    b.free(64)
    b.free(96)
    b.check_invariants()
    assert b.largest_free_block() == 32  # 32 at 64 and 4 at 96 stay apart
    assert not b.can_ever_allocate(65)
    assert b.can_ever_allocate(64)


def test_external_fragmentation_counts_holes_smaller_than_the_request() -> None:
    b = BuddyAllocator(16)
    a = [b.allocate(2) for _ in range(8)]
    for s in a[::2]:  # free every other 2-slot block: 8 free slots, no hole of 4
        b.free(s)
    assert b.num_free_slots == 8
    assert not b.can_allocate(3)
    assert b.free_slots_below(order_of(4)) == 8
    assert b.free_slots_below(order_of(2)) == 0


def test_errors_leave_the_allocator_unchanged() -> None:
    b = BuddyAllocator(8)
    s = b.allocate(8)
    with pytest.raises(OutOfBlocksError, match="no free block of 1 slots"):
        b.allocate(1)
    b.free(s)
    with pytest.raises(DoubleFreeError):
        b.free(s)
    with pytest.raises(DoubleFreeError):
        b.free(3)
    with pytest.raises(ValueError, match="size"):
        b.allocate(0)
    with pytest.raises(ValueError, match="num_slots"):
        BuddyAllocator(0)
    b.check_invariants()
    assert b.num_free_slots == 8


class BuddyMachine(RuleBasedStateMachine):
    """Random allocations and frees against a model of which slots are taken."""

    @initialize(num_slots=st.integers(1, 300))
    def setup(self, num_slots: int) -> None:
        self.b = BuddyAllocator(num_slots)
        self.live: dict[int, int] = {}  # start -> rounded size

    @rule(size=st.integers(1, 300))
    def allocate(self, size: int) -> None:
        rounded = 1 << order_of(size)
        if not self.b.can_allocate(size):
            with pytest.raises(OutOfBlocksError):
                self.b.allocate(size)
            return
        start = self.b.allocate(size)
        assert start % rounded == 0 and start + rounded <= self.b.num_slots
        for s, n in self.live.items():
            assert start + rounded <= s or s + n <= start, "overlapping blocks"
        self.live[start] = rounded

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        start = data.draw(st.sampled_from(sorted(self.live)))
        self.b.free(start)
        del self.live[start]

    @invariant()
    def conserved_and_merged(self) -> None:
        self.b.check_invariants()
        assert self.b.num_free_slots + sum(self.live.values()) == self.b.num_slots
        if not self.live:
            # Everything free again: the roots are whole.
            assert self.b.largest_free_block() == 1 << self.b.max_order


TestBuddyMachine = BuddyMachine.TestCase
TestBuddyMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
