# The compiled CPU offload tier (csrc/offload_tier.hpp, csrc/offload_policies.hpp,
# csrc/arc_policy.hpp).
# (included by _core.pyx: one extension module, split for reading)

cdef extern from "csrc/offload_tier.hpp" namespace "kvsim":
    cdef cppclass CCpuTier "kvsim::CpuTier":
        CCpuTier(int64_t num_chunks, cbool arc) except +
        int64_t num_chunks()
        int64_t num_free()
        int64_t num_held()
        int64_t num_evictable
        int64_t num_write_pending
        int64_t num_stored
        int64_t num_evicted
        void add_positions(
            int64_t req, const int64_t* keys, size_t n, int64_t first, int64_t step
        ) except +
        int8_t lookup(int64_t key) except +
        void prepare_load(int64_t req, const int64_t* keys, size_t n) except +
        void complete_load(const int64_t* keys, size_t n) except +
        cbool prepare_store(
            int64_t req, const int64_t* keys, size_t n,
            vector[int64_t]& to_store, vector[int64_t]& evicted
        ) except +
        int64_t complete_store(const int64_t* keys, size_t n) except +
        void on_request_finished(int64_t req) except +
        void held_keys(vector[int64_t]& out) except +
        size_t num_requests()
        double target_t1_size "policy().target_t1_size"() except +


cdef class CpuTier:
    """vLLM 0.33's CPU offloading manager with an LRU or ARC policy, compiled: the same
    interface and answers as engine/offload/cpu_manager.py's CPUOffloadManager, except that
    a request's access record is kept in the tier under the id ``new_context`` returns (the
    request's seq id) instead of a RequestContext object."""

    cdef CCpuTier* tier
    cdef readonly str policy_name
    cdef object _results  # LookupResult by the C++ enum's value
    cdef object _output  # PrepareStoreOutput

    def __cinit__(self, int64_t num_chunks, str policy="lru"):
        from engine.offload.cpu_manager import LookupResult, PrepareStoreOutput
        from engine.offload.policies import POLICIES

        if policy not in POLICIES:
            raise ValueError(f"offload policy must be one of {sorted(POLICIES)}, got {policy!r}")
        self.tier = new CCpuTier(num_chunks, policy == "arc")
        self.policy_name = policy
        self._results = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)
        self._output = PrepareStoreOutput

    def __dealloc__(self):
        del self.tier

    @property
    def num_chunks(self):
        return self.tier.num_chunks()

    @property
    def num_free(self):
        return self.tier.num_free()

    @property
    def num_held(self):
        return self.tier.num_held()

    @property
    def num_evictable(self):
        return self.tier.num_evictable

    @property
    def num_write_pending(self):
        return self.tier.num_write_pending

    @property
    def num_stored(self):
        return self.tier.num_stored

    @property
    def num_evicted(self):
        return self.tier.num_evicted

    @property
    def target_t1_size(self):
        return self.tier.target_t1_size()

    @property
    def num_contexts(self):
        """Requests whose access record the tier keeps (dropped when they finish)."""
        return self.tier.num_requests()

    def new_context(self, int64_t seq_id):
        return seq_id

    def add_positions(self, int64_t ctx, keys, int64_t first, int64_t step):
        cdef vector[int64_t] v = keys
        self.tier.add_positions(ctx, v.data(), v.size(), first, step)

    def lookup(self, int64_t key):
        return self._results[self.tier.lookup(key)]

    def prepare_load(self, keys, int64_t ctx):
        cdef vector[int64_t] v = keys
        self.tier.prepare_load(ctx, v.data(), v.size())

    def complete_load(self, keys):
        cdef vector[int64_t] v = list(keys)
        self.tier.complete_load(v.data(), v.size())

    def prepare_store(self, keys, int64_t ctx):
        cdef vector[int64_t] v = keys
        cdef vector[int64_t] to_store
        cdef vector[int64_t] evicted
        if not self.tier.prepare_store(ctx, v.data(), v.size(), to_store, evicted):
            return None
        return self._output(to_store, evicted)

    def complete_store(self, keys):
        cdef vector[int64_t] v = list(keys)
        return self.tier.complete_store(v.data(), v.size())

    def on_request_finished(self, int64_t ctx):
        self.tier.on_request_finished(ctx)

    def held_keys(self):
        cdef vector[int64_t] out
        self.tier.held_keys(out)
        return out


