# The compiled classic scheduler and its engine loop (csrc/classic_scheduler.hpp, sim_loop.hpp).
# (included by _core.pyx after _v1core.pxi, whose step tuple, price terms and status names it
# shares, as V1Core shares the finished tuples, step prices and STEP columns made here: one
# extension module, split for reading)

cdef extern from "csrc/classic_scheduler.hpp" namespace "kvsim":
    cdef cppclass ClassicConfig:
        int32_t max_num_seqs
        int32_t max_num_batched_tokens
        int32_t max_model_len

    cdef cppclass ClassicRequest:
        int64_t seq_id
        int32_t num_prompt_tokens
        int32_t num_generated
        int32_t cached
        SeqStatus status
        int32_t num_preemptions
        vector[int32_t] table

    cdef cppclass CClassicPool "kvsim::ClassicPool":
        int32_t num_blocks()
        int32_t block_size()
        int32_t watermark_blocks()
        int32_t num_free_blocks()
        vector[int32_t] free_queue()
        EventBuffer events
        cbool record_events

    cdef cppclass CClassicScheduler "kvsim::ClassicScheduler":
        CClassicScheduler(
            int32_t num_blocks, int32_t block_size, double watermark, const ClassicConfig& config
        ) except +
        void add_request(int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens) except +
        cbool abort(int64_t seq_id) except +
        void set_time(double time_s)
        const StepInfo& schedule() except +
        const vector[FinishedRecord]& update() except +
        cbool has_unfinished()
        int32_t num_running()
        int32_t num_waiting()
        int64_t num_cached_tokens()
        int32_t step()
        cbool pending()
        const StepInfo& last_step()
        CClassicPool& pool()
        const vector[int32_t]& scheduled()
        vector[int32_t] num_new_tokens()
        const vector[int64_t]& preempted()
        const vector[int64_t]& rejected()
        const vector[int32_t]& running()
        vector[int32_t] waiting()
        const ClassicRequest& request(int32_t h) except +
        int32_t handle_of(int64_t seq_id)
        Column[int8_t] step_kinds
        Column[int64_t] step_num_seqs


cdef extern from "csrc/sim_loop.hpp" namespace "kvsim":
    cdef cppclass CClassicLoop "kvsim::SimLoopOf<kvsim::ClassicScheduler>":
        CClassicLoop(CClassicScheduler* scheduler, StepPrices prices) except +
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


cdef list _finished_tuples(const vector[FinishedRecord]& done):
    """(seq_id, SequenceStatus value, finish_reason) of each finished request."""
    cdef size_t i
    cdef list out = []
    for i in range(done.size()):
        if done[i].status == 3:  # FINISHED_LENGTH: the usual case, no decoding
            out.append((done[i].seq_id, _LENGTH, _LENGTH_REASON))
        else:
            out.append((done[i].seq_id, STATUS_VALUES[done[i].status], done[i].reason.decode()))
    return out


cdef StepPrices _step_prices(prices) except *:
    """StepPrices from ``{"linear": (base_s, per_token_s)}`` or
    ``CostModel.step_price_terms()``'s dict."""
    cdef StepPrices p
    if "linear" in prices:
        p.linear = True
        p.base_s, p.per_token_s = prices["linear"]
        return p
    p.linear = False
    p.seq_table = prices["seq_table"]
    p.token_table = prices["token_table"]
    p.decode_fixed = prices["decode_fixed"]
    p.decode_slope = prices["decode_slope"]
    p.decode_base = prices["decode_base"]
    (p.overhead, p.walk, p.walk_in_profile, p.pre_fixed, p.pre_seq, p.pre_causal,
     p.pre_cached, p.pre_context, p.pre_token) = [prices[n] for n in _PRICE_SCALARS]
    return p


