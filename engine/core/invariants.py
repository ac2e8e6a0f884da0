"""The BlockManager invariants of docs/design.md, checked from the manager's raw bookkeeping.

Kept apart from block_manager.py so the hot paths there stay short to read; only
``BlockManager.check_invariants`` calls this.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from collections.abc import Sequence as Ints

import numpy as np

from engine.core.errors import InvariantError
from engine.core.sequence import Sequence

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


def check_v1_block_manager(
    num_blocks: int,
    block_size: int,
    queue: Ints[int],
    head: int,
    queue_pos: Ints[int],
    num_stale: int,
    ref_counts: Ints[int],
    owners: Ints[int],
    seqs: Mapping[int, Sequence],
    cached: Mapping[int, int | list[int]],
    block_key: Ints[int | None],
    private: Ints[int],
) -> None:
    """The v1 pool's invariants (engine/v1/kv_cache_manager.py): free queue, reference counts,
    prefix cache and each holder's progress. Raise ``InvariantError`` at the first broken
    one, naming block and sequence."""
    # 1. the free queue: live entries are exactly the blocks nobody references, each once.
    live = [b for i, b in enumerate(queue) if i >= head and queue_pos[b] == i]
    dead = len(queue) - head - len(live)
    if dead != num_stale:
        raise InvariantError(f"the free queue has {dead} dead entries but counts {num_stale}")
    in_queue = set(live)
    for b in range(num_blocks):
        free = ref_counts[b] == 0
        if free != (b in in_queue):
            raise InvariantError(
                f"block {b} has ref count {ref_counts[b]} but is "
                f"{'in' if b in in_queue else 'not in'} the free queue"
            )
        if free != (owners[b] == FREE_OWNER):
            raise InvariantError(f"block {b} has ref count {ref_counts[b]}, owner {owners[b]}")
        pos = queue_pos[b]
        if pos >= 0 and not (head <= pos < len(queue) and queue[pos] == b):
            raise InvariantError(f"block {b}'s free-queue position {pos} does not hold it")
    # 2. reference counts: one per table holding the block, tables without repeats.
    holders = [0] * num_blocks
    for seq_id, seq in seqs.items():
        table = seq.block_table
        if not table:
            raise InvariantError(f"sequence {seq_id} is listed as holding blocks but has none")
        if len(set(table)) != len(table):
            raise InvariantError(f"sequence {seq_id}'s table {table} repeats a block")
        for b in table:
            holders[b] += 1
    for b in range(num_blocks):
        if holders[b] != ref_counts[b]:
            raise InvariantError(
                f"block {b} is in {holders[b]} tables but has ref count {ref_counts[b]}"
            )
    # 3. the prefix cache: every key maps to blocks carrying that key, and every keyed block
    #    is found under its key exactly once (but those cached privately: out of the map).
    mapped = 0
    for key, entry in cached.items():
        blocks = [entry] if isinstance(entry, int) else entry
        if not blocks or len(set(blocks)) != len(blocks):
            raise InvariantError(f"prefix-cache key {key} maps to {blocks}")
        for b in blocks:
            if private[b]:
                raise InvariantError(f"block {b} is cached privately but in the map")
            if block_key[b] != key:
                raise InvariantError(
                    f"block {b} is cached under key {key} but carries {block_key[b]}"
                )
        mapped += len(blocks)
    for b in range(num_blocks):
        if private[b] and block_key[b] is None:
            raise InvariantError(f"block {b} is marked cached privately but carries no key")
    num_keyed = sum(1 for b, k in enumerate(block_key) if k is not None and not private[b])
    if mapped != num_keyed:
        raise InvariantError(f"{num_keyed} blocks carry keys but the cache maps {mapped}")
    # 4. each holder: its table covers its computed tokens (and at most all its tokens); its
    #    cached blocks lead the table, under its own block keys, and the rest carry none.
    for seq_id, seq in seqs.items():
        table = seq.block_table
        lo = _ceil_div(seq.cached_token_count, block_size)
        hi = _ceil_div(seq.num_tokens, block_size)
        if not lo <= len(table) <= hi:
            raise InvariantError(
                f"sequence {seq_id} holds {len(table)} blocks but its "
                f"{seq.cached_token_count} computed of {seq.num_tokens} tokens need {lo}..{hi}"
            )
        c = seq._num_cached_blocks
        # the first `keyed` carry their keys; the rest of the cached ones are a unique
        # prompt's, deferred while there is no event sink (engine/v1/prefix_cache.py)
        keyed = seq._num_keyed_blocks
        unique = seq.prefix is not None and not seq.prefix.shared
        if c > len(table) or keyed > len(seq.block_hashes) or keyed > c:
            raise InvariantError(
                f"sequence {seq_id} counts {c} cached blocks ({keyed} keyed) of a "
                f"{len(table)}-block table"
            )
        if keyed < c and not unique:
            raise InvariantError(
                f"sequence {seq_id} shares its prompt but {c - keyed} cached blocks carry no key"
            )
        for i, b in enumerate(table):
            expected = seq.block_hashes[i] if i < keyed else None
            if block_key[b] != expected:
                raise InvariantError(
                    f"block {b} (index {i} of sequence {seq_id}'s table, {c} cached) carries "
                    f"key {block_key[b]}, expected {expected}"
                )
