"""Fleet speed and memory (issue 28's scale bars), medians of --repeats, in one process each.

1. The whole Mooncake conversation trace (12,031 requests), llama-3.1-8b on h100-sxm, 8
   replicas under the `prefix` router (bar: <= 30 s), beside `round-robin` on the same fleet
   (what reading the KV events costs), `kvsim run --no-plots`'s work without the CLI.
2. --million: 64 replicas on 1 M synthetic requests (bench_sim.py's --million trace at
   64 x 16 req/s), `round-robin`: wall seconds and peak RSS of the whole
   process (bar: <= 10 min and <= 4 GiB). --requests scales it down.
3. --events: the Mooncake fleet of 1. under `prefix` without events (as 1.), with the
   events.parquet `kvsim run` writes (its ROUTE events, the default) and with
   `--fleet-events all` (every replica's events too), in turns: wall seconds, rows, bytes.

    python benchmarks/bench_fleet.py [--repeats 3] [--replicas 8] [--million [--requests N]]
    python benchmarks/bench_fleet.py --events [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

from kvsim.config import RunConfig
from kvsim.runner import run


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_mooncake(repeats: int, replicas: int) -> None:
    base = RunConfig(
        trace="mooncake_fast25_conversation",
        model="llama-3.1-8b",
        gpu="h100-sxm",
        replicas=replicas,
    )
    walls: dict[str, list[float]] = {"round-robin": [], "prefix": []}
    rates: dict[str, float] = {}
    for _ in range(repeats):
        for router in walls:  # in turns: the machine's speed drifts
            start = time.perf_counter()
            result = run(base.replace(router=router), keep_events=False)
            walls[router].append(time.perf_counter() - start)
            rates[router] = result.summary["prefix_cache_hit_rate"] or 0.0
    print(f"Mooncake conversation, {replicas} replicas, medians of {repeats}")
    for router, values in walls.items():
        print(
            f"  {router:12s} {statistics.median(values):6.1f} s  "
            f"(runs: {', '.join(f'{v:.1f}' for v in values)})  hit rate {rates[router]:.3f}"
        )
    print(f"  bar (issue 28): prefix router <= 30 s; peak RSS {peak_rss_mib():,.0f} MiB")


def bench_events(repeats: int, replicas: int) -> None:
    import pyarrow.parquet as pq

    base = RunConfig(
        trace="mooncake_fast25_conversation",
        model="llama-3.1-8b",
        gpu="h100-sxm",
        replicas=replicas,
        router="prefix",
    )
    modes = {"no events": None, "routing (default)": "routing", "--fleet-events all": "all"}
    walls: dict[str, list[float]] = {mode: [] for mode in modes}
    sizes: dict[str, str] = {}
    for _ in range(repeats):
        for mode, what in modes.items():  # in turns: the machine's speed drifts
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "events.parquet"
                start = time.perf_counter()
                if what is None:
                    run(base, keep_events=False)
                else:
                    run(base.replace(fleet_events=what), events_path=path)
                walls[mode].append(time.perf_counter() - start)
                if path.exists():
                    rows = pq.ParquetFile(path).metadata.num_rows
                    sizes[mode] = f"{rows:,} rows, {path.stat().st_size / 1e6:,.1f} MB"
    print(f"Mooncake conversation, {replicas} replicas, prefix, medians of {repeats}")
    for mode, values in walls.items():
        print(
            f"  {mode:20s} {statistics.median(values):6.1f} s  "
            f"(runs: {', '.join(f'{v:.1f}' for v in values)})  {sizes.get(mode, '')}"
        )


def bench_million(num_requests: int, replicas: int) -> None:
    from bench_sim import write_million_trace  # the same trace, scaled to the fleet

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "million.jsonl"
        write_million_trace(path, num_requests, replicas)
        config = RunConfig(trace=str(path), model="llama-3-8b", gpu="h100-sxm", replicas=replicas)
        start = time.perf_counter()
        result = run(config, keep_events=False)
        wall = time.perf_counter() - start
        print(
            f"{num_requests:,} requests on {replicas} replicas: {wall:.1f} s, "
            f"finished {result.summary['num_finished']:,}; peak RSS {peak_rss_mib():,.0f} MiB "
            "(bars: 600 s, 4096 MiB at 1 M)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=None)
    parser.add_argument("--million", action="store_true")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--events", action="store_true")
    args = parser.parse_args()
    if args.events:
        bench_events(args.repeats, args.replicas or 8)
    elif args.million:
        bench_million(args.requests, args.replicas or 64)
    else:
        bench_mooncake(args.repeats, args.replicas or 8)


if __name__ == "__main__":
    main()