cdef class ClassicCore:
    """vLLM's classic (2023) scheduler over the compiled FIFO block pool, for
    placeholder-token runs (csrc/classic_scheduler.hpp): the decisions, block ids, events
    and counters of engine/core/scheduler.py's Scheduler driving a BlockManager (the
    FastDecodeScheduler's, which are the same). Requests are named by their seq_id.

    Per step: ``schedule()`` returns a tuple (``STEP_FIELDS``), ``update()`` the finished
    requests as (seq_id, status, finish_reason). With ``record_events`` the scheduler's and
    the pool's events go into one buffer (``take_events``), stamped with the time last given
    to ``set_time``. ``run`` and the rest of the engine loop are V1Core's (sim_loop.hpp).
    """

    cdef CClassicScheduler* core
    cdef size_t event_capacity
    cdef CUsageTracker* usage
    cdef CClassicLoop* loop

    def __cinit__(
        self,
        int32_t num_blocks,
        int32_t block_size,
        *,
        double watermark=0.0,
        int32_t max_num_seqs=256,
        int32_t max_num_batched_tokens=8192,
        max_model_len=None,
        cbool record_events=True,
        size_t event_capacity=0,
        cbool track_usage=False,
    ):
        cdef ClassicConfig cfg
        cfg.max_num_seqs = max_num_seqs
        cfg.max_num_batched_tokens = max_num_batched_tokens
        cfg.max_model_len = -1 if max_model_len is None else max_model_len
        self.core = new CClassicScheduler(num_blocks, block_size, watermark, cfg)
        self.core.pool().record_events = record_events
        self.event_capacity = event_capacity
        self.core.pool().events.reserve(event_capacity)
        if track_usage:
            self.usage = new CUsageTracker(block_size)

    def __dealloc__(self):
        del self.loop
        del self.core
        del self.usage

    @classmethod
    def from_config(cls, config, int32_t num_blocks, int32_t block_size, **kwargs):
        """A ClassicCore for a SchedulerConfig (``scheduler="classic"``, which reads only
        the batch limits and ``max_model_len``); ``kwargs``: the other keyword arguments
        (``watermark``, ``record_events``, ...)."""
        if config.scheduler != "classic":
            raise ValueError(f"ClassicCore needs scheduler='classic', got {config.scheduler!r}")
        return cls(
            num_blocks, block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            **kwargs,
        )

    # --- requests ---------------------------------------------------------------------------

    def add_request(self, int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens):
        """Queue a new request of ``num_prompt_tokens`` generating ``max_tokens`` (ARRIVE)."""
        self.core.add_request(seq_id, num_prompt_tokens, max_tokens)

    def abort(self, int64_t seq_id):
        return self.core.abort(seq_id)

    def set_time(self, double time_s):
        self.core.set_time(time_s)

    # --- steps ------------------------------------------------------------------------------

    def schedule(self):
        return _step_tuple(self.core.schedule())

    def update(self):
        return _finished_tuples(self.core.update())

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

    def running(self):
        return self._seq_ids(self.core.running())

    def waiting(self):
        return self._seq_ids(self.core.waiting())

    def request(self, int64_t seq_id):
        cdef int32_t h = self.core.handle_of(seq_id)
        if h < 0:
            return None
        cdef const ClassicRequest* q = &self.core.request(h)
        return {
            "status": STATUS_VALUES[q.status],
            "num_prompt_tokens": q.num_prompt_tokens,
            "num_generated": q.num_generated,
            "cached_token_count": q.cached,
            "num_preemptions": q.num_preemptions,
            "block_table": list(q.table),
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

    def get_num_free_blocks(self):
        return self.core.pool().num_free_blocks()

    @property
    def num_used_blocks(self):
        return self.core.pool().num_blocks() - self.core.pool().num_free_blocks()

    @property
    def num_blocks(self):
        return self.core.pool().num_blocks()

    @property
    def block_size(self):
        return self.core.pool().block_size()

    @property
    def watermark_blocks(self):
        return self.core.pool().watermark_blocks()

    @property
    def step(self):
        return self.core.step()

    def free_queue(self):
        return list(self.core.pool().free_queue())

    @property
    def num_events(self):
        return self.core.pool().events.size()

    # --- the engine loop (csrc/sim_loop.hpp), as V1Core's ------------------------------------

    def start_loop(self, dict prices):
        """Price steps with ``prices`` (as V1Core.start_loop); then ``run`` steps the core."""
        del self.loop
        self.loop = new CClassicLoop(self.core, _step_prices(prices))

    cdef CClassicLoop* _loop(self) except NULL:
        if self.loop == NULL:
            raise RuntimeError("call start_loop first")
        return self.loop

    def run(
        self, double now, double next_due, int64_t report_at, size_t chunk_events,
        cbool stop_on_finish,
    ):
        """As V1Core.run: step while steps end before ``next_due`` (s); returns why it
        stopped (LOOP_OUTCOMES' index)."""
        cdef CClassicLoop* loop = self._loop()
        cdef int32_t outcome
        with nogil:  # the events writer thread encodes while the core steps
            outcome = loop.run(now, next_due, report_at, chunk_events, stop_on_finish)
        return outcome

    def finish_pending(self, double now):
        cdef CClassicLoop* loop = self._loop()
        with nogil:
            loop.finish_pending(now)

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
        cdef CClassicLoop* loop = self._loop()
        out = _finished_tuples(loop.finished)
        loop.finished.clear()
        return out

    def take_step_records(self):
        """The recorded steps' columns (duration_s, filled_slots, num_running, prefill_at,
        prefill_tokens) as numpy arrays; the loop keeps none."""
        cdef CClassicLoop* loop = self._loop()
        cdef size_t n = loop.duration_s.size()
        cdef size_t p = loop.prefill_at.size()
        return {
            "duration_s": _owned_array(loop.duration_s.release(), n, "d", 8, np.float64),
            "filled_slots": _owned_array(loop.filled_slots.release(), n, "q", 8, np.int64),
            "num_running": _owned_array(loop.num_running.release(), n, "q", 8, np.int64),
            "prefill_at": _owned_array(loop.prefill_at.release(), p, "q", 8, np.int64),
            "prefill_tokens": _owned_array(loop.prefill_tokens.release(), p, "q", 8, np.int64),
        }

    def set_final_length(self, int64_t seq_id, int64_t final_length):
        """With ``track_usage``: T of ``seq_id`` (as V1Core.set_final_length)."""
        if self.usage == NULL:
            raise RuntimeError("this core tracks no usage (track_usage=False)")
        self.usage.set_final_length(seq_id, final_length)

    def release_trackers(self):
        """Free the usage tracker once its state is taken (as V1Core.release_trackers):
        ``usage_state`` gives None afterwards."""
        del self.usage
        self.usage = NULL

    def usage_state(self):
        """With ``track_usage``: UsageTracker.state of the events taken so far; None
        without it."""
        if self.usage == NULL:
            return None
        return _usage_state(self.usage)

    def residency_state(self):
        """None: the classic pool caches nothing, so there are no residency samples."""
        return None

    def take_events(self):
        """As V1Core.take_events (no CACHE / EVICT keys: the third array is empty)."""
        cdef EventBuffer* ev = &self.core.pool().events
        if self.usage != NULL:
            with nogil:
                self.usage.consume(ev[0])
        columns, block_ids, block_hashes = _take_events(ev, self.event_capacity)
        cdef size_t ns = self.core.step_kinds.size()
        kinds = _owned_array(self.core.step_kinds.release(), ns, "b", 1, np.int8)
        num_seqs = _owned_array(self.core.step_num_seqs.release(), ns, "q", 8, np.int64)
        return columns, block_ids, block_hashes, _step_columns(columns, kinds, num_seqs)


cdef dict _step_columns(dict columns, kinds, num_seqs):
    """EventRecorder.step_columns of a taken chunk: its STEP rows, with the kinds and batch
    sizes kept beside the buffer."""
    is_step = columns["kind"] == 10  # EventKind.STEP
    return {
        "time_s": columns["time_s"][is_step],
        "step": columns["step"][is_step].astype(np.int64),
        "kind": kinds,
        "num_seqs": num_seqs,
        "num_batched_tokens": columns["num_tokens"][is_step].astype(np.int64),
        "free_blocks": columns["free_blocks"][is_step].astype(np.int64),
    }
