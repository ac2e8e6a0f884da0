"""Simulator speed and memory in cost mode.

1. The full Azure 2023 conversation trace (19,366 requests) for llama-2-7b on a100-80gb and
   for llama-2-70b with --tp 2 on a100-80gb (max_num_seqs 128, max_num_batched_tokens 4096),
   block size 16: wall seconds of the simulation loop (events included), of the metrics, and of
   loading; simulated requests per wall second; steps per wall second. Median of --repeats.
   The FastDecodeScheduler on and off, side by side (their results are identical), with the
   events kept in memory; then as `kvsim run` does it, events streamed to a Parquet file.
2. --million: one million synthetic requests (Poisson, lognormal lengths) in cost mode, with
   events streamed to a run folder: the run's wall time (trace loading included), the
   simulation loop's, the CPU of the main thread and of the others (the events writer), and
   the peak RSS of the whole process (issue 26's bars: 20 s and 1 GiB).
3. --schedulers: issue 12's bar, the full Azure 2023 conversation trace (llama-2-7b,
   a100-80gb) under the classic scheduler, v1 without prefix caching and v1 with it (the
   default), in turns within each round, events streamed to Parquet as `kvsim run` does:
   medians of the simulation loop and of the whole run, and each one's ratio to classic
   (bar: v1 within 1.2x, set when both ran in Python; with the extension built both now run
   on compiled cores, ClassicCore doing much less per step than V1Core with its prefix
   cache, so the ratio measures the cores' work, not a regression); beside them the work
   each run does (steps, preemptions, rows of its events.parquet) and the simulation loop's
   time per event row.

    python benchmarks/bench_sim.py [--repeats 3] [--million] [--schedulers]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from kvsim.config import RunConfig
from kvsim.runner import run

CONFIGS = {
    "llama-2-7b / a100-80gb": RunConfig(trace="azure_llm_2023_conv"),
    "llama-2-70b tp2 / a100-80gb": RunConfig(
        trace="azure_llm_2023_conv",
        model="llama-2-70b",
        tp=2,
        max_num_seqs=128,
        max_num_batched_tokens=4096,
    ),
}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_cpu_s() -> float:
    """User and system CPU seconds of the whole process, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_trace(repeats: int) -> None:
    for name, config in CONFIGS.items():
        rows = {}
        for multi in (False, True):
            sims, totals = [], []
            for _ in range(repeats):
                start = time.perf_counter()
                result = run(config.replace(fast_decode=multi))
                totals.append(time.perf_counter() - start)
                sims.append(result.summary["wall_time_s"])
            s = result.summary
            sim = statistics.median(sims)
            rows[multi] = sim
            print(
                f"{name:28s} fast_decode={'on ' if multi else 'off'} "
                f"sim loop {sim:5.2f} s (median of {repeats})  "
                f"with load+metrics {statistics.median(totals):5.2f} s  "
                f"{s['num_requests'] / sim:7,.0f} req/wall-s  "
                f"{s['num_steps'] / sim:7,.0f} steps/s  "
                f"steps {s['num_steps']:,}  events {len(result.events):,}"
            )
        print(f"{'':28s} fast-decode speed-up {rows[False] / rows[True]:.2f}x; target < 3 s")
        # As `kvsim run` does it: events streamed to events.parquet as the run goes.
        sims, totals = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(repeats):
                start = time.perf_counter()
                result = run(config, events_path=Path(tmp) / "events.parquet")
                totals.append(time.perf_counter() - start)
                sims.append(result.summary["wall_time_s"])
        print(
            f"{name:28s} streamed to Parquet  sim loop {statistics.median(sims):5.2f} s  "
            f"with load+metrics {statistics.median(totals):5.2f} s (median of {repeats})"
        )
    print(f"peak RSS {peak_rss_mib():,.0f} MiB")


def write_million_trace(path: Path, num_requests: int, replicas: int = 1) -> None:
    """The --million synthetic trace (Poisson, lognormal lengths) at 16 req/s per replica:
    that keeps llama-3-8b on one H100 busy but not saturated (TTFT p99 about 0.2 s), so a run
    measures the simulator, not an ever-growing queue."""
    from workloads import ArrivalProcess, generate_trace, save_trace

    trace = generate_trace(
        arrivals=ArrivalProcess(rate_per_s=16.0 * replicas, kind="poisson"),
        prompt="lognormal:1000:1.0:4000",
        output="lognormal:200:1.0:2000",
        num_requests=num_requests,
        seed=1,
        name="million",
    )
    save_trace(trace, path)


