# An open-loop replay's clock in the core (csrc/open_loop.hpp).
# (included by _core.pyx: one extension module, split for reading)

# OpenLoopClock.drive's outcomes (csrc/open_loop.hpp's OpenLoopOutcome)
OPEN_LOOP_DONE, OPEN_LOOP_YIELD = 0, 1


cdef class OpenLoopClock:
    """kvsim/sim/inline_clock.py's run_inline in the core (csrc/open_loop.hpp): the requests
    of an open-loop trace, given as columns (request i is seq_id i), submitted to ``core``
    at their arrival times while its engine loop (``V1Core.start_loop``'s, which must not
    be started again) steps between them. ``final_length``: T per request for the core's
    usage tracker (None without one); ``key_start`` / ``key_ids`` / ``key_block_size``:
    the prefix keys (V1Core.add_hash_id_request's ids, already hashed) of request i at
    ``key_ids[key_start[i]:key_start[i + 1]]``, ``key_block_size[i]`` tokens each (0: a
    unique prompt), or all None where no request has any."""

    cdef COpenLoopClock* clock
    cdef V1Core core
    cdef tuple arrays  # the columns the C++ clock reads: kept alive with it

    def __cinit__(
        self, V1Core core, arrival_time_s, prompt_tokens, output_tokens, priority,
        final_length=None, key_start=None, key_ids=None, key_block_size=None,
        double start=0.0,
    ):
        cdef CSimLoop* loop = core._loop()
        arrival = np.ascontiguousarray(arrival_time_s, dtype=np.float64)
        n = len(arrival)
        prompt = np.ascontiguousarray(prompt_tokens, dtype=np.int32)
        output = np.ascontiguousarray(output_tokens, dtype=np.int64)
        prio = np.ascontiguousarray(priority, dtype=np.int64)
        if not len(prompt) == len(output) == len(prio) == n:
            raise ValueError("the request columns must be equally long")
        final = None
        if final_length is not None:
            if core.usage == NULL:
                raise ValueError("final_length needs a core with track_usage")
            final = np.ascontiguousarray(final_length, dtype=np.int64)
            if len(final) != n:
                raise ValueError("final_length must have one entry per request")
        starts = ids = sizes = None
        if key_start is not None:
            starts = np.ascontiguousarray(key_start, dtype=np.int64)
            ids = np.ascontiguousarray(key_ids, dtype=np.int64)
            sizes = np.ascontiguousarray(key_block_size, dtype=np.int32)
            if len(starts) != n + 1 or len(sizes) != n:
                raise ValueError("key_start needs n + 1 offsets and key_block_size n sizes")
            if n and (starts[0] != 0 or starts[n] != len(ids) or (np.diff(starts) < 0).any()):
                raise ValueError("key_start must rise from 0 to len(key_ids)")
        self.arrays = (arrival, prompt, output, prio, final, starts, ids, sizes)
        self.core = core
        cdef ArrivalColumns cols
        cols.size = n
        if n:
            cols.arrival_time_s = <const double*><size_t>arrival.ctypes.data
            cols.prompt_tokens = <const int32_t*><size_t>prompt.ctypes.data
            cols.output_tokens = <const int64_t*><size_t>output.ctypes.data
            cols.priority = <const int64_t*><size_t>prio.ctypes.data
            if final is not None:
                cols.final_length = <const int64_t*><size_t>final.ctypes.data
            if starts is not None:
                cols.key_start = <const int64_t*><size_t>starts.ctypes.data
                cols.key_ids = <const int64_t*><size_t>ids.ctypes.data
                cols.key_block_size = <const int32_t*><size_t>sizes.ctypes.data
        self.clock = new COpenLoopClock(core.core, loop, core.usage, cols, start)

    def __dealloc__(self):
        del self.clock

    def drive(self, int64_t report_every, int64_t next_report, size_t chunk_events):
        """Replay until the run ends (OPEN_LOOP_DONE) or Python is due to take the events
        (at least ``chunk_events``) or report progress (``next_report`` steps recorded):
        OPEN_LOOP_YIELD, then call again. Runs without the GIL."""
        cdef int32_t outcome
        with nogil:
            outcome = self.clock.drive(report_every, next_report, chunk_events)
        return outcome

    @property
    def now(self):
        """The clock's time (s)."""
        return self.clock.now()

    @property
    def num_submitted(self):
        return self.clock.num_submitted()

    @property
    def all_submitted(self):
        return self.clock.all_submitted()
