"""The BlockManager's v1 half: vLLM's free queue, prefix cache and per-request allocation.

``BlockManager`` inherits this; only the v1 scheduler calls it (the classic scheduler keeps
the FIFO free list of block_manager.py). It follows vLLM 0.33's BlockPool, KVCacheManager
and FullAttentionManager (one KV cache group, hash block size = block size):

- Free queue: allocation takes from the front; ``free_sequence_v1`` walks a table in
  reverse and puts blocks without a hash at the front as a group (in that order), cached
  blocks at the back (in that order), so cached blocks are evicted least recently freed
  first. A cached free block hit by a new request leaves the queue from the middle.
- Prefix cache (engine/v1/prefix_cache.py): full blocks are cached in ``allocate_slots`` (the
  scheduler's ``schedule()``), once the computed plus scheduled tokens cover them; a freed
  cached block stays there, evictable, until it is taken from the free queue.
- Decode steps' one-block takes and caches: engine/v1/decode_blocks.py.

The free queue is the BlockManager's list ``_free`` read from ``_head``, as for classic,
with the v1 operations it lacks: a block leaving from the middle is only marked (its
queue position ``_queue_pos`` set to -1; ``_num_stale`` counts such dead entries, skipped
when popping), and blocks put at the front fill the dead space before ``_head`` (the list
is rebuilt with room in front when there is none). Popping n blocks is then one slice
checked with numpy, and freeing a table a few vectorised operations.
"""

from __future__ import annotations

from array import array

import numpy as np

from engine.core.errors import InvariantError
from engine.core.events import EventKind, EventSink
from engine.core.invariants import FREE_OWNER
from engine.core.sequence import Sequence
from engine.v1.decode_blocks import DecodeBlocksMixin
from engine.v1.prefix_cache import PrefixCacheMixin

ALLOCATE, FREE, PREFIX_HIT = EventKind.ALLOCATE, EventKind.FREE, EventKind.PREFIX_HIT
_NOT_QUEUED = -1
_PAD = -1  # list entries before _head: never read


