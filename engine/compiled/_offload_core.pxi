# The compiled offloading scheduler, connector, worker and engine loop
# (csrc/offload_connector.hpp, v1_offload_passes.hpp, offload_loop.hpp).
# (included by _core.pyx after _v1core.pxi: one extension module, split for reading)

from libcpp.unordered_set cimport unordered_set


cdef extern from "csrc/offload_connector.hpp" namespace "kvsim":
    cdef cppclass OffloadJob:
        int64_t job_id
        int64_t seq_id
        cbool is_store
        vector[int64_t] keys
        vector[int32_t] gpu_block_ids

    cdef cppclass OffloadMeta:
        vector[int64_t] load_jobs
        vector[int64_t] store_jobs
        unordered_set[int64_t] jobs_to_flush
        vector[int64_t] evicted_keys

    cdef cppclass COffloadConnector "kvsim::OffloadConnector":
        CCpuTier tier
        int64_t num_loaded_chunks
        int64_t num_stored_chunks
        cbool has_job(int64_t job_id)
        const OffloadJob& job(int64_t job_id) except +
        size_t num_states()


cdef extern from "csrc/v1_scheduler.hpp" namespace "kvsim":
    # the offloading rules of kvsim::V1Scheduler (V1Core's CV1Scheduler declares the rest)
    cdef cppclass COffloadScheduler "kvsim::V1Scheduler":
        void enable_offload(
            int64_t num_chunks, int32_t blocks_per_chunk, cbool arc, cbool prompt_only
        ) except +
        COffloadConnector* connector()
        const OffloadMeta& offload_meta() except +
        const vector[FinishedRecord]& update(const vector[int64_t]& completed) except +
        const vector[OffloadJob]& done_jobs()
        int32_t num_holding()

    cdef cppclass COffloadRequest "kvsim::V1Request":
        int32_t cached
        int32_t prefix_hit_tokens
        int32_t offload_hit_tokens


cdef extern from "csrc/sim_loop.hpp" namespace "kvsim":
    cdef cppclass CSimLoopPrices "kvsim::SimLoop":
        const StepPrices& prices()


cdef extern from "csrc/offload_loop.hpp" namespace "kvsim":
    cdef cppclass COffloadWorker "kvsim::OffloadWorker":
        Column[int64_t] job_id
        Column[int64_t] seq_id
        Column[int64_t] nbytes
        Column[int8_t] is_store
        Column[double] submitted_s
        Column[double] completed_s
        Column[int64_t] num_keys
        Column[int64_t] num_blocks
        Column[int64_t] keys
        Column[int32_t] gpu_block_ids

    cdef cppclass COffloadSimLoop "kvsim::OffloadSimLoop":
        COffloadSimLoop(
            CV1Scheduler* scheduler, StepPrices prices, double read_bytes_per_s,
            double write_bytes_per_s, double latency_s, int64_t bytes_per_block
        ) except +
        int32_t run(
            double now, double next_due, int64_t report_at, size_t chunk_events,
            cbool stop_on_finish
        ) except + nogil
        COffloadWorker worker
        Column[int64_t] tier_chunks
        Column[int64_t] tier_evictions
        Column[int64_t] load_job
        Column[int64_t] load_tokens
        Column[int64_t] load_cached


# Why OffloadV1Core.offload_run handed control back (LOOP_OUTCOMES, then the offload loop's
# own: csrc/offload_loop.hpp).
OFFLOAD_LOOP_OUTCOMES = LOOP_OUTCOMES + ("idle_until",)


cdef tuple _job_tuple(const OffloadJob& job):
    """(job_id, seq_id, is_store, keys, gpu_block_ids): engine.core TransferJob's fields."""
    return (job.job_id, job.seq_id, job.is_store, tuple(job.keys), tuple(job.gpu_block_ids))


