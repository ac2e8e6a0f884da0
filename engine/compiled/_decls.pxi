# The C++ classes of csrc/ as Cython sees them.
# (included by _core.pyx: one extension module, split for reading)

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
        const vector[Sample]& samples() except + nogil
        int64_t count()
        void release()
        void sum_parts(
            vector[int32_t]& exponents, vector[int64_t]& high, vector[uint64_t]& low
        ) except +


cdef extern from "csrc/residency.hpp" namespace "kvsim":
    cdef cppclass CResidencyTracker "kvsim::ResidencyTracker":
        CResidencyTracker(int32_t num_blocks, size_t capacity, uint64_t seed) except +
        void consume(const EventBuffer& ev) except + nogil
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
        void consume(const EventBuffer& ev) except + nogil
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
        ) except + nogil
        void finish_pending(double now) except + nogil
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


cdef extern from "csrc/open_loop.hpp" namespace "kvsim":
    cdef cppclass ArrivalColumns:
        const double* arrival_time_s
        const int32_t* prompt_tokens
        const int64_t* output_tokens
        const int64_t* priority
        const int64_t* final_length
        const int64_t* key_start
        const int64_t* key_ids
        const int32_t* key_block_size
        size_t size

    cdef cppclass COpenLoopClock "kvsim::OpenLoopClock":
        COpenLoopClock(
            CV1Scheduler* scheduler, CSimLoop* loop, CUsageTracker* usage,
            ArrivalColumns arrivals, double start
        ) except +
        int32_t drive(int64_t report_every, int64_t next_report, size_t chunk_events) except + nogil
        double now()
        size_t num_submitted()
        cbool all_submitted()