cdef extern from "csrc/transfer_link.hpp" namespace "kvsim":
    cdef cppclass LinkCompletion:
        double time
        int64_t seq
        int64_t job

    cdef cppclass CDirection "kvsim::SharedDirection":
        double bandwidth
        double latency
        size_t in_flight()
        size_t active()

    cdef cppclass CFifoDirection "kvsim::FifoDirection":
        double bandwidth
        double latency
        size_t in_flight()
        size_t active()

    cdef cppclass CSharedLink "kvsim::SharedLink":
        CSharedLink(double read_bytes_per_s, double write_bytes_per_s, double latency_s) except +
        double now()
        const CDirection& direction(int d)
        size_t in_flight()
        void submit(int64_t job, int direction, double nbytes, double now) except +
        cbool next_completion_time(double& out)
        const vector[LinkCompletion]& advance(double now) except +

    cdef cppclass CFifoLink "kvsim::FifoLink":
        CFifoLink(double read_bytes_per_s, double write_bytes_per_s, double latency_s) except +
        double now()
        const CFifoDirection& direction(int d)
        size_t in_flight()
        void submit(int64_t job, int direction, double nbytes, double now) except +
        cbool next_completion_time(double& out)
        const vector[LinkCompletion]& advance(double now) except +


cdef class CompiledTransferLink:
    """engine/offload/transfer.py's TransferLink, compiled (csrc/transfer_link.hpp): the same
    interface and the same completion times bit for bit, for integer job ids."""

    cdef CSharedLink* shared
    cdef CFifoLink* fifo
    cdef readonly str discipline
    cdef object _check_number
    cdef object _error

    def __cinit__(
        self,
        read_bytes_per_s,
        write_bytes_per_s,
        latency_s,
        *,
        str discipline="shared",
    ):
        from engine.offload.transfer import DISCIPLINES, TransferError, _check_number

        _check_number("read_bytes_per_s", read_bytes_per_s, positive=True)
        _check_number("write_bytes_per_s", write_bytes_per_s, positive=True)
        _check_number("latency_s", latency_s, positive=False)
        if discipline not in DISCIPLINES:
            raise TransferError(f"discipline must be one of {DISCIPLINES}, got {discipline!r}")
        self.discipline = discipline
        self._check_number = _check_number
        self._error = TransferError
        if discipline == "shared":
            self.shared = new CSharedLink(read_bytes_per_s, write_bytes_per_s, latency_s)
        else:
            self.fifo = new CFifoLink(read_bytes_per_s, write_bytes_per_s, latency_s)

    def __dealloc__(self):
        del self.shared
        del self.fifo

    cdef int _side(self, direction) except -1:
        if direction == "read":
            return 0
        if direction == "write":
            return 1
        raise self._error(f"direction must be one of ('read', 'write'), got {direction!r}")

    @property
    def now(self):
        return self.shared.now() if self.shared else self.fifo.now()

    @property
    def latency_s(self):
        return self.shared.direction(0).latency if self.shared else self.fifo.direction(0).latency

    def bandwidth(self, direction):
        cdef int d = self._side(direction)
        return self.shared.direction(d).bandwidth if self.shared else self.fifo.direction(d).bandwidth

    def in_flight(self, direction=None):
        if direction is None:
            return self.shared.in_flight() if self.shared else self.fifo.in_flight()
        cdef int d = self._side(direction)
        return self.shared.direction(d).in_flight() if self.shared else self.fifo.direction(d).in_flight()

    def active(self, direction):
        cdef int d = self._side(direction)
        return self.shared.direction(d).active() if self.shared else self.fifo.direction(d).active()

    def submit(self, int64_t job_id, direction, nbytes, now):
        self._check_number("now", now, positive=False)
        self._check_number("nbytes", nbytes, positive=False)
        cdef int d = self._side(direction)
        try:
            if self.shared:
                self.shared.submit(job_id, d, nbytes, now)
            else:
                self.fifo.submit(job_id, d, nbytes, now)
        except ValueError as exc:
            raise self._error(str(exc)) from None

    def next_completion_time(self):
        cdef double t = 0.0
        cdef cbool known = (
            self.shared.next_completion_time(t) if self.shared else self.fifo.next_completion_time(t)
        )
        return t if known else None

    def advance(self, now):
        return [job for _time, job in self.advance_with_times(now)]

    def advance_with_times(self, now):
        self._check_number("now", now, positive=False)
        cdef const vector[LinkCompletion]* done
        cdef size_t i
        try:
            done = &(self.shared.advance(now) if self.shared else self.fifo.advance(now))
        except ValueError as exc:
            raise self._error(str(exc)) from None
        return [(done[0][i].time, done[0][i].job) for i in range(done[0].size())]