class KVCacheManagerMixin(PrefixCacheMixin, DecodeBlocksMixin):
    """vLLM's v1 block operations over the BlockManager's pool (see the module docstring)."""

    # The BlockManager's state this half reads and writes.
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    event_sink: EventSink | None
    _free: list[int]
    _head: int
    _ref_counts: array[int]
    _owners: array[int]
    _ref_counts_np: np.ndarray
    _owners_np: np.ndarray
    _seqs: dict[int, Sequence]
    _ones: bytes
    _num_stale: int
    _v1: bool
    num_cached_free_blocks: int

    def _each_held_once(self, held: np.ndarray) -> bool:
        """Whether every int32 ref count in ``held`` is 1: a byte compare, several times
        cheaper than numpy reductions over a few dozen counts (``_ones`` grows to the
        longest table)."""
        size = 4 * len(held)
        if len(self._ones) < size:
            self._ones = np.ones(len(held) * 2, dtype=np.int32).tobytes()
        return held.tobytes() == self._ones[:size]

    def get_num_free_blocks(self) -> int:
        raise NotImplementedError

    # --- setup -------------------------------------------------------------------------------

    def use_v1_free_queue(self) -> None:
        """Switch to vLLM's free-queue order (the v1 scheduler calls this once, on a pool
        nobody holds blocks of)."""
        if self._v1:
            return
        if self._seqs or self.get_num_free_blocks() != self.num_blocks:
            raise InvariantError("the v1 scheduler needs a fresh BlockManager (blocks are held)")
        self._v1 = True
        self._queue_pos = array("i", [_NOT_QUEUED]) * self.num_blocks
        self._queue_pos_np = np.frombuffer(self._queue_pos, dtype=np.int32)
        queue = np.array(self._free[self._head :], dtype=np.intp)
        self._queue_pos_np[queue] = np.arange(self._head, len(self._free), dtype=np.int32)
        self._init_prefix_cache()

    # --- free queue --------------------------------------------------------------------------

    def _take_block(self) -> int:
        """Take the block at the front of the free queue (ref count 1), evicting it if it
        is cached."""
        b = self._front_block()
        if self._has_key_c[b]:
            self._has_key_c[b] = 0
            self.num_cached_free_blocks -= 1
            self._evict([b])
        return b

    def _front_block(self) -> int:
        """Take the block at the front of the free queue (ref count 1), leaving its key."""
        free, head = self._free, self._head
        b = free[head]
        pos = self._queue_pos
        while pos[b] != head:  # a dead entry (its block left from the middle): skip it
            self._num_stale -= 1
            head += 1
            b = free[head]
        self._head = head + 1
        if head > 4096 and head * 2 > len(free):
            self._compact()
        pos[b] = _NOT_QUEUED
        self._ref_counts[b] = 1
        return b

    def _pop_blocks(self, n: int) -> tuple[list[int], np.ndarray]:
        """Take ``n`` > 1 blocks from the front of the free queue (ref count 1 each),
        evicting the cached ones among them; returns them as a list and as an index array."""
        free, head = self._free, self._head
        end = head + n
        blocks = free[head:end]
        index = np.array(blocks, dtype=np.intp)
        pos = self._queue_pos_np
        if self._num_stale:
            live = pos[index] == np.arange(head, end, dtype=np.int32)
            if not live.all():
                blocks, end = self._pop_live(n)
                index = np.array(blocks, dtype=np.intp)
        self._head = end
        if end > 4096 and end * 2 > len(free):
            self._compact()
        pos[index] = _NOT_QUEUED
        self._ref_counts_np[index] = 1
        if n and self.enable_prefix_caching:
            hashed = self._has_key[index]
            hashed_bytes = hashed.tobytes()  # byte tests: cheaper than numpy's all() / any()
            if b"\x00" not in hashed_bytes:  # the usual case once the pool has cycled
                self._has_key[index] = False
                self.num_cached_free_blocks -= n
                self._evict(index, blocks)
            elif b"\x01" in hashed_bytes:
                evicted = index[hashed]
                self._has_key[evicted] = False
                self.num_cached_free_blocks -= len(evicted)
                self._evict(evicted)
        return blocks, index

    def _pop_live(self, n: int) -> tuple[list[int], int]:
        """The first ``n`` live blocks from ``_head`` (dead entries skipped and dropped from
        the stale count) and the index after the last."""
        free, pos = self._free, self._queue_pos
        blocks: list[int] = []
        i = self._head
        while len(blocks) < n:
            b = free[i]
            if pos[b] == i:
                blocks.append(b)
            else:
                self._num_stale -= 1
            i += 1
        return blocks, i

    def _compact(self) -> None:
        """Drop the list before ``_head`` (every queue position moves down by ``_head``)."""
        head = self._head
        del self._free[:head]
        pos = self._queue_pos_np
        pos[pos >= 0] -= head
        self._head = 0

    def _push_front(self, blocks: np.ndarray, as_list: list[int] | None = None) -> None:
        """Put ``blocks`` (an intp index array, and optionally the same ids ``as_list``) at
        the front of the free queue, ``blocks[0]`` first."""
        k = len(blocks)
        if k > self._head:
            # Rebuild with room in front for these blocks and a quarter of the queue more.
            # Not a whole queue's worth: with the list then half room, the next pop past
            # 4,096 would compact it again, and a prefill-only workload (an admission and a
            # free per request) rebuilt and compacted the whole list on every request
            # (268 -> 100 us per admit + free of 63 blocks in an 8,000-block pool).
            room = k + max(64, (len(self._free) - self._head) // 4)
            rest = self._free[self._head :]
            self._free = [_PAD] * room + rest
            pos = self._queue_pos_np
            pos[pos >= 0] += room - self._head
            self._head = room
        head = self._head - k
        self._free[head : self._head] = blocks.tolist() if as_list is None else as_list
        self._head = head
        self._queue_pos_np[blocks] = np.arange(head, head + k, dtype=np.int32)

    def _push_front_one(self, b: int) -> None:
        """``_push_front`` of one block."""
        head = self._head
        if not head:
            self._push_front(np.array([b], dtype=np.intp))
            return
        head -= 1
        self._free[head] = b
        self._queue_pos[b] = head
        self._head = head

    def _push_back(self, blocks: np.ndarray, as_list: list[int] | None = None) -> None:
        """Put ``blocks`` (an intp index array, and optionally the same ids ``as_list``) at
        the back of the free queue, in order."""
        start = len(self._free)
        self._free.extend(blocks.tolist() if as_list is None else as_list)
        self._queue_pos_np[blocks] = np.arange(start, start + len(blocks), dtype=np.int32)

    # --- per sequence ------------------------------------------------------------------------

    def allocate_slots(
        self,
        seq: Sequence,
        num_new_tokens: int,
        hit_blocks: list[int],
        *,
        full_sequence_tokens: int,
        watermark_blocks: int,
        max_model_len: int | None,
        external_tokens: int = 0,
        reserved_blocks: int = 0,
        cache: bool = True,
    ) -> bool:
        """vLLM's KVCacheManager.allocate_slots: give ``seq`` blocks for its computed tokens,
        its prefix hit ``hit_blocks``, ``external_tokens`` a KV connector will load and
        ``num_new_tokens`` more, and cache the blocks those tokens fill (unless ``cache`` is
        False: a load's blocks are cached when it completes). An admission passes
        ``full_sequence_tokens`` > 0: it then fails unless blocks for that many tokens fit
        too. Returns False (and changes nothing) when the free blocks, less
        ``watermark_blocks`` (and, for the new blocks, less ``reserved_blocks`` kept for
        in-flight prefills), do not suffice."""
        bs = self.block_size
        table = seq.block_table
        num_hit = len(hit_blocks)
        held = num_hit + len(table)
        total_computed = seq.cached_token_count + num_hit * bs + external_tokens
        if max_model_len is not None and total_computed > max_model_len:
            total_computed = max_model_len
        evictable = 0
        if num_hit:
            refs = self._ref_counts
            evictable = sum(1 for b in hit_blocks if refs[b] == 0)
        available = self.get_num_free_blocks() - watermark_blocks
        if full_sequence_tokens:
            need = max(-(-full_sequence_tokens // bs) - held, 0) + evictable
            if need > available:
                return False
        num_slots = total_computed + num_new_tokens
        if max_model_len is not None and num_slots > max_model_len:
            num_slots = max_model_len
        num_new_blocks = -(-num_slots // bs) - held
        if max(num_new_blocks, 0) + evictable > available - reserved_blocks:
            return False
        sink = self.event_sink
        if num_hit:
            self._touch(seq, hit_blocks)
            table.extend(hit_blocks)
            seq._num_cached_blocks = seq._num_keyed_blocks = num_hit
            if sink is not None:
                sink.record(
                    PREFIX_HIT, seq.seq_id, self.get_num_free_blocks(), hit_blocks, num_hit * bs
                )
        table_index = None  # the table as an index array, when it is just these new blocks
        if num_new_blocks > 0:
            if num_new_blocks == 1:
                new = [self._take_block()]
                self._owners[new[0]] = seq.seq_id
            else:
                new, index = self._pop_blocks(num_new_blocks)
                self._owners_np[index] = seq.seq_id
                if not held:
                    table_index = index
            table.extend(new)
            if sink is not None:
                num_free = self.get_num_free_blocks()
                if full_sequence_tokens:
                    sink.record(ALLOCATE, seq.seq_id, num_free, new, num_slots)
                else:
                    sink.record_appends([seq.seq_id] * num_new_blocks, new, num_free + len(new) - 1)
        elif full_sequence_tokens and sink is not None:
            sink.record(ALLOCATE, seq.seq_id, self.get_num_free_blocks(), (), num_slots)
        if table:
            self._seqs[seq.seq_id] = seq
        if self.enable_prefix_caching and cache:
            num_cacheable = total_computed + num_new_tokens
            if num_cacheable > seq.num_tokens:
                num_cacheable = seq.num_tokens
            self.cache_blocks(seq, num_cacheable, table_index)
        return True

    def _touch(self, seq: Sequence, hit_blocks: list[int]) -> None:
        """Take one more reference to each hit block; a free (evictable) one leaves the free
        queue from the middle."""
        refs, owners, pos = self._ref_counts, self._owners, self._queue_pos
        for b in hit_blocks:
            if refs[b] == 0:  # a hit block carries its key: it was cached, evictable
                pos[b] = _NOT_QUEUED
                self._num_stale += 1
                self.num_cached_free_blocks -= 1
                owners[b] = seq.seq_id
            refs[b] += 1

    def free_sequence_v1(self, seq: Sequence, preempted: bool = False) -> None:
        """Drop ``seq``'s references, its table walked in reverse: blocks that reach 0 go to
        the front of the free queue without a key, to the back with one. A second call is a
        no-op. A ``preempted`` sequence whose prompt nobody shares remembers its cached
        blocks (engine/v1/prefix_cache.py)."""
        table = seq.block_table
        if not table:
            seq._num_cached_blocks = seq._num_keyed_blocks = 0
            self._seqs.pop(seq.seq_id, None)
            return
        # The table reversed, as a list and as a contiguous index array: the queue takes the
        # list as it is (no tolist), numpy the array (no reversed view)
        reverse = table[::-1]
        index = np.array(reverse, dtype=np.intp)
        private = seq.prefix is not None and not seq.prefix.shared
        if private and seq._num_keyed_blocks < seq._num_cached_blocks:
            self.key_deferred_blocks(seq, index[::-1])
        if preempted and private and seq._num_cached_blocks:
            seq._cached_tables.append(table[: seq._num_cached_blocks])
        seq._num_cached_blocks = seq._num_keyed_blocks = 0
        refs = self._ref_counts_np
        held = refs[index]
        as_list: list[int] | None = None  # ``released`` as a list, when it is the table
        if self._each_held_once(held):
            # The usual case, nobody else holds a block of the table: every count goes 1 -> 0.
            refs[index] = 0
            released = index
            as_list = reverse
        else:
            counts = held - 1
            if counts.min() < 0:
                b = int(index[np.argmax(counts < 0)])
                raise InvariantError(f"block {b} in sequence {seq.seq_id}'s table was already free")
            refs[index] = counts
            zero = counts == 0
            released = index if zero.all() else index[zero]
        if len(released):
            self._owners_np[released] = FREE_OWNER
            if not self.enable_prefix_caching:
                self._push_front(released, as_list)
            else:
                hashed = self._has_key[released].tobytes()
                if b"\x00" not in hashed:
                    self._push_back(released, as_list)
                    self.num_cached_free_blocks += len(released)
                elif b"\x01" not in hashed:
                    self._push_front(released, as_list)
                elif hashed[0] == 0 and b"\x00" not in hashed[1:]:
                    # A finished sequence: its last block, not full, walked first, is the
                    # only one without a key (free of 80 blocks: 29 -> 13 us, timeit).
                    self._push_front_one(int(released[0]))
                    self._push_back(released[1:], None if as_list is None else as_list[1:])
                    self.num_cached_free_blocks += len(released) - 1
                else:
                    mask = self._has_key[released]
                    self._push_front(released[~mask])
                    self._push_back(released[mask])
                    self.num_cached_free_blocks += int(np.count_nonzero(mask))
        seq.block_table = []
        del self._seqs[seq.seq_id]
        if self.event_sink is not None:
            self.event_sink.record(FREE, seq.seq_id, self.get_num_free_blocks(), table)
