"""Timing discipline for measuring the torch engine on a CPU that other work may share.

- Threads are pinned: ``torch.set_num_threads(threads)`` and one inter-op thread. Left to
  itself torch starts one thread per core, and a thread that loses its core to another process
  stalls every barrier: identical runs then differ by up to 300x.
- Every point is timed ``repeats`` times after warm-up calls, in rounds: each round visits
  every point once, in a fresh seeded order, so a slow spell of the machine lands on all points
  alike instead of on a few; a point's median over all its calls is what is fitted.
- The clock is the wall clock, or (``--timer thread``) the thread's CPU time, which other
  processes taking the core cannot inflate (CLOCKS).
- How noisy the machine was is measured and reported: the spread of each point's repeats,
  (p90 - p10) / median, the drift of the machine's measured peaks between the start and the
  end of a run, and the load average (os.getloadavg) before and after.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

import numpy as np
import torch

from kvsim.config import DEFAULT_THREADS

K = TypeVar("K")

# How a step or an operator is timed (ns): "wall" is the wall clock (what engine mode advances
# simulated time by); "thread" is the calling thread's CPU time, which does not count the time
# other processes held the core: the stable choice on a shared machine, exact for one torch
# thread on a CPU (with more threads, or on CUDA, only the wall clock sees the whole step).
CLOCKS: Mapping[str, Callable[[], int]] = MappingProxyType(
    {"wall": time.perf_counter_ns, "thread": time.thread_time_ns}
)

__all__ = [
    "DEFAULT_THREADS",
    "interleaved",
    "load_average",
    "measure_peaks",
    "pin_threads",
    "spread",
    "stats",
]


def pin_threads(threads: int) -> None:
    """Fix torch's intra-op threads, and its inter-op threads to one (stable timings)."""
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # settable once per process, before parallel work
        torch.set_num_interop_threads(1)


def engine_clock(timer: str, threads: int | None) -> Callable[[], int]:
    """The clock of ``timer`` ("wall" or "thread"); ValueError for an unknown one, or for the
    thread clock with other than one thread (it would miss the other threads' work)."""
    if timer not in CLOCKS:
        raise ValueError(f"timer must be one of {', '.join(CLOCKS)}, got {timer!r}")
    if timer == "thread" and threads != 1:
        raise ValueError(f"the thread timer needs --threads 1 (got {threads}): it times one thread")
    return CLOCKS[timer]


def time_ms(
    fn: Callable[[], object],
    repeats: int,
    warmup: int = 3,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> np.ndarray:
    """Times of ``repeats`` calls of ``fn`` (ms) by ``clock`` (ns; CLOCKS), after ``warmup``
    untimed calls."""
    for _ in range(warmup):
        fn()
    out = np.empty(repeats)
    for i in range(repeats):
        start = clock()
        fn()
        out[i] = (clock() - start) * 1e-6
    return out


def interleaved(
    points: Sequence[K], sample: Callable[[K], np.ndarray], rounds: int, seed: int
) -> dict[K, np.ndarray]:
    """``sample(point)`` for every point in each of ``rounds`` rounds (each in a fresh seeded
    random order), the samples of a point concatenated."""
    rng = np.random.default_rng(seed)
    found: dict[K, list[np.ndarray]] = {point: [] for point in points}
    for _ in range(rounds):
        for index in rng.permutation(len(points)):
            found[points[index]].append(sample(points[index]))
    return {point: np.concatenate(parts) for point, parts in found.items()}


def stats(prefix: str, samples: np.ndarray) -> dict[str, float]:
    """Vidur's statistic columns ``time_stats.<prefix>.{min,max,mean,median,std}`` (ms)."""
    return {
        f"time_stats.{prefix}.min": float(samples.min()),
        f"time_stats.{prefix}.max": float(samples.max()),
        f"time_stats.{prefix}.mean": float(samples.mean()),
        f"time_stats.{prefix}.median": float(np.median(samples)),
        f"time_stats.{prefix}.std": float(samples.std()),
    }


def spread(samples: np.ndarray) -> float:
    """(p90 - p10) / median of one point's repeats: 0 on a quiet machine."""
    p10, p50, p90 = np.percentile(samples, [10, 50, 90])
    return float((p90 - p10) / p50)


def measure_peaks(
    dtype: torch.dtype, repeats: int = 7, clock: Callable[[], int] = time.perf_counter_ns
) -> dict[str, float]:
    """This CPU's achievable peaks with the pinned threads: matmul FLOP/s and copy bytes/s."""
    n = 1024
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    flops = 2 * n**3 / (float(np.median(time_ms(lambda: a @ b, repeats, clock=clock))) * 1e-3)
    src = torch.randn((64 << 20) // (torch.finfo(dtype).bits // 8), dtype=dtype)  # 64 MiB
    dst = torch.empty_like(src)
    moved = 2 * src.numel() * src.element_size()  # read and write
    seconds = float(np.median(time_ms(lambda: dst.copy_(src), repeats, clock=clock))) * 1e-3
    return {"peak_flops": flops, "hbm_bandwidth": moved / seconds}


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (runnable processes), rounded."""
    return [round(v, 2) for v in os.getloadavg()]