def bench_million(num_requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "million.jsonl"
        start = time.perf_counter()
        write_million_trace(path, num_requests)
        print(f"generated {num_requests:,} requests in {time.perf_counter() - start:.1f} s")
        config = RunConfig(trace=str(path), model="llama-3-8b", gpu="h100-sxm")
        start = time.perf_counter()
        main_cpu, process_cpu = time.thread_time(), process_cpu_s()
        # As `kvsim run` does: events stream to disk, memory keeps event rows only.
        result = run(config, events_path=Path(tmp) / "events.parquet")
        main_cpu = time.thread_time() - main_cpu
        other_cpu = process_cpu_s() - process_cpu - main_cpu
        print(
            f"{num_requests:,} requests: total {time.perf_counter() - start:.1f} s, sim loop "
            f"{result.summary['wall_time_s']:.1f} s, steps {result.summary['num_steps']:,}, "
            f"finished {result.summary['num_finished']:,}; CPU: main thread {main_cpu:.1f} s, "
            f"other threads (the events writer) {other_cpu:.1f} s; peak RSS "
            f"{peak_rss_mib():,.0f} MiB (issue 26's bars at 1 M: total <= 20 s, RSS <= 1024 MiB)"
        )


SCHEDULERS = {
    "classic": RunConfig(trace="azure_llm_2023_conv", scheduler="classic"),
    "v1, no prefix caching": RunConfig(
        trace="azure_llm_2023_conv", scheduler="v1", enable_prefix_caching=False
    ),
    "v1 (default: prefix caching)": RunConfig(trace="azure_llm_2023_conv", scheduler="v1"),
}


def bench_schedulers(repeats: int) -> None:
    sims: dict[str, list[float]] = {name: [] for name in SCHEDULERS}
    totals: dict[str, list[float]] = {name: [] for name in SCHEDULERS}
    work: dict[str, tuple[int, int, int]] = {}  # steps, preemptions, event rows
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for name, config in SCHEDULERS.items():  # in turns: the machine's speed drifts
                path = Path(tmp) / "events.parquet"
                start = time.perf_counter()
                result = run(config, events_path=path)
                totals[name].append(time.perf_counter() - start)
                sims[name].append(result.summary["wall_time_s"])
                s = result.summary
                rows = pq.ParquetFile(path).metadata.num_rows
                work[name] = (s["num_steps"], s["num_preemptions"], rows)
    base_sim = statistics.median(sims["classic"])
    base_total = statistics.median(totals["classic"])
    print(f"azure_llm_2023_conv, events streamed, medians of {repeats} rounds in turns")
    base_per_row = base_sim / work["classic"][2]
    for name in SCHEDULERS:
        sim, total = statistics.median(sims[name]), statistics.median(totals[name])
        steps, preemptions, rows = work[name]
        per_row = sim / rows
        print(
            f"  {name:30s} sim loop {sim:5.2f} s ({sim / base_sim:4.2f}x classic)  "
            f"whole run {total:5.2f} s ({total / base_total:4.2f}x)  steps {steps:,}  "
            f"preemptions {preemptions:,}  event rows {rows / 1e6:4.2f} M  "
            f"sim loop per row {per_row * 1e9:4.0f} ns ({per_row / base_per_row:4.2f}x)"
        )
    print(
        "  bar (issue 12, set when both schedulers ran in Python): v1 within 1.2x of classic; "
        "classic now runs on ClassicCore when the extension is built (KVSIM_PURE_PYTHON=1: "
        "the Python paths the bar was set on)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--million", action="store_true")
    parser.add_argument(
        "--requests", type=int, default=1_000_000, help="with --million: how many (default 1M)"
    )
    parser.add_argument(
        "--schedulers", action="store_true", help="classic against v1 (issue 12's bar)"
    )
    args = parser.parse_args()
    if args.million:
        bench_million(args.requests)
    elif args.schedulers:
        bench_schedulers(args.repeats)
    else:
        bench_trace(args.repeats)


if __name__ == "__main__":
    main()
