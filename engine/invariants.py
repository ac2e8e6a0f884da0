"""DESIGN.md's BlockManager invariants, checked from the manager's raw bookkeeping.

Kept apart from block_manager.py so the hot paths there stay short to read; only
``BlockManager.check_invariants`` calls this.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from collections.abc import Sequence as Ints

import numpy as np

from engine.errors import InvariantError
from engine.sequence import Sequence

FREE_OWNER = -1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_block_manager(
    num_blocks: int,
    block_size: int,
    free: Collection[int],
    ref_counts: Ints[int] | np.ndarray,
    owners: Ints[int] | np.ndarray,
    seqs: Mapping[int, Sequence],
) -> None:
    """Raise ``InvariantError`` naming the block and sequence at the first broken invariant."""
    # 1. the free list holds each free block once, and only blocks nobody references.
    seen: set[int] = set()
    for b in free:
        if b in seen:
            raise InvariantError(f"block {b} is in the free list twice")
        seen.add(b)
        if ref_counts[b] != 0 or owners[b] != FREE_OWNER:
            raise InvariantError(
                f"block {b} is in the free list but has ref count {ref_counts[b]} "
                f"and owner {owners[b]}"
            )
    # 2. free + owned == num_blocks.
    num_owned = sum(1 for r in ref_counts if r > 0)
    if len(free) + num_owned != num_blocks:
        raise InvariantError(
            f"{len(free)} free + {num_owned} owned blocks != num_blocks {num_blocks}"
        )
    # 3. each block in a table is owned by that sequence, and by no other table.
    in_tables: dict[int, int] = {}
    for seq_id, seq in seqs.items():
        for b in seq.block_table:
            if b in in_tables:
                raise InvariantError(
                    f"block {b} is in the tables of sequences {in_tables[b]} and {seq_id}"
                )
            in_tables[b] = seq_id
            if owners[b] != seq_id or ref_counts[b] < 1:
                raise InvariantError(
                    f"block {b} is in sequence {seq_id}'s table but the owner table says "
                    f"{owners[b]} (ref count {ref_counts[b]})"
                )
        # 4. the table covers every cached or scheduled token and nothing beyond.
        lo = _ceil_div(seq.cached_token_count, block_size)
        hi = _ceil_div(seq.num_tokens, block_size)
        if not lo <= len(seq.block_table) <= hi:
            raise InvariantError(
                f"sequence {seq_id} holds {len(seq.block_table)} blocks but its "
                f"{seq.cached_token_count} cached of {seq.num_tokens} tokens need {lo}..{hi}"
            )
    # 5. no leaks: a block owned by a sequence sits in that sequence's table.
    for b, owner in enumerate(owners):
        if owner >= 0 and in_tables.get(b) != owner:
            raise InvariantError(f"block {b} is owned by sequence {owner} but not in its table")
