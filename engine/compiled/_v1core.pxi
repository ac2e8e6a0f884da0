# The compiled v1 scheduler and its engine loop (csrc/v1_scheduler.hpp, sim_loop.hpp).
# (included by _core.pyx: one extension module, split for reading)

# Why V1Core.run handed control back, by the value it returns (csrc/sim_loop.hpp's LoopOutcome).
LOOP_OUTCOMES = ("idle", "wait", "pending", "finished", "events", "report")

# The terms StepPrices reads from ``CostModel.step_price_terms()`` (scalars, then tables).
_PRICE_SCALARS = (
    "overhead", "walk", "walk_in_profile", "pre_fixed", "pre_seq", "pre_causal", "pre_cached",
    "pre_context", "pre_token",
)


# --- the v1 scheduler ---------------------------------------------------------------------------

# SequenceStatus values (engine/core/sequence.py), by the C++ SeqStatus code
STATUS_VALUES = (
    "waiting", "running", "finished_stopped", "finished_length", "finished_aborted",
    "finished_rejected", "waiting_for_kv",
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
        del self.loop
        self.loop = new CSimLoop(self.core, _step_prices(prices))  # _classic.pxi

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
        cdef CSimLoop* loop = self._loop()
        cdef int32_t outcome
        # without the GIL: the events writer thread encodes while the core steps
        with nogil:
            outcome = loop.run(now, next_due, report_at, chunk_events, stop_on_finish)
        return outcome

    def finish_pending(self, double now):
        """The pending step (``run`` returned ``pending``) ended at ``now``: update."""
        cdef CSimLoop* loop = self._loop()
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
        cdef CSimLoop* loop = self._loop()
        out = _finished_tuples(loop.finished)
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

    def take_residency_state(self):
        """``residency_state()``, each reservoir freed as it is copied out, then the
        tracker (``release_trackers``' for it): for the run's end. None without
        ``track_residency``."""
        if self.residency == NULL:
            return None
        state = _residency_state(self.residency, True)
        del self.residency
        self.residency = NULL
        return state

    def release_trackers(self):
        """Free the residency and usage trackers once their states are taken (the three
        residency reservoirs hold up to ~216 MB at a million requests): ``residency_state``
        and ``usage_state`` give None afterwards and ``take_events`` accounts for neither."""
        del self.residency
        self.residency = NULL
        del self.usage
        self.usage = NULL

    def take_events(self):
        """As BlockPool.take_events, plus the STEP rows' columns (EventRecorder's
        ``step_columns``). With ``track_residency`` the events are first accounted for
        the block residency samples (``residency_state``)."""
        cdef EventBuffer* ev = &self.core.pool().events
        if self.residency != NULL:
            with nogil:  # the writer thread may encode meanwhile
                self.residency.consume(ev[0])
        if self.usage != NULL:
            with nogil:
                self.usage.consume(ev[0])
        columns, block_ids, block_hashes = _take_events(
            &self.core.pool().events, self.event_capacity
        )
        cdef size_t ns = self.core.step_kinds.size()
        kinds = _owned_array(self.core.step_kinds.release(), ns, "b", 1, np.int8)
        num_seqs = _owned_array(self.core.step_num_seqs.release(), ns, "q", 8, np.int64)
        return columns, block_ids, block_hashes, _step_columns(columns, kinds, num_seqs)
