# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""kvsim's compiled core: thin Python bindings over the C++ classes in csrc/.

Nothing here decides anything: every rule lives in the C++ headers, so that a compiled
scheduler can call them without Python in between. See docs/compiled.md.
"""

from libc.stdint cimport int8_t, int32_t, int64_t
from libc.stdlib cimport free as c_free
from libcpp cimport bool as cbool
from libcpp.vector cimport vector
from cython.view cimport array as cvarray

import numpy as np


cdef extern from "csrc/py_hash.hpp" namespace "kvsim::pyhash":
    int64_t c_tuple_hash "kvsim::pyhash::tuple_hash"(const int64_t* values, size_t n)


cdef extern from "csrc/event_buffer.hpp" namespace "kvsim":
    cdef cppclass Column[T]:
        size_t size()
        T* release()

    cdef cppclass EventBuffer:
        void reserve(size_t capacity) except +
        void begin_step(int32_t step, double time_s)
        size_t size()
        Column[double] time_s
        Column[int32_t] step
        Column[int8_t] kind
        Column[int32_t] seq_id
        Column[int32_t] free_blocks
        Column[int32_t] num_tokens
        Column[int32_t] num_blocks
        Column[int32_t] block_ids
        Column[int64_t] block_hashes


cdef extern from "csrc/block_pool.hpp" namespace "kvsim":
    cdef cppclass RequestBlocks:
        int64_t seq_id
        vector[int64_t] keys
        vector[int32_t] table
        int32_t num_cached_blocks

    cdef cppclass CBlockPool "kvsim::BlockPool":
        CBlockPool(int32_t num_blocks, int32_t block_size, cbool caching) except +
        int32_t add_token_request(int64_t seq_id, const int64_t* tokens, int32_t n) except +
        int32_t add_hash_id_request(
            int64_t seq_id, int32_t num_prompt_tokens, const int64_t* ids, int32_t num_ids,
            int32_t hash_block_size
        ) except +
        int32_t add_unique_request(int64_t seq_id, int32_t num_prompt_tokens) except +
        void remove_request(int32_t r) except +
        void append_tokens(int32_t r, const int64_t* ids, int32_t n) except +
        const RequestBlocks& get(int32_t r) except +
        int32_t num_blocks()
        int32_t block_size()
        cbool enable_prefix_caching()
        int32_t num_free_blocks()
        int32_t num_cached_free_blocks()
        int64_t num_evictions()
        int32_t ref_count(int32_t b) except +
        int64_t owner(int32_t b) except +
        cbool has_key(int32_t b) except +
        int64_t block_key(int32_t b) except +
        vector[int32_t] free_queue()
        void find_cached_prefix(int32_t r, vector[int32_t]& hits) except +
        cbool allocate_slots(
            int32_t r, int32_t num_computed_tokens, int32_t num_new_tokens, const int32_t* hits,
            int32_t num_hits, int32_t full_sequence_tokens, int32_t watermark_blocks,
            int32_t max_model_len
        ) except +
        void cache_blocks(int32_t r, int32_t num_tokens) except +
        void free(int32_t r, cbool preempted) except +
        cbool reset_prefix_cache()
        EventBuffer events
        cbool record_events
        cbool prefix_cache_events


def tuple_hash(values):
    """``hash(tuple(values))`` of ints in the int64 range, computed by the C++ core (the
    prefix keys' hash, exposed so tests can hold it to Python's own)."""
    cdef vector[int64_t] v = values
    return c_tuple_hash(v.data(), v.size())


cdef object _owned_array(void* data, size_t n, str fmt, Py_ssize_t itemsize, object dtype):
    """A numpy array over ``n`` items at ``data`` (malloc'd), which it frees: no copy."""
    if n == 0:
        c_free(data)
        return np.empty(0, dtype=dtype)
    cdef cvarray arr = cvarray(
        shape=(n,), itemsize=itemsize, format=fmt, mode="c", allocate_buffer=False
    )
    arr.data = <char*>data
    arr.callback_free_data = c_free
    return np.asarray(arr)


cdef class BlockPool:
    """vLLM v1's block pool (free queue, prefix cache, per-request allocation), compiled.

    The same rules as the Python BlockManager in v1 mode; a request is a handle from one of
    the ``add_*_request`` methods. Token counts are tokens, block counts blocks. With
    ``record_events`` the pool records its events (PREFIX_HIT, ALLOCATE, APPEND_BLOCK, FREE,
    and unless ``prefix_cache_events`` is False CACHE, EVICT, CACHE_RESET) into columns that
    ``take_events`` hands over.
    """

    cdef CBlockPool* pool
    cdef size_t event_capacity

    def __cinit__(
        self,
        int32_t num_blocks,
        int32_t block_size,
        cbool enable_prefix_caching=False,
        *,
        cbool record_events=True,
        cbool prefix_cache_events=True,
        size_t event_capacity=0,
    ):
        self.pool = new CBlockPool(num_blocks, block_size, enable_prefix_caching)
        self.pool.record_events = record_events
        self.pool.prefix_cache_events = prefix_cache_events
        self.event_capacity = event_capacity
        self.pool.events.reserve(event_capacity)

    def __dealloc__(self):
        del self.pool

    # --- requests ---------------------------------------------------------------------------

    def add_token_request(self, int64_t seq_id, token_ids):
        cdef vector[int64_t] tokens = token_ids
        return self.pool.add_token_request(seq_id, tokens.data(), <int32_t>tokens.size())

    def add_hash_id_request(
        self, int64_t seq_id, int32_t num_prompt_tokens, hash_ids, int32_t hash_block_size
    ):
        # Python's hash of each id: the lane the C++ chain needs, and any int fits then.
        cdef vector[int64_t] ids = [hash(int(h)) for h in hash_ids]
        return self.pool.add_hash_id_request(
            seq_id, num_prompt_tokens, ids.data(), <int32_t>ids.size(), hash_block_size
        )

    def add_unique_request(self, int64_t seq_id, int32_t num_prompt_tokens):
        return self.pool.add_unique_request(seq_id, num_prompt_tokens)

    def remove_request(self, int32_t r):
        self.pool.remove_request(r)

    def append_tokens(self, int32_t r, token_ids):
        cdef vector[int64_t] tokens = token_ids
        self.pool.append_tokens(r, tokens.data(), <int32_t>tokens.size())

    def block_table(self, int32_t r):
        return list(self.pool.get(r).table)

    def num_cached_blocks(self, int32_t r):
        return self.pool.get(r).num_cached_blocks

    def block_keys(self, int32_t r):
        return list(self.pool.get(r).keys)

    # --- queries ----------------------------------------------------------------------------

    @property
    def num_blocks(self):
        return self.pool.num_blocks()

    @property
    def block_size(self):
        return self.pool.block_size()

    @property
    def enable_prefix_caching(self):
        return self.pool.enable_prefix_caching()

    def get_num_free_blocks(self):
        return self.pool.num_free_blocks()

    @property
    def num_cached_free_blocks(self):
        return self.pool.num_cached_free_blocks()

    @property
    def num_evictions(self):
        return self.pool.num_evictions()

    def ref_count(self, int32_t block_id):
        return self.pool.ref_count(block_id)

    def owner_of(self, int32_t block_id):
        return self.pool.owner(block_id)

    def block_key(self, int32_t block_id):
        return self.pool.block_key(block_id) if self.pool.has_key(block_id) else None

    def free_queue(self):
        return list(self.pool.free_queue())

    # --- operations -------------------------------------------------------------------------

    def find_cached_prefix(self, int32_t r):
        cdef vector[int32_t] hits
        self.pool.find_cached_prefix(r, hits)
        return list(hits)

    def allocate_slots(
        self,
        int32_t r,
        int32_t num_computed_tokens,
        int32_t num_new_tokens,
        hit_blocks,
        *,
        int32_t full_sequence_tokens,
        int32_t watermark_blocks,
        max_model_len,
    ):
        cdef vector[int32_t] hits = hit_blocks
        cdef int32_t limit = -1 if max_model_len is None else max_model_len
        return self.pool.allocate_slots(
            r, num_computed_tokens, num_new_tokens, hits.data(), <int32_t>hits.size(),
            full_sequence_tokens, watermark_blocks, limit,
        )

    def cache_blocks(self, int32_t r, int32_t num_tokens):
        self.pool.cache_blocks(r, num_tokens)

    def free(self, int32_t r, cbool preempted=False):
        self.pool.free(r, preempted)

    def reset_prefix_cache(self):
        return self.pool.reset_prefix_cache()

    # --- events -----------------------------------------------------------------------------

    def begin_step(self, int32_t step, double time_s=0.0):
        self.pool.events.begin_step(step, time_s)

    @property
    def num_events(self):
        return self.pool.events.size()

    def take_events(self):
        cdef EventBuffer* ev = &self.pool.events
        cdef size_t n = ev.size()
        cdef size_t nb = ev.block_ids.size()
        cdef size_t nh = ev.block_hashes.size()
        columns = {
            "time_s": _owned_array(ev.time_s.release(), n, "d", 8, np.float64),
            "step": _owned_array(ev.step.release(), n, "i", 4, np.int32),
            "kind": _owned_array(ev.kind.release(), n, "b", 1, np.int8),
            "seq_id": _owned_array(ev.seq_id.release(), n, "i", 4, np.int32),
            "free_blocks": _owned_array(ev.free_blocks.release(), n, "i", 4, np.int32),
            "num_tokens": _owned_array(ev.num_tokens.release(), n, "i", 4, np.int32),
            "num_blocks": _owned_array(ev.num_blocks.release(), n, "i", 4, np.int32),
        }
        block_ids = _owned_array(ev.block_ids.release(), nb, "i", 4, np.int32)
        block_hashes = _owned_array(ev.block_hashes.release(), nh, "q", 8, np.int64)
        ev.reserve(self.event_capacity)  # the columns went with their arrays
        return columns, block_ids, block_hashes
