# The compiled block pool (csrc/block_pool.hpp).
# (included by _core.pyx: one extension module, split for reading)

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
        return _take_events(&self.pool.events, self.event_capacity)
