# events.parquet's rows from the event columns, without the GIL
# (included by _core.pyx: one extension module, split for reading)

cdef int8_t _CACHE = 12  # EventKind.CACHE, EventKind.EVICT: the events whose blocks carry keys
cdef int8_t _EVICT = 13


def explode_events(dict cols, block_ids, block_hashes=None):
    """kvsim/analysis/events_io.py's ``_exploded_columns``, compiled: one row per (event,
    block), an event without blocks one row with block_id -1; with ``block_hashes`` (the
    keys of the CACHE and EVICT blocks, in order) a ``block_hash`` column, 0 elsewhere. The
    loop runs without the GIL, so the writer thread does not hold up the simulation."""
    cdef const double[::1] time_s = np.ascontiguousarray(cols["time_s"], dtype=np.float64)
    cdef const int32_t[::1] step = np.ascontiguousarray(cols["step"], dtype=np.int32)
    cdef const int8_t[::1] kind = np.ascontiguousarray(cols["kind"], dtype=np.int8)
    cdef const int32_t[::1] seq_id = np.ascontiguousarray(cols["seq_id"], dtype=np.int32)
    cdef const int32_t[::1] free_blocks = np.ascontiguousarray(cols["free_blocks"], dtype=np.int32)
    cdef const int32_t[::1] num_tokens = np.ascontiguousarray(cols["num_tokens"], dtype=np.int32)
    cdef const int32_t[::1] counts = np.ascontiguousarray(cols["num_blocks"], dtype=np.int32)
    cdef const int64_t[::1] blocks = np.ascontiguousarray(block_ids, dtype=np.int64)
    cdef bint keyed = block_hashes is not None
    cdef const int64_t[::1] hashes = np.ascontiguousarray(
        block_hashes if keyed else np.zeros(0, dtype=np.int64), dtype=np.int64
    )
    cdef Py_ssize_t n = kind.shape[0], i, j, r = 0, b = 0, h = 0, m
    counts_np = np.asarray(counts)
    if (counts_np < 0).any() or int(counts_np.sum()) != blocks.shape[0]:
        raise ValueError(f"num_blocks must sum to the {blocks.shape[0]} block ids")
    cdef Py_ssize_t rows = int(np.maximum(counts_np, 1).sum())
    if keyed:
        hashed = np.isin(np.asarray(kind), (_CACHE, _EVICT))
        need = int(counts_np[hashed].sum())
        if need != hashes.shape[0]:
            raise ValueError(f"{hashes.shape[0]} block keys for {need} CACHE/EVICT blocks")
    out = {
        "time_s": np.empty(rows, dtype=np.float64),
        "step": np.empty(rows, dtype=np.int64),
        "kind": np.empty(rows, dtype=np.int8),
        "seq_id": np.empty(rows, dtype=np.int64),
        "block_id": np.empty(rows, dtype=np.int64),
        "free_blocks": np.empty(rows, dtype=np.int64),
        "num_tokens": np.empty(rows, dtype=np.int64),
    }
    cdef double[::1] o_time = out["time_s"]
    cdef int64_t[::1] o_step = out["step"]
    cdef int8_t[::1] o_kind = out["kind"]
    cdef int64_t[::1] o_seq = out["seq_id"]
    cdef int64_t[::1] o_block = out["block_id"]
    cdef int64_t[::1] o_free = out["free_blocks"]
    cdef int64_t[::1] o_tokens = out["num_tokens"]
    cdef int64_t[::1] o_hash
    if keyed:
        out["block_hash"] = np.zeros(rows, dtype=np.int64)
        o_hash = out["block_hash"]
    with nogil:
        for i in range(n):
            m = counts[i]
            for j in range(m if m > 0 else 1):
                o_time[r] = time_s[i]
                o_step[r] = step[i]
                o_kind[r] = kind[i]
                o_seq[r] = seq_id[i]
                o_free[r] = free_blocks[i]
                o_tokens[r] = num_tokens[i]
                if m > 0:
                    o_block[r] = blocks[b]
                    b += 1
                    if keyed and (kind[i] == _CACHE or kind[i] == _EVICT):
                        o_hash[r] = hashes[h]
                        h += 1
                else:
                    o_block[r] = -1
                r += 1
    return out
