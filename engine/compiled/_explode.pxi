# events.parquet's rows from the event columns, without the GIL
# (included by _core.pyx: one extension module, split for reading)

cdef int8_t _CACHE = 12  # EventKind.CACHE, EventKind.EVICT: the events whose blocks carry keys
cdef int8_t _EVICT = 13


# The exploded columns and their dtypes, in events.parquet's order (block_hash: keyed only).
EXPLODED_DTYPES = {
    "time_s": np.float64, "step": np.int64, "kind": np.int8, "seq_id": np.int64,
    "block_id": np.int64, "free_blocks": np.int64, "num_tokens": np.int64,
}


cdef class ExplodeCursor:
    """One chunk's exploded rows (``explode_events``), written a piece at a time into
    arrays the caller owns: ``fill(out, start)`` writes the next rows at ``out[...][start:]``
    until those arrays are full or the chunk is done. The events writer fills its row-group
    buffer so, with no intermediate arrays to allocate and copy: the whole Azure
    conversation trace's 6.5 M rows (57 bytes each) were exploded into fresh arrays and then
    copied into the buffer, ~13% of the writer thread's CPU (perf)."""

    cdef const double[::1] time_s
    cdef const int32_t[::1] step
    cdef const int8_t[::1] kind
    cdef const int32_t[::1] seq_id
    cdef const int32_t[::1] free_blocks
    cdef const int32_t[::1] num_tokens
    cdef const int32_t[::1] counts
    cdef const int32_t[::1] blocks
    cdef const int64_t[::1] hashes
    cdef readonly bint keyed
    cdef readonly Py_ssize_t rows  # rows of the whole chunk
    cdef readonly Py_ssize_t done_rows  # rows written so far
    cdef Py_ssize_t i, j, b, h  # where the next row comes from: event, its block, id, key

    def __init__(self, dict cols, block_ids, block_hashes=None):
        self.time_s = np.ascontiguousarray(cols["time_s"], dtype=np.float64)
        self.step = np.ascontiguousarray(cols["step"], dtype=np.int32)
        self.kind = np.ascontiguousarray(cols["kind"], dtype=np.int8)
        self.seq_id = np.ascontiguousarray(cols["seq_id"], dtype=np.int32)
        self.free_blocks = np.ascontiguousarray(cols["free_blocks"], dtype=np.int32)
        self.num_tokens = np.ascontiguousarray(cols["num_tokens"], dtype=np.int32)
        self.counts = np.ascontiguousarray(cols["num_blocks"], dtype=np.int32)
        # block ids are int32 in the core (no int64 copy of each chunk's ids)
        blocks = np.asarray(block_ids)
        if blocks.dtype != np.int32 and blocks.size and (
            blocks.min() < -(1 << 31) or blocks.max() >= (1 << 31)
        ):
            raise ValueError("block ids must fit in 32 bits")
        self.blocks = np.ascontiguousarray(blocks, dtype=np.int32)
        self.keyed = block_hashes is not None
        self.hashes = np.ascontiguousarray(
            block_hashes if self.keyed else np.zeros(0, dtype=np.int64), dtype=np.int64
        )
        # One pass over the events checks the counts and sums the rows and keys (numpy's
        # isin, boolean mask and sums took ~0.9 ms per 65,536-event chunk: the cursors of the
        # whole Azure conversation trace's 20 chunks 19 -> 4 ms of the writer thread)
        cdef Py_ssize_t i, n = self.counts.shape[0], blocks_total = 0, rows = 0, need = 0
        cdef int32_t m
        cdef bint negative = False
        with nogil:
            for i in range(n):
                m = self.counts[i]
                if m < 0:
                    negative = True
                    break
                blocks_total += m
                rows += m if m > 0 else 1
                if self.kind[i] == _CACHE or self.kind[i] == _EVICT:
                    need += m
        if negative or blocks_total != self.blocks.shape[0]:
            raise ValueError(f"num_blocks must sum to the {self.blocks.shape[0]} block ids")
        self.rows = rows
        if self.keyed and need != self.hashes.shape[0]:
            raise ValueError(f"{self.hashes.shape[0]} block keys for {need} CACHE/EVICT blocks")
        self.done_rows = self.i = self.j = self.b = self.h = 0

    @property
    def done(self):
        return self.done_rows == self.rows

    def fill(self, dict out, Py_ssize_t start):
        """Write the next rows into ``out``'s arrays (EXPLODED_DTYPES, plus block_hash when
        keyed; all of one length) from index ``start`` on; returns how many were written."""
        cdef double[::1] o_time = out["time_s"]
        cdef int64_t[::1] o_step = out["step"]
        cdef int8_t[::1] o_kind = out["kind"]
        cdef int64_t[::1] o_seq = out["seq_id"]
        cdef int64_t[::1] o_block = out["block_id"]
        cdef int64_t[::1] o_free = out["free_blocks"]
        cdef int64_t[::1] o_tokens = out["num_tokens"]
        cdef int64_t[::1] o_hash = out["block_hash"] if self.keyed else np.zeros(1, np.int64)
        cdef Py_ssize_t end = o_time.shape[0]
        lengths = {o_step.shape[0], o_kind.shape[0], o_seq.shape[0], o_block.shape[0],
                   o_free.shape[0], o_tokens.shape[0], o_hash.shape[0] if self.keyed else end}
        if lengths != {end}:
            raise ValueError("the output arrays must be of one length")
        if not 0 <= start <= end:
            raise ValueError(f"start {start} outside the {end} rows")
        cdef Py_ssize_t r = start, n = self.kind.shape[0], i = self.i, j = self.j
        cdef Py_ssize_t b = self.b, h = self.h, m, k, q
        cdef bint keyed = self.keyed
        cdef double t
        cdef int64_t step, seq, free, tokens
        cdef int8_t kind
        # An event's rows at a time, its values read once and repeated in one loop over the
        # rows (a row at a time, each re-reading its event: init and fill of the whole Azure
        # conversation trace's 6.5 M rows 28.5 -> 24.5 ms over its chunks, medians of 7)
        with nogil:
            while r < end and i < n:
                m = self.counts[i]
                k = (m if m > 0 else 1) - j  # the event's rows still to write
                if k > end - r:
                    k = end - r
                t = self.time_s[i]
                step = self.step[i]
                kind = self.kind[i]
                seq = self.seq_id[i]
                free = self.free_blocks[i]
                tokens = self.num_tokens[i]
                for q in range(r, r + k):
                    o_time[q] = t
                    o_step[q] = step
                    o_kind[q] = kind
                    o_seq[q] = seq
                    o_free[q] = free
                    o_tokens[q] = tokens
                if m > 0:
                    for q in range(k):
                        o_block[r + q] = self.blocks[b + q]
                    b += k
                else:
                    o_block[r] = -1
                if keyed:  # the buffer is reused: every row's key is written
                    if m > 0 and (kind == _CACHE or kind == _EVICT):
                        for q in range(k):
                            o_hash[r + q] = self.hashes[h + q]
                        h += k
                    else:
                        for q in range(r, r + k):
                            o_hash[q] = 0
                r += k
                j += k
                if j >= (m if m > 0 else 1):  # the event's last row
                    i += 1
                    j = 0
        self.i, self.j, self.b, self.h = i, j, b, h
        self.done_rows += r - start
        return r - start


def explode_events(dict cols, block_ids, block_hashes=None):
    """kvsim/analysis/events_io.py's ``_exploded_columns``, compiled: one row per (event,
    block), an event without blocks one row with block_id -1; with ``block_hashes`` (the
    keys of the CACHE and EVICT blocks, in order) a ``block_hash`` column, 0 elsewhere. The
    loop runs without the GIL, so the writer thread does not hold up the simulation."""
    cursor = ExplodeCursor(cols, block_ids, block_hashes)
    out = {name: np.empty(cursor.rows, dtype=dtype) for name, dtype in EXPLODED_DTYPES.items()}
    if cursor.keyed:
        out["block_hash"] = np.empty(cursor.rows, dtype=np.int64)
    cursor.fill(out, 0)
    return out