cdef class OffloadV1Core(V1Core):
    """V1Core with a KV offload tier behind its prefix cache: engine/v1/offloading_scheduler.py's
    OffloadingV1Scheduler with engine/offload/connector.py's OffloadConnector on the compiled
    CPU tier (no secondary tiers, FCFS), and its engine loop with engine/offload/worker.py's
    OffloadWorker on the compiled transfer link (kvsim/sim/offload_loop.py). Built as V1Core,
    then ``enable_offload`` before any request."""

    cdef COffloadSimLoop* oloop

    def __dealloc__(self):
        # the base's loop pointer is this loop: deleted here, once
        del self.oloop
        self.loop = NULL

    cdef COffloadScheduler* _offload(self) except NULL:
        cdef COffloadScheduler* s = <COffloadScheduler*>self.core
        if s.connector() == NULL:
            raise RuntimeError("call enable_offload first")
        return s

    def enable_offload(
        self, int64_t num_chunks, int32_t blocks_per_chunk=1, str policy="lru",
        cbool offload_prompt_only=True,
    ):
        """A CPU tier of ``num_chunks`` chunks of ``blocks_per_chunk`` GPU blocks, evicting
        by ``policy`` ("lru" or "arc"), as OffloadConfig's."""
        if policy not in ("lru", "arc"):
            raise ValueError(f"offload policy must be 'lru' or 'arc', got {policy!r}")
        (<COffloadScheduler*>self.core).enable_offload(
            num_chunks, blocks_per_chunk, policy == "arc", offload_prompt_only
        )

    # --- a step at a time (tests, golden replays) -------------------------------------------

    def offload_meta(self):
        """The last schedule()'s connector output: load and store jobs (as ``_job_tuple``),
        the job ids to flush (a set) and the tier's evicted keys."""
        cdef COffloadScheduler* s = self._offload()
        cdef const OffloadMeta* meta = &s.offload_meta()
        cdef COffloadConnector* c = s.connector()
        cdef vector[int64_t] loads = meta.load_jobs
        cdef vector[int64_t] stores = meta.store_jobs
        cdef unordered_set[int64_t] flush = meta.jobs_to_flush
        cdef int64_t j
        return {
            "load_jobs": [_job_tuple(c.job(j)) for j in loads],
            "store_jobs": [_job_tuple(c.job(j)) for j in stores],
            "jobs_to_flush": {j for j in flush},
            "evicted_keys": list(meta.evicted_keys),
        }

    def update_offload(self, completed_jobs):
        """update() with the job ids reported done by this step (OffloadingV1Scheduler.update);
        returns the finished requests as update() does."""
        cdef COffloadScheduler* s = self._offload()
        cdef vector[int64_t] completed = completed_jobs
        cdef const vector[FinishedRecord]* done = &s.update(completed)
        cdef size_t i
        return [
            (done[0][i].seq_id, STATUS_VALUES[done[0][i].status], done[0][i].reason.decode())
            for i in range(done.size())
        ]

    def done_jobs(self):
        """The jobs the last update_offload took as completed, as ``_job_tuple``."""
        cdef const vector[OffloadJob]* jobs = &self._offload().done_jobs()
        cdef size_t i
        return [_job_tuple(jobs[0][i]) for i in range(jobs.size())]

    def offload_hits(self, int64_t seq_id):
        """(prefix_hit_tokens, offload_hit_tokens, cached_token_count) of an unfinished
        request, None if it is not one."""
        cdef int32_t h = self.core.handle_of(seq_id)
        if h < 0:
            return None
        cdef const COffloadRequest* q = <const COffloadRequest*>&self.core.request(h)
        return (q.prefix_hit_tokens, q.offload_hit_tokens, q.cached)

    def has_job(self, int64_t job_id):
        return self._offload().connector().has_job(job_id)

    @property
    def num_holding(self):
        return self._offload().num_holding()

    @property
    def tier_num_held(self):
        return self._offload().connector().tier.num_held()

    @property
    def tier_num_evicted(self):
        return self._offload().connector().tier.num_evicted

    def tier_held_keys(self):
        cdef vector[int64_t] out
        self._offload().connector().tier.held_keys(out)
        return list(out)

    # --- the engine loop (csrc/offload_loop.hpp) --------------------------------------------

    def start_offload_loop(
        self, prices, double read_bytes_per_s, double write_bytes_per_s, double latency_s,
        int64_t bytes_per_block,
    ):
        """As V1Core.start_loop, with the worker's link (bytes/s each way, latency s) and
        the KV bytes of one GPU block; then ``offload_run`` steps the core."""
        self._offload()
        self.start_loop(prices)  # the prices, checked and converted
        cdef StepPrices p = (<CSimLoopPrices*>self.loop).prices()
        del self.loop
        self.loop = NULL
        del self.oloop
        self.oloop = new COffloadSimLoop(
            self.core, p, read_bytes_per_s, write_bytes_per_s, latency_s, bytes_per_block
        )
        self.loop = <CSimLoop*>self.oloop

    def offload_run(
        self, double now, double next_due, int64_t report_at, size_t chunk_events,
        cbool stop_on_finish,
    ):
        """Step from ``now`` while nothing reaches ``next_due`` (s); returns why it stopped
        (OFFLOAD_LOOP_OUTCOMES' index; csrc/offload_loop.hpp)."""
        if self.oloop == NULL:
            raise RuntimeError("call start_offload_loop first")
        cdef COffloadSimLoop* loop = self.oloop
        cdef int32_t outcome
        with nogil:
            outcome = loop.run(now, next_due, report_at, chunk_events, stop_on_finish)
        return outcome

    def take_offload_records(self):
        """Every job submitted (JobTiming's columns, in submission order; the chunk keys and
        GPU blocks flat, cut by ``num_keys`` and ``num_blocks``), the tier per executed step
        and each load's (job, tokens loaded, prefix-hit tokens), as numpy arrays."""
        if self.oloop == NULL:
            raise RuntimeError("call start_offload_loop first")
        cdef COffloadWorker* w = &self.oloop.worker
        cdef size_t n = w.job_id.size()
        cdef size_t nk = w.keys.size()
        cdef size_t nb = w.gpu_block_ids.size()
        cdef size_t ns = self.oloop.tier_chunks.size()
        cdef size_t nl = self.oloop.load_job.size()
        return {
            "job_id": _owned_array(w.job_id.release(), n, "q", 8, np.int64),
            "seq_id": _owned_array(w.seq_id.release(), n, "q", 8, np.int64),
            "nbytes": _owned_array(w.nbytes.release(), n, "q", 8, np.int64),
            "is_store": _owned_array(w.is_store.release(), n, "b", 1, np.int8),
            "submitted_s": _owned_array(w.submitted_s.release(), n, "d", 8, np.float64),
            "completed_s": _owned_array(w.completed_s.release(), n, "d", 8, np.float64),
            "num_keys": _owned_array(w.num_keys.release(), n, "q", 8, np.int64),
            "num_blocks": _owned_array(w.num_blocks.release(), n, "q", 8, np.int64),
            "keys": _owned_array(w.keys.release(), nk, "q", 8, np.int64),
            "gpu_block_ids": _owned_array(w.gpu_block_ids.release(), nb, "i", 4, np.int32),
            "tier_chunks": _owned_array(self.oloop.tier_chunks.release(), ns, "q", 8, np.int64),
            "tier_evictions": _owned_array(
                self.oloop.tier_evictions.release(), ns, "q", 8, np.int64
            ),
            "load_job": _owned_array(self.oloop.load_job.release(), nl, "q", 8, np.int64),
            "load_tokens": _owned_array(self.oloop.load_tokens.release(), nl, "q", 8, np.int64),
            "load_cached": _owned_array(self.oloop.load_cached.release(), nl, "q", 8, np.int64),
        }
