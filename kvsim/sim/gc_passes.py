"""Fewer passes of Python's cyclic garbage collector while kvsim allocates a lot."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def fewer_gc_passes(gen0_threshold: int = 100_000) -> Iterator[None]:
    """Run the block with the cyclic garbage collector's first threshold raised.

    The engine loop allocates millions of small, acyclic, short-lived objects (block lists,
    finished-sequence lists, simpy events); at Python's default threshold of 700 the
    collector scans the young ones thousands of times per run, 10-20% of the loop. Importing
    numpy, pyarrow and the engine at a command's start did 7 second-generation passes of 3-5
    ms each (kvsim.cli's main runs the whole command in this block). Cycles are still
    collected, only in fewer passes; the previous thresholds are restored on exit."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(gen0_threshold, thresholds[0]), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
