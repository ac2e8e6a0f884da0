"""Contiguous KV allocators: the systems paging replaced (vLLM paper, Orca baselines).

Each admitted sequence reserves one contiguous region of slots, sized by a policy:

- ``max``:    ``max_model_len`` slots, prompt included;
- ``pow2``:   prompt + the next power of two at or above the true output length;
- ``oracle``: prompt + exactly the true output length.

(The true output length is ``sampling_params.max_tokens``; no policy reserves beyond
``max_model_len``, where the sequence stops anyway.) Regions are placed by a buddy allocator
(engine/contiguous/buddy.py) over one slot space, so rounding (internal) and holes (external
fragmentation) are real.

The allocator sits behind the interface the Scheduler uses for the paged BlockManager, at slot
granularity: ``block_size`` is 1, so block ids are slot ids, and a reservation of R tokens is a
block table of R consecutive slots given at admission. The table reaches ahead of the cache,
so decode never allocates: the Scheduler's decode path finds every token's slot in the table.
A sequence that would outgrow its reservation raises ``ReservationError``; nothing is
corrupted. Events: ALLOCATE and FREE carry one id, the region's first slot; ``free_blocks``
counts free slots. The watermark does not apply: a running sequence never grows, so there is
nothing to keep free for it. No torch.
"""

from __future__ import annotations

from typing import Literal

from engine.contiguous.buddy import BuddyAllocator, order_of
from engine.core.block_manager import Slot
from engine.core.errors import EngineError, InvariantError
from engine.core.events import EventKind, EventSink
from engine.core.sequence import Sequence

Policy = Literal["max", "pow2", "oracle"]
POLICIES: tuple[Policy, ...] = ("max", "pow2", "oracle")


class ReservationError(EngineError):
    """A sequence needs a slot beyond its contiguous reservation (or a policy cannot size it)."""


def reservation_tokens(
    policy: Policy, num_prompt_tokens: int, max_tokens: int, max_model_len: int | None
) -> int:
    """Slots a policy reserves for a request (before the buddy allocator's rounding)."""
    if policy == "max":
        if max_model_len is None:
            raise ReservationError("the 'max' policy needs max_model_len")
        return max(max_model_len, num_prompt_tokens)
    if policy == "pow2":
        tokens = num_prompt_tokens + (1 << order_of(max_tokens))
    elif policy == "oracle":
        tokens = num_prompt_tokens + max_tokens
    else:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if max_model_len is not None:
        tokens = min(tokens, max(max_model_len, num_prompt_tokens))
    return tokens


class _FreeSlots:
    """Stands where the paged manager keeps its free queue (``_free``), for code that reads
    its length; nobody may take a slot from it: regions come only from the buddy allocator."""

    __slots__ = ("_buddy",)

    def __init__(self, buddy: BuddyAllocator) -> None:
        self._buddy = buddy

    def __len__(self) -> int:
        return self._buddy.num_free_slots

    def popleft(self) -> int:
        raise ReservationError("a contiguous allocator hands out whole regions, never one slot")


