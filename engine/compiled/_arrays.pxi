# Handing C++ columns to numpy without a copy, and the event buffer's columns.
# (included by _core.pyx: one extension module, split for reading)

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
