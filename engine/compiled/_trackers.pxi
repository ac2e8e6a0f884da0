# What the core computes from its own events: residency samples and the KV breakdown's U.
# (included by _core.pyx: one extension module, split for reading)

cdef dict _reservoir_state(CSampleReservoir* r, bint release=False):
    """A reservoir's kept values and their ids (in id order), how many values it was given
    and their exact sum ({exponent k: integer n}: the values sum to the sum of n * 2**k).
    ``release``: free the reservoir's samples once copied out."""
    cdef const vector[Sample]* kept
    with nogil:  # the sort of a few million samples
        kept = &r.samples()
    cdef size_t n = kept.size()
    cdef size_t i
    values = np.empty(n, dtype=np.float64)
    ids = np.empty(n, dtype=np.int64)
    cdef double[::1] vv = values
    cdef int64_t[::1] iv = ids
    for i in range(n):
        vv[i] = kept[0][i].value
        iv[i] = kept[0][i].id
    if release:
        r.release()
    cdef vector[int32_t] exponents
    cdef vector[int64_t] high
    cdef vector[uint64_t] low
    r.sum_parts(exponents, high, low)
    sums = {int(exponents[i]): (int(high[i]) << 64) + int(low[i]) for i in range(exponents.size())}
    return {"values": values, "ids": ids, "count": r.count(), "sum_by_exponent": sums}


cdef dict _residency_state(CResidencyTracker* r, bint release=False):
    """The three reservoirs' states (``_reservoir_state``) and the evictions so far;
    ``release``: each reservoir's samples freed once copied out (the peak then holds one
    reservoir twice, not all three)."""
    return {
        "lifetime": _reservoir_state(&r.lifetime, release),
        "idle": _reservoir_state(&r.idle, release),
        "reuse_gap": _reservoir_state(&r.reuse_gap, release),
        "num_evictions": r.num_evictions,
    }


cdef dict _usage_state(CUsageTracker* u):
    """U and the held references at each STEP event consumed so far (the columns go with
    the arrays: a later state holds only later steps)."""
    cdef size_t n = u.usable_at_steps.size()
    return {
        "usable_at_steps": _owned_array(u.usable_at_steps.release(), n, "q", 8, np.int64),
        "refs_at_steps": _owned_array(u.refs_at_steps.release(), n, "q", 8, np.int64),
    }


cdef class UsageTracker:
    """U (Σ min(blocks held x block_size, T)) and the held references at every STEP event
    (csrc/usage.hpp): the compiled twin of kvsim/analysis/kv_breakdown.py's
    PagedUsageTracker. V1Core tracks them itself with ``track_usage``; this class feeds it
    columns, for tests."""

    cdef CUsageTracker* tracker

    def __cinit__(self, int32_t block_size):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.tracker = new CUsageTracker(block_size)

    def __dealloc__(self):
        del self.tracker

    def set_final_length(self, int64_t seq_id, int64_t final_length):
        self.tracker.set_final_length(seq_id, final_length)

    def consume(self, kind, seq_id, num_blocks):
        """Events in order: EventRecorder's ``kind``, ``seq_id`` and ``num_blocks``."""
        k = np.ascontiguousarray(kind, dtype=np.int8)
        q = np.ascontiguousarray(seq_id, dtype=np.int32)
        c = np.ascontiguousarray(num_blocks, dtype=np.int32)
        if not len(k) == len(q) == len(c):
            raise ValueError("kind, seq_id and num_blocks must be equally long")
        cdef const int8_t[::1] kv = k
        cdef const int32_t[::1] qv = q
        cdef const int32_t[::1] cv = c
        if len(k):
            self.tracker.consume(&kv[0], &qv[0], &cv[0], len(k))

    def state(self):
        """``{"usable_at_steps", "refs_at_steps"}`` of the STEP events since the last state."""
        return _usage_state(self.tracker)


cdef class ResidencyTracker:
    """vLLM's block residency samples and the eviction count from event columns
    (csrc/residency.hpp): the compiled twin of kvsim/analysis/residency.py's
    ResidencyCollector fold and BlockStateTracker's eviction count. V1Core tracks them
    itself with ``track_residency``; this class feeds it columns, for tests."""

    cdef CResidencyTracker* tracker
    cdef int32_t num_blocks

    def __cinit__(self, int32_t num_blocks, size_t capacity, uint64_t seed):
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.tracker = new CResidencyTracker(num_blocks, capacity, seed)
        self.num_blocks = num_blocks

    def __dealloc__(self):
        del self.tracker

    def consume(self, kind, num_blocks, time_s, block_ids):
        """Events in order: EventRecorder's ``kind``, ``num_blocks`` and ``time_s`` columns
        and the events' block ids, flattened."""
        k = np.ascontiguousarray(kind, dtype=np.int8)
        c = np.ascontiguousarray(num_blocks, dtype=np.int32)
        t = np.ascontiguousarray(time_s, dtype=np.float64)
        b = np.ascontiguousarray(block_ids, dtype=np.int32)
        if not len(k) == len(c) == len(t):
            raise ValueError("kind, num_blocks and time_s must be equally long")
        if (c < 0).any() or int(c.sum()) != len(b):
            raise ValueError(f"num_blocks must sum to the {len(b)} block ids")
        if len(b) and (int(b.min()) < 0 or int(b.max()) >= self.num_blocks):
            raise ValueError(f"block ids must be in [0, {self.num_blocks})")
        cdef const int8_t[::1] kv = k
        cdef const int32_t[::1] cv = c
        cdef const double[::1] tv = t
        cdef const int32_t[::1] bv = b
        if len(k):
            self.tracker.consume(
                &kv[0], &cv[0], &tv[0], &bv[0] if len(b) else NULL, len(k)
            )

    def state(self):
        """``{"lifetime", "idle", "reuse_gap"}``: each reservoir's kept samples (s) with
        their ids, count and exact sum; ``"num_evictions"``: the EVICT blocks so far."""
        return _residency_state(self.tracker)
