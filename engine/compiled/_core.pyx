# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""kvsim's compiled core: thin Python bindings over the C++ classes in csrc/.

Nothing here decides anything: every rule lives in the C++ headers, so that a compiled
scheduler can call them without Python in between. See docs/compiled.md.
"""

from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free as c_free
from libcpp cimport bool as cbool
from libcpp.string cimport string
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


cdef extern from "csrc/sample_reservoir.hpp" namespace "kvsim":
    cdef cppclass Sample "kvsim::SampleReservoir::Sample":
        int64_t id
        double value

    cdef cppclass CSampleReservoir "kvsim::SampleReservoir":
        void add(double value, int64_t id) except +
        const vector[Sample]& samples() except +
        int64_t count()
        void sum_parts(
            vector[int32_t]& exponents, vector[int64_t]& high, vector[uint64_t]& low
        ) except +


cdef extern from "csrc/residency.hpp" namespace "kvsim":
    cdef cppclass CResidencyTracker "kvsim::ResidencyTracker":
        CResidencyTracker(int32_t num_blocks, size_t capacity, uint64_t seed) except +
        void consume(const EventBuffer& ev) except +
        void consume(
            const int8_t* kind, const int32_t* count, const double* time,
            const int32_t* blocks, size_t n
        ) except +
        CSampleReservoir lifetime
        CSampleReservoir idle
        CSampleReservoir reuse_gap
        int64_t num_evictions


cdef extern from "csrc/usage.hpp" namespace "kvsim":
    cdef cppclass CUsageTracker "kvsim::UsageTracker":
        CUsageTracker(int32_t block_size) except +
        void set_final_length(int64_t seq_id, int64_t final_length) except +
        void consume(const EventBuffer& ev) except +
        void consume(
            const int8_t* kind, const int32_t* seq_id, const int32_t* count, size_t n
        ) except +
        Column[int64_t] usable_at_steps
        Column[int64_t] refs_at_steps


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


cdef extern from "csrc/v1_scheduler.hpp" namespace "kvsim":
    ctypedef int8_t SeqStatus

    cdef cppclass V1Config:
        int32_t max_num_seqs
        int32_t max_num_batched_tokens
        int32_t max_model_len
        cbool enable_chunked_prefill
        int32_t long_prefill_token_threshold
        cbool priority
        double watermark

    cdef cppclass StepInfo:
        int64_t num_seqs
        int64_t num_batched_tokens
        int64_t num_decode_seqs
        int64_t decode_context_tokens
        int64_t prefill_causal_pairs
        int64_t prefill_cached_pairs
        int64_t prefill_cached_tokens
        int64_t blocks_walked
        int64_t prefill_tokens
        int8_t kind
        int32_t num_preempted
        int32_t num_rejected
        int32_t step

    cdef cppclass V1Request:
        int64_t seq_id
        int32_t num_prompt_tokens
        int32_t num_generated
        int32_t cached
        SeqStatus status
        int64_t priority
        double arrival_time
        int32_t num_preemptions
        int32_t prefix_hit_tokens

    cdef cppclass FinishedRecord:
        int64_t seq_id
        SeqStatus status
        string reason

    cdef cppclass CV1Scheduler "kvsim::V1Scheduler":
        CV1Scheduler(
            int32_t num_blocks, int32_t block_size, cbool caching, const V1Config& config,
            int64_t token
        ) except +
        cbool add_token_request(
            int64_t seq_id, const int64_t* tokens, int32_t n, int64_t max_tokens,
            double arrival_time, int64_t priority, cbool stops_on_token
        ) except +
        cbool add_hash_id_request(
            int64_t seq_id, int32_t num_prompt_tokens, const int64_t* ids, int32_t num_ids,
            int32_t hash_block_size, int64_t max_tokens, double arrival_time, int64_t priority,
            cbool stops_on_token
        ) except +
        cbool add_unique_request(
            int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens, double arrival_time,
            int64_t priority, cbool stops_on_token
        ) except +
        cbool abort(int64_t seq_id) except +
        void set_time(double time_s)
        const StepInfo& schedule() except +
        const vector[FinishedRecord]& update() except +
        cbool has_unfinished()
        int32_t num_running()
        int32_t num_waiting()
        int64_t num_cached_tokens()
        int32_t step()
        int32_t watermark_blocks()
        cbool pending()
        const StepInfo& last_step()
        CBlockPool& pool()
        const vector[int32_t]& scheduled()
        const vector[int32_t]& num_new_tokens()
        const vector[int64_t]& preempted()
        const vector[int64_t]& rejected()
        const vector[int32_t]& admitted()
        const vector[int32_t]& running()
        vector[int32_t] waiting()
        const V1Request& request(int32_t h) except +
        int32_t handle_of(int64_t seq_id)
        Column[int8_t] step_kinds
        Column[int64_t] step_num_seqs


cdef extern from "csrc/step_prices.hpp" namespace "kvsim":
    cdef cppclass StepPrices:
        cbool linear
        double base_s
        double per_token_s
        vector[double] seq_table
        vector[double] token_table
        vector[double] decode_fixed
        vector[double] decode_slope
        vector[double] decode_base
        double overhead
        double walk
        double walk_in_profile
        double pre_fixed
        double pre_seq
        double pre_causal
        double pre_cached
        double pre_context
        double pre_token


cdef extern from "csrc/sim_loop.hpp" namespace "kvsim":
    cdef cppclass CSimLoop "kvsim::SimLoop":
        CSimLoop(CV1Scheduler* scheduler, StepPrices prices) except +
        int32_t run(
            double now, double next_due, int64_t report_at, size_t chunk_events,
            cbool stop_on_finish
        ) except +
        void finish_pending(double now) except +
        double now()
        double pending_dt()
        size_t num_steps()
        vector[FinishedRecord] finished
        Column[double] duration_s
        Column[int64_t] filled_slots
        Column[int64_t] num_running
        Column[int64_t] cached_free_blocks
        Column[int64_t] prefill_at
        Column[int64_t] prefill_tokens


# Why V1Core.run handed control back, by the value it returns (csrc/sim_loop.hpp's LoopOutcome).
LOOP_OUTCOMES = ("idle", "wait", "pending", "finished", "events", "report")

# The terms StepPrices reads from ``CostModel.step_price_terms()`` (scalars, then tables).
_PRICE_SCALARS = (
    "overhead", "walk", "walk_in_profile", "pre_fixed", "pre_seq", "pre_causal", "pre_cached",
    "pre_context", "pre_token",
)


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


cdef tuple _take_events(EventBuffer* ev, size_t capacity):
    """The buffer's columns, block ids and CACHE / EVICT keys as numpy arrays that own
    the buffer's memory (no copy); the buffer is left empty, with ``capacity`` reserved."""
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
    ev.reserve(capacity)  # the columns went with their arrays
    return columns, block_ids, block_hashes