class ContiguousAllocator:
    """``num_slots`` KV slots; one buddy-placed region per running sequence."""

    block_size = 1
    watermark = 0.0
    watermark_blocks = 0

    def __init__(
        self,
        num_slots: int,
        policy: Policy,
        max_model_len: int | None = None,
        event_sink: EventSink | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if policy == "max" and max_model_len is None:
            raise ValueError("the 'max' policy needs max_model_len")
        self.buddy = BuddyAllocator(num_slots)
        self.num_blocks = num_slots
        self.policy: Policy = policy
        self.max_model_len = max_model_len
        self.event_sink = event_sink
        self._free = _FreeSlots(self.buddy)
        self._regions: dict[int, tuple[Sequence, int]] = {}  # seq_id -> (seq, first slot)

    # --- queries -----------------------------------------------------------------------

    def reservation_of(self, seq: Sequence) -> int:
        """Slots ``seq`` reserves under this policy (its block table's length)."""
        return reservation_tokens(
            self.policy, seq.num_prompt_tokens, seq.sampling_params.max_tokens, self.max_model_len
        )

    def get_num_free_blocks(self) -> int:
        return self.buddy.num_free_slots

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.buddy.num_free_slots

    @property
    def num_regions(self) -> int:
        return len(self._regions)

    def can_allocate(self, num_tokens: int, seq: Sequence | None = None) -> bool:
        """Whether ``seq``'s reservation (rounded to a power of two) has a free block now."""
        return self.buddy.can_allocate(self._size_for(num_tokens, seq))

    def can_ever_allocate(self, num_tokens: int, seq: Sequence | None = None) -> bool:
        """Whether ``seq``'s reservation could be placed with every slot free."""
        return self.buddy.can_ever_allocate(self._size_for(num_tokens, seq))

    def _size_for(self, num_tokens: int, seq: Sequence | None) -> int:
        if seq is None:
            if self.policy != "max":
                raise ReservationError(
                    f"the '{self.policy}' policy sizes a reservation from the sequence; "
                    "pass it to can_allocate / can_ever_allocate"
                )
            return max(num_tokens, self.max_model_len or 0)
        return max(num_tokens, self.reservation_of(seq))

    # --- per sequence ----------------------------------------------------------------------

    def allocate_for_prefill(self, seq: Sequence, num_prompt_tokens: int) -> None:
        """Reserve ``seq``'s whole region; its table lists every reserved slot."""
        if seq.block_table:
            raise InvariantError(f"sequence {seq.seq_id} already holds slots; free it first")
        size = self.reservation_of(seq)
        need = max(num_prompt_tokens, seq._finish_cached_count)
        if need > size:
            raise ReservationError(
                f"sequence {seq.seq_id} may write {need} tokens but the '{self.policy}' "
                f"policy reserves {size}"
            )
        start = self.buddy.allocate(size)
        seq.block_table = list(range(start, start + size))
        self._regions[seq.seq_id] = (seq, start)
        if self.event_sink is not None:
            self.event_sink.record(
                EventKind.ALLOCATE,
                seq.seq_id,
                self.buddy.num_free_slots,
                (start,),
                num_prompt_tokens,
            )

    def append_slot_index(self, seq: Sequence) -> int:
        """The slot of token ``seq.cached_token_count``: always inside the reservation."""
        position = seq.cached_token_count
        table = seq.block_table
        if position >= len(table):
            raise ReservationError(
                f"sequence {seq.seq_id}: token {position} is beyond its reservation of "
                f"{len(table)} slots"
            )
        return table[position]

    def append_slot_for_decode(self, seq: Sequence) -> Slot:
        index = self.append_slot_index(seq)
        return Slot(physical_block_id=index, offset=0, index=index)

    def append_block(self, seq: Sequence) -> int:
        """Never possible: a reservation does not grow."""
        raise ReservationError(
            f"sequence {seq.seq_id}: token {seq.cached_token_count} is beyond its reservation "
            f"of {len(seq.block_table)} slots"
        )

    def get_slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        table = seq.block_table
        if end > len(table) or start < 0 or start > end:
            raise ReservationError(
                f"sequence {seq.seq_id}: positions [{start}, {end}) are outside its "
                f"reservation of {len(table)} slots"
            )
        return table[start:end]

    def free_sequence(self, seq: Sequence) -> None:
        """Return ``seq``'s region to the buddy allocator; a second call is a no-op."""
        region = self._regions.pop(seq.seq_id, None)
        if region is None:
            return
        start = region[1]
        self.buddy.free(start)
        seq.block_table = []
        if self.event_sink is not None:
            self.event_sink.record(EventKind.FREE, seq.seq_id, self.buddy.num_free_slots, (start,))

    # --- invariants --------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The buddy allocator's invariants, and for each sequence: its table is its region's
        consecutive slots, the region is an allocated buddy block of the rounded size, and
        its cache and finish fit inside. Raises ``InvariantError``."""
        self.buddy.check_invariants()
        if self.buddy.num_allocated_blocks != len(self._regions):
            raise InvariantError(
                f"{self.buddy.num_allocated_blocks} buddy blocks allocated for "
                f"{len(self._regions)} sequences"
            )
        for seq_id, (seq, start) in self._regions.items():
            size = self.reservation_of(seq)
            table = seq.block_table
            if table != list(range(start, start + size)):
                raise InvariantError(
                    f"sequence {seq_id}'s table is not its region [{start}, {start + size})"
                )
            if self.buddy.order_at(start) != order_of(size):
                raise InvariantError(
                    f"sequence {seq_id}'s region at {start} is not an allocated block of "
                    f"{1 << order_of(size)} slots"
                )
            if seq.cached_token_count > size or seq._finish_cached_count > size:
                raise InvariantError(
                    f"sequence {seq_id}: {seq.cached_token_count} cached tokens (finishing at "
                    f"{seq._finish_cached_count}) do not fit its {size} reserved slots"
                )
