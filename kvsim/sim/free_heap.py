"""Handing the heap's free memory back to the kernel once a long simulation is over."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

# Steps from which a run returns its free heap before the metrics (``return_free_heap``).
LONG_RUN_STEPS = 1 << 20


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def return_free_heap() -> None:
    """Give the kernel back the free pages of glibc's heap (``malloc_trim(0)``); nothing where
    the C library has none (not glibc).

    A simulation frees its event chunks as the events writer takes them, and glibc keeps the
    freed blocks for reuse (kvsim.cli asks it to, and the chunks are below its mmap
    threshold): after a million-request run ~100-200 MB of the heap is free but still
    resident, and the metrics' tables come on top of it. Returned once the simulation is
    over (40 ms at a million requests), the run's peak RSS is that much lower; a short run
    keeps them, for the tables and files to reuse (``LONG_RUN_STEPS``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