cdef dict _reservoir_state(CSampleReservoir* r):
    """A reservoir's kept values and their ids (in id order), how many values it was given
    and their exact sum ({exponent k: integer n}: the values sum to the sum of n * 2**k)."""
    cdef const vector[Sample]* kept = &r.samples()
    cdef size_t n = kept.size()
    cdef size_t i
    values = np.empty(n, dtype=np.float64)
    ids = np.empty(n, dtype=np.int64)
    cdef double[::1] vv = values
    cdef int64_t[::1] iv = ids
    for i in range(n):
        vv[i] = kept[0][i].value
        iv[i] = kept[0][i].id
    cdef vector[int32_t] exponents
    cdef vector[int64_t] high
    cdef vector[uint64_t] low
    r.sum_parts(exponents, high, low)
    sums = {int(exponents[i]): (int(high[i]) << 64) + int(low[i]) for i in range(exponents.size())}
    return {"values": values, "ids": ids, "count": r.count(), "sum_by_exponent": sums}


cdef dict _residency_state(CResidencyTracker* r):
    """The three reservoirs' states (``_reservoir_state``) and the evictions so far."""
    return {
        "lifetime": _reservoir_state(&r.lifetime),
        "idle": _reservoir_state(&r.idle),
        "reuse_gap": _reservoir_state(&r.reuse_gap),
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


# --- the v1 scheduler ---------------------------------------------------------------------------

# SequenceStatus values (engine/core/sequence.py), by the C++ SeqStatus code
STATUS_VALUES = (
    "waiting", "running", "finished_stopped", "finished_length", "finished_aborted",
    "finished_rejected",
)
# What V1Core.schedule() returns, in order: BatchShape's eight counts (kvsim/costmodel), then
# the step kind (StepKind's value), its prefill tokens, and how many it preempted and rejected.
STEP_FIELDS = (
    "num_seqs", "num_batched_tokens", "num_decode_seqs", "decode_context_tokens",
    "prefill_causal_pairs", "prefill_cached_pairs", "prefill_cached_tokens", "blocks_walked",
    "kind", "prefill_tokens", "num_preempted", "num_rejected",
)
cdef str _LENGTH = "finished_length"
cdef str _LENGTH_REASON = "length"


cdef tuple _step_tuple(const StepInfo& s):
    return (
        s.num_seqs, s.num_batched_tokens, s.num_decode_seqs, s.decode_context_tokens,
        s.prefill_causal_pairs, s.prefill_cached_pairs, s.prefill_cached_tokens,
        s.blocks_walked, s.kind, s.prefill_tokens, s.num_preempted, s.num_rejected,
    )


cdef class V1Core:
    """vLLM 0.33's v1 scheduler over the compiled block pool, for placeholder-token runs
    (csrc/v1_scheduler.hpp): the decisions, block ids, events and counters of
    engine/v1/scheduler.py's V1Scheduler driving a BlockManager, with every sampled token
    ``token``. Requests are named by their seq_id.

    Per step: ``schedule()`` returns a tuple (``STEP_FIELDS``), ``update()`` the finished
    requests as (seq_id, status, finish_reason), status a SequenceStatus value. With
    ``record_events`` the scheduler's and the pool's events go into one buffer
    (``take_events``), stamped with the time last given to ``set_time``.
    """

    cdef CV1Scheduler* core
    cdef size_t event_capacity
    cdef CResidencyTracker* residency
    cdef CUsageTracker* usage
    cdef CSimLoop* loop

    def __cinit__(
        self,
        int32_t num_blocks,
        int32_t block_size,
        cbool enable_prefix_caching=False,
        *,
        double watermark=0.0,
        int32_t max_num_seqs=256,
        int32_t max_num_batched_tokens=8192,
        max_model_len=None,
        cbool enable_chunked_prefill=True,
        int32_t long_prefill_token_threshold=0,
        str policy="fcfs",
        int64_t token=0,
        cbool record_events=True,
        cbool prefix_cache_events=True,
        size_t event_capacity=0,
        cbool track_residency=False,
        size_t residency_capacity=1,
        uint64_t residency_seed=0,
        cbool track_usage=False,
    ):
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {policy!r}")
        cdef V1Config cfg
        cfg.max_num_seqs = max_num_seqs
        cfg.max_num_batched_tokens = max_num_batched_tokens
        cfg.max_model_len = -1 if max_model_len is None else max_model_len
        cfg.enable_chunked_prefill = enable_chunked_prefill
        cfg.long_prefill_token_threshold = long_prefill_token_threshold
        cfg.priority = policy == "priority"
        cfg.watermark = watermark
        self.core = new CV1Scheduler(num_blocks, block_size, enable_prefix_caching, cfg, token)
        self.core.pool().record_events = record_events
        self.core.pool().prefix_cache_events = prefix_cache_events
        self.event_capacity = event_capacity
        self.core.pool().events.reserve(event_capacity)
        if track_residency:
            if residency_capacity < 1:
                raise ValueError(f"residency_capacity must be >= 1, got {residency_capacity}")
            self.residency = new CResidencyTracker(num_blocks, residency_capacity, residency_seed)
        if track_usage:
            self.usage = new CUsageTracker(block_size)

    def __dealloc__(self):
        del self.loop
        del self.core
        del self.residency
        del self.usage

    @classmethod
    def from_config(
        cls, config, int32_t num_blocks, int32_t block_size, cbool enable_prefix_caching=False,
        **kwargs,
    ):
        """A V1Core for a SchedulerConfig (``scheduler="v1"``); ``kwargs``: the other
        keyword arguments (``watermark``, ``token``, ``record_events``, ...)."""
        if config.scheduler != "v1":
            raise ValueError(f"V1Core needs scheduler='v1', got {config.scheduler!r}")
        return cls(
            num_blocks, block_size, enable_prefix_caching,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            policy=config.policy,
            **kwargs,
        )

    # --- requests ---------------------------------------------------------------------------

    def add_token_request(
        self, int64_t seq_id, token_ids, int64_t max_tokens, double arrival_time=0.0,
        int64_t priority=0, cbool stops_on_token=False,
    ):
        cdef vector[int64_t] tokens = token_ids
        return self.core.add_token_request(
            seq_id, tokens.data(), <int32_t>tokens.size(), max_tokens, arrival_time, priority,
            stops_on_token,
        )

    def add_hash_id_request(
        self, int64_t seq_id, int32_t num_prompt_tokens, hash_ids, int32_t hash_block_size,
        int64_t max_tokens, double arrival_time=0.0, int64_t priority=0,
        cbool stops_on_token=False,
    ):
        cdef vector[int64_t] ids = [hash(int(h)) for h in hash_ids]
        return self.core.add_hash_id_request(
            seq_id, num_prompt_tokens, ids.data(), <int32_t>ids.size(), hash_block_size,
            max_tokens, arrival_time, priority, stops_on_token,
        )

    def add_unique_request(
        self, int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens,
        double arrival_time=0.0, int64_t priority=0, cbool stops_on_token=False,
    ):
        return self.core.add_unique_request(
            seq_id, num_prompt_tokens, max_tokens, arrival_time, priority, stops_on_token
        )

    def abort(self, int64_t seq_id):
        return self.core.abort(seq_id)

    def set_time(self, double time_s):
        self.core.set_time(time_s)

    # --- steps ------------------------------------------------------------------------------

    def schedule(self):
        return _step_tuple(self.core.schedule())

    def update(self):
        cdef const vector[FinishedRecord]* done = &self.core.update()
        cdef size_t i
        cdef list out = []
        for i in range(done.size()):
            if done[0][i].status == 3:  # FINISHED_LENGTH: the usual case, no decoding
                out.append((done[0][i].seq_id, _LENGTH, _LENGTH_REASON))
            else:
                out.append((
                    done[0][i].seq_id, STATUS_VALUES[done[0][i].status],
                    done[0][i].reason.decode(),
                ))
        return out

    @property
    def last_step(self):
        return _step_tuple(self.core.last_step())

    cdef list _seq_ids(self, const vector[int32_t]& handles):
        cdef size_t i
        return [self.core.request(handles[i]).seq_id for i in range(handles.size())]

    def scheduled(self):
        return self._seq_ids(self.core.scheduled()), list(self.core.num_new_tokens())

    def preempted(self):
        return list(self.core.preempted())

    def rejected(self):
        return list(self.core.rejected())

    def admitted(self):
        cdef vector[int32_t] handles = self.core.admitted()
        cdef int32_t h
        return [
            (self.core.request(h).seq_id, self.core.request(h).prefix_hit_tokens)
            for h in handles
        ]

    def running(self):
        return self._seq_ids(self.core.running())

    def waiting(self):
        return self._seq_ids(self.core.waiting())

    def request(self, int64_t seq_id):
        cdef int32_t h = self.core.handle_of(seq_id)
        if h < 0:
            return None
        cdef const V1Request* q = &self.core.request(h)
        return {
            "status": STATUS_VALUES[q.status],
            "num_prompt_tokens": q.num_prompt_tokens,
            "num_generated": q.num_generated,
            "cached_token_count": q.cached,
            "num_preemptions": q.num_preemptions,
            "prefix_hit_tokens": q.prefix_hit_tokens,
            "block_table": list(self.core.pool().get(h).table),
        }

    # --- counters ---------------------------------------------------------------------------

    def has_unfinished(self):
        return self.core.has_unfinished()

    @property
    def num_running(self):
        return self.core.num_running()

    @property
    def num_waiting(self):
        return self.core.num_waiting()

    @property
    def num_cached_tokens(self):
        return self.core.num_cached_tokens()

    @property
    def num_cached_free_blocks(self):
        return self.core.pool().num_cached_free_blocks()

    def get_num_free_blocks(self):
        return self.core.pool().num_free_blocks()

    @property
    def num_used_blocks(self):
        return self.core.pool().num_blocks() - self.core.pool().num_free_blocks()

    @property
    def num_evictions(self):
        return self.core.pool().num_evictions()

    @property
    def num_blocks(self):
        return self.core.pool().num_blocks()

    @property
    def block_size(self):
        return self.core.pool().block_size()

    @property
    def step(self):
        return self.core.step()

    @property
    def watermark_blocks(self):
        return self.core.watermark_blocks()

    def free_queue(self):
        return list(self.core.pool().free_queue())

    # --- events -----------------------------------------------------------------------------

    @property
    def num_events(self):
        return self.core.pool().events.size()

    # --- the engine loop (csrc/sim_loop.hpp) ------------------------------------------------

    def start_loop(self, prices):
        """Price steps with ``prices``: ``{"linear": (base_s, per_token_s)}`` (--step-time's
        clock) or ``CostModel.step_price_terms()``'s dict; then ``run`` steps the core."""
        cdef StepPrices p
        if "linear" in prices:
            p.linear = True
            p.base_s, p.per_token_s = prices["linear"]
        else:
            p.linear = False
            p.seq_table = prices["seq_table"]
            p.token_table = prices["token_table"]
            p.decode_fixed = prices["decode_fixed"]
            p.decode_slope = prices["decode_slope"]
            p.decode_base = prices["decode_base"]
            (p.overhead, p.walk, p.walk_in_profile, p.pre_fixed, p.pre_seq, p.pre_causal,
             p.pre_cached, p.pre_context, p.pre_token) = [prices[n] for n in _PRICE_SCALARS]
        del self.loop
        self.loop = new CSimLoop(self.core, p)

    cdef CSimLoop* _loop(self) except NULL:
        if self.loop == NULL:
            raise RuntimeError("call start_loop first")
        return self.loop

    def run(
        self, double now, double next_due, int64_t report_at, size_t chunk_events,
        cbool stop_on_finish,
    ):
        """Step from ``now`` while steps end before ``next_due`` (s); returns why it stopped
        (LOOP_OUTCOMES' index; csrc/sim_loop.hpp)."""
        return self._loop().run(now, next_due, report_at, chunk_events, stop_on_finish)

    def finish_pending(self, double now):
        """The pending step (``run`` returned ``pending``) ended at ``now``: update."""
        self._loop().finish_pending(now)

    @property
    def loop_now(self):
        return self._loop().now()

    @property
    def pending_dt(self):
        return self._loop().pending_dt()

    @property
    def num_steps(self):
        return self._loop().num_steps()

    def take_finished(self):
        """The requests finished since the last take, as ``update()`` gives them."""
        cdef CSimLoop* loop = self._loop()
        cdef size_t i
        cdef list out = []
        for i in range(loop.finished.size()):
            if loop.finished[i].status == 3:  # FINISHED_LENGTH: the usual case
                out.append((loop.finished[i].seq_id, _LENGTH, _LENGTH_REASON))
            else:
                out.append((
                    loop.finished[i].seq_id, STATUS_VALUES[loop.finished[i].status],
                    loop.finished[i].reason.decode(),
                ))
        loop.finished.clear()
        return out

    def take_step_records(self):
        """The recorded steps' columns (duration_s, filled_slots, num_running,
        cached_free_blocks, prefill_at, prefill_tokens) as numpy arrays; the loop keeps none."""
        cdef CSimLoop* loop = self._loop()
        cdef size_t n = loop.duration_s.size()
        cdef size_t p = loop.prefill_at.size()
        return {
            "duration_s": _owned_array(loop.duration_s.release(), n, "d", 8, np.float64),
            "filled_slots": _owned_array(loop.filled_slots.release(), n, "q", 8, np.int64),
            "num_running": _owned_array(loop.num_running.release(), n, "q", 8, np.int64),
            "cached_free_blocks": _owned_array(
                loop.cached_free_blocks.release(), n, "q", 8, np.int64
            ),
            "prefill_at": _owned_array(loop.prefill_at.release(), p, "q", 8, np.int64),
            "prefill_tokens": _owned_array(loop.prefill_tokens.release(), p, "q", 8, np.int64),
        }

    def set_final_length(self, int64_t seq_id, int64_t final_length):
        """With ``track_usage``: T of ``seq_id`` (tokens: its prompt and the tokens it
        generates when it runs to its end), given before its first step."""
        if self.usage == NULL:
            raise RuntimeError("this core tracks no usage (track_usage=False)")
        self.usage.set_final_length(seq_id, final_length)

    def usage_state(self):
        """With ``track_usage``: UsageTracker.state of the events taken so far; None
        without it."""
        if self.usage == NULL:
            return None
        return _usage_state(self.usage)

    def residency_state(self):
        """With ``track_residency``: ResidencyTracker.state of the events taken so far;
        None without it."""
        if self.residency == NULL:
            return None
        return _residency_state(self.residency)

    def take_events(self):
        """As BlockPool.take_events, plus the STEP rows' columns (EventRecorder's
        ``step_columns``). With ``track_residency`` the events are first accounted for
        the block residency samples (``residency_state``)."""
        if self.residency != NULL:
            self.residency.consume(self.core.pool().events)
        if self.usage != NULL:
            self.usage.consume(self.core.pool().events)
        columns, block_ids, block_hashes = _take_events(
            &self.core.pool().events, self.event_capacity
        )
        cdef size_t ns = self.core.step_kinds.size()
        kinds = _owned_array(self.core.step_kinds.release(), ns, "b", 1, np.int8)
        num_seqs = _owned_array(self.core.step_num_seqs.release(), ns, "q", 8, np.int64)
        is_step = columns["kind"] == 10  # EventKind.STEP
        steps = {
            "time_s": columns["time_s"][is_step],
            "step": columns["step"][is_step].astype(np.int64),
            "kind": kinds,
            "num_seqs": num_seqs,
            "num_batched_tokens": columns["num_tokens"][is_step].astype(np.int64),
            "free_blocks": columns["free_blocks"][is_step].astype(np.int64),
        }
        return columns, block_ids, block_hashes, steps
