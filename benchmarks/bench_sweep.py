"""Wall time of the 9-point block-size sweep (1, 2, 4, ..., 256) of the full Azure 2023
conversation trace: llama-2-7b on an A100-80GB, pool planned from GPU memory, the local process
pool with one worker per CPU. Prints the sweep's wall time (median of --repeats), and per point
its simulator wall time and its whole time (load, simulate, metrics, run folder).

    python benchmarks/bench_sweep.py [--repeats 1] [--jobs N] [--events] [--executor process]
        [--scheduler v1|classic] [--no-prefix-caching]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from kvsim.config import RunConfig
from kvsim.sweep.execute import default_jobs, run_sweep
from kvsim.sweep.spec import make_spec

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TARGET_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="azure_llm_2023_conv")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--executor", default="process")
    parser.add_argument("--events", action="store_true", help="write events.parquet per point")
    parser.add_argument("--allocator", default="paged")
    parser.add_argument(
        "--scheduler", default=None, help="v1 or classic (default: as kvsim run resolves it)"
    )
    parser.add_argument(
        "--no-prefix-caching", action="store_true", help="v1 without prefix caching"
    )
    args = parser.parse_args()
    spec = make_spec(
        RunConfig(
            trace=args.trace,
            allocator=args.allocator,
            scheduler=args.scheduler,
            enable_prefix_caching=not args.no_prefix_caching,
        ),
        [("block_size", BLOCK_SIZES)],
        events=args.events,
    )
    walls = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            result = run_sweep(spec, Path(tmp) / "sweep", executor=args.executor, jobs=args.jobs)
            walls.append(time.perf_counter() - start)
    t = result.table
    print(
        f"{args.trace}: {len(t)} points, {args.jobs} jobs ({args.executor}), "
        f"events {'on' if args.events else 'off'}, scheduler {args.scheduler or 'default'}"
        f"{', no prefix caching' if args.no_prefix_caching else ''}"
    )
    print(
        f"{'block':>6} {'blocks':>9} {'sim wall s':>11} {'point s':>8} {'req/s':>8} {'status':>7}"
    )
    for _, r in t.iterrows():
        print(
            f"{r['block_size']:>6} {r['num_blocks']:>9,.0f} {r['sim_wall_s']:>11.2f} "
            f"{r['point_wall_s']:>8.2f} {r['throughput_requests_per_s']:>8.3f} {r['status']:>7}"
        )
    total = float(t["point_wall_s"].sum())
    wall = statistics.median(walls)
    print(
        f"sum of point times {total:.1f} s; sweep wall {wall:.1f} s (median of {len(walls)}), "
        f"report and folder included; target < {TARGET_S:.0f} s: {wall / TARGET_S:.2f}x"
    )


if __name__ == "__main__":
    main()
