# The compiled CPU offload tier (csrc/offload_tier.hpp, csrc/offload_policies.hpp).
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
