"""A binary buddy allocator over one contiguous range of slots ``[0, num_slots)``.

Sizes are rounded up to powers of two; a free block of order k (2**k slots, aligned to 2**k)
is split in halves until it has the order asked for, and a freed block merges with its buddy
(``start ^ 2**k``) whenever that is free and of the same order. ``num_slots`` need not be a
power of two: the range is cut into its binary decomposition, largest first (100 slots: 64 at
0, 32 at 64, 4 at 96), and two blocks merge only while the merged block lies inside the range
(with that layout every aligned power-of-two block inside the range lies inside one root).

Placement is deterministic: the lowest-addressed free block of the smallest order that fits.
This is the allocator vLLM's paper assumes for its Orca baselines, so internal fragmentation
(rounding) and external fragmentation (free holes too small to use) are real. No torch.
"""

from __future__ import annotations

from engine.core.errors import DoubleFreeError, InvariantError, OutOfBlocksError


def order_of(size: int) -> int:
    """The smallest k with 2**k >= size (size >= 1)."""
    return (size - 1).bit_length()


class BuddyAllocator:
    """Power-of-two blocks of slots, split and merged with their buddies."""

    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive integer, got {num_slots!r}")
        self.num_slots = num_slots
        self.max_order = num_slots.bit_length() - 1  # the largest root's order
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self._allocated: dict[int, int] = {}  # start -> order
        self.num_free_slots = num_slots
        start = 0
        for k in range(self.max_order, -1, -1):
            if num_slots >> k & 1:
                self._free[k].add(start)
                start += 1 << k

    # --- queries -----------------------------------------------------------------------

    @property
    def num_allocated_blocks(self) -> int:
        return len(self._allocated)

    def can_allocate(self, size: int) -> bool:
        """Whether a block of ``size`` slots (rounded up to a power of two) is free now."""
        free = self._free
        return any(free[k] for k in range(order_of(size), self.max_order + 1))

    def can_ever_allocate(self, size: int) -> bool:
        """Whether a block of ``size`` slots fits in the range at all (everything free)."""
        return order_of(size) <= self.max_order

    def free_slots_below(self, order: int) -> int:
        """Free slots lying in free blocks of order < ``order``: holes too small for a block
        of that order (external fragmentation, seen from a request of that order)."""
        free = self._free
        return sum(len(free[k]) << k for k in range(min(order, self.max_order + 1)))

    def largest_free_block(self) -> int:
        """Slots in the largest free block (0 when nothing is free)."""
        for k in range(self.max_order, -1, -1):
            if self._free[k]:
                return 1 << k
        return 0

    def order_at(self, start: int) -> int | None:
        """The order of the allocated block starting at ``start``, or None."""
        return self._allocated.get(start)

    # --- allocate and free ---------------------------------------------------------------

    def allocate(self, size: int) -> int:
        """Take a block of ``size`` slots rounded up to a power of two; return its start."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        want = order_of(size)
        free = self._free
        k = want
        while k <= self.max_order and not free[k]:
            k += 1
        if k > self.max_order:
            raise OutOfBlocksError(
                f"no free block of {1 << want} slots (asked {size}): "
                f"{self.num_free_slots} of {self.num_slots} slots free, largest free block "
                f"{self.largest_free_block()}"
            )
        start = min(free[k])
        free[k].remove(start)
        while k > want:  # split: keep the low half, free the high half
            k -= 1
            free[k].add(start + (1 << k))
        self._allocated[start] = want
        self.num_free_slots -= 1 << want
        return start

    def free(self, start: int) -> None:
        """Return the block starting at ``start``, merging it with free buddies."""
        k = self._allocated.pop(start, None)
        if k is None:
            raise DoubleFreeError(f"no allocated block starts at slot {start}")
        self.num_free_slots += 1 << k
        free, n = self._free, self.num_slots
        while k < self.max_order:
            buddy = start ^ (1 << k)
            merged = start & ~(1 << k)
            if merged + (2 << k) > n or buddy not in free[k]:
                break
            free[k].remove(buddy)
            start = merged
            k += 1
        free[k].add(start)

    # --- invariants --------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Blocks are aligned, inside the range, disjoint, cover it exactly, and no two free
        buddies are left unmerged. Raises ``InvariantError``."""
        spans = [(s, k, True) for k, starts in enumerate(self._free) for s in starts]
        spans += [(s, k, False) for s, k in self._allocated.items()]
        spans.sort()
        at = 0
        for start, k, is_free in spans:
            if start < at:
                raise InvariantError(f"block at {start} overlaps slot {at - 1}")
            if start > at:
                raise InvariantError(f"slots [{at}, {start}) are neither free nor allocated")
            if start % (1 << k):
                raise InvariantError(f"block at {start} of order {k} is not aligned")
            at = start + (1 << k)
            if is_free and k < self.max_order:
                merged = start & ~(1 << k)
                buddy = start ^ (1 << k)
                if merged + (2 << k) <= self.num_slots and buddy in self._free[k]:
                    raise InvariantError(f"free buddies at {start} and {buddy} were not merged")
        if at != self.num_slots:
            raise InvariantError(f"blocks cover [0, {at}), the range is [0, {self.num_slots})")
        num_free = sum(len(fs) << k for k, fs in enumerate(self._free))
        if num_free != self.num_free_slots:
            raise InvariantError(
                f"free blocks hold {num_free} slots, the count says {self.num_free_slots}"
            )
