"""KV offload speed (issue 29's bar: a run with a CPU tier costs at most 1.5x the GPU-only
run's wall time on the Mooncake conversation trace), medians of --repeats, side by side in one
process: the GPU-only run and the same run with `--kv-offloading-size`, both on the compiled
core when it is built (the offload run: OffloadV1Core, kvsim/sim/compiled_offload.py), in
turns so that the machine's drifting speed hits all alike. `--python-scheduler` adds the
offload run on the readable offloading scheduler and connector over the compiled CPU tier and
link (what offload runs used before the core had them), `--python-tier` the same on the
readable CPU tier too. `kvsim run --no-plots`'s work without the CLI; llama-3.1-8b on h100-sxm
with a 30,000-block pool (the issue's setting).

    python benchmarks/bench_offload.py [--repeats 3] [--trace NAME] [--size GIB]
        [--python-scheduler] [--python-tier] [--processes]

`--processes` adds the other reading of the bar: whole `kvsim run --no-plots` processes, as a
user starts them (Python's start, the trace, events.parquet and the other files included),
GPU-only and with the tier, in turns, wall and CPU (children's user + system) medians.

The default trace is the first 1,000 requests of the Mooncake conversation trace (the whole
trace takes minutes with offload on); `--trace mooncake_fast25_conversation` is the issue's.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import engine.offload.connector as connector_module
import kvsim.sim.compiled_offload as compiled_offload_module
from engine.offload.cpu_manager import make_cpu_tier
from kvsim.config import RunConfig
from kvsim.runner import run


def _tier_maker(compiled: bool | None) -> Callable[..., Any]:
    """make_cpu_tier with its implementation forced to ``compiled`` (the connector passes its
    own ``compiled_tier``, None, which would override a functools.partial's keyword)."""

    def make(*args: Any, **kwargs: Any) -> Any:
        return make_cpu_tier(*args, **{**kwargs, "compiled": compiled})

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace", default="mooncake_fast25_conversation_first_1000")
    parser.add_argument("--size", type=float, default=64.0, help="CPU tier (GiB)")
    parser.add_argument(
        "--python-scheduler",
        action="store_true",
        help="also run offload on the readable scheduler (compiled tier and link)",
    )
    parser.add_argument(
        "--python-tier",
        action="store_true",
        help="also run offload on the readable scheduler and CPU tier",
    )
    parser.add_argument(
        "--processes",
        action="store_true",
        help="also time whole `kvsim run --no-plots` processes, GPU-only and with the tier",
    )
    args = parser.parse_args()
    base = RunConfig(
        trace=args.trace,
        model="llama-3.1-8b",
        gpu="h100-sxm",
        num_blocks=30_000,
        max_model_len=200_000,
        allow_long_max_model_len=True,
    )
    tier = base.replace(kv_offloading_size=args.size)
    # name -> (config, whether the compiled core may run it, the CPU tier's implementation
    # under the readable scheduler: None = compiled when built)
    configs: dict[str, tuple[RunConfig, bool, bool | None]] = {
        "gpu only": (base, True, None),
        f"cpu tier {args.size:g} GiB": (tier, True, None),
    }
    if args.python_scheduler:
        configs["  Python scheduler"] = (tier, False, None)
    if args.python_tier:
        configs["  + Python tier"] = (tier, False, False)
    original_applies = compiled_offload_module.compiled_offload_applies
    walls: dict[str, list[float]] = {name: [] for name in configs}
    # CPU seconds of the process (all threads): on a machine shared with other jobs the wall
    # time also counts the time others had the cores
    cpus: dict[str, list[float]] = {name: [] for name in configs}
    hit: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, (config, core, compiled) in configs.items():  # in turns: the speed drifts
            setattr(connector_module, "make_cpu_tier", _tier_maker(compiled))  # noqa: B010
            # kvsim.runner.replay imports compiled_offload_applies at the call: set it there
            applies = original_applies if core else lambda *_args: False
            setattr(compiled_offload_module, "compiled_offload_applies", applies)  # noqa: B010
            start, cpu = time.perf_counter(), time.process_time()
            result = run(config, keep_events=False)
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(time.process_time() - cpu)
            offload = result.summary.get("offload")
            hit[name] = (
                offload["hit_rate_all_tiers"]
                if offload
                else result.summary["prefix_cache_hit_rate"] or 0.0
            )
    print(f"{args.trace}, llama-3.1-8b on h100-sxm, 30,000 blocks, medians of {args.repeats}")
    medians = {name: statistics.median(values) for name, values in walls.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpus.items()}
    for name, values in walls.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(
            f"  {name:20s} {medians[name]:7.1f} s  (runs: {runs}; CPU {cpu_medians[name]:.1f} s)"
            f"  hit rate {hit[name]:.4f}"
        )
    first, second, *rest = medians.values()
    cpu_first, cpu_second = list(cpu_medians.values())[:2]
    print(
        f"  offload / GPU only: {second / first:.1f}x, CPU {cpu_second / cpu_first:.1f}x"
        " (bar, issue 29: <= 1.5x)"
    )
    for name, other in zip(list(medians)[2:], rest):
        print(f"  {name.strip()} / compiled core: {other / second:.1f}x")
    if args.processes:
        bench_processes(args.trace, args.size, args.repeats)


def bench_processes(trace: str, size: float, repeats: int) -> None:
    """Whole `kvsim run --no-plots` processes, GPU-only and with a ``size`` GiB CPU tier, in
    turns: wall and CPU (user + system of the child) medians and their ratios."""
    command = [sys.executable, "-c", "from kvsim.cli import main; main()", "run", trace,
               "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--num-blocks", "30000",
               "--max-model-len", "200000", "--allow-long-max-model-len", "--no-plots"]  # fmt: skip
    runs = {"gpu only": [], f"cpu tier {size:g} GiB": ["--kv-offloading-size", f"{size:g}"]}
    walls: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for name, extra in runs.items():
                out = os.path.join(tmp, f"{len(walls[name])}-{i}-{len(extra)}")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                subprocess.run([*command, *extra, "--out", out], check=True,
                               stdout=subprocess.DEVNULL)  # fmt: skip
                walls[name].append(time.perf_counter() - start)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus[name].append(
                    after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                )
    print(f"whole `kvsim run --no-plots` processes, medians of {repeats}")
    wall = {name: statistics.median(v) for name, v in walls.items()}
    cpu = {name: statistics.median(v) for name, v in cpus.items()}
    for name in runs:
        runs_text = ", ".join(f"{v:.2f}" for v in walls[name])
        print(f"  {name:20s} {wall[name]:6.2f} s  (runs: {runs_text}; CPU {cpu[name]:.2f} s)")
    (gpu_wall, tier_wall), (gpu_cpu, tier_cpu) = wall.values(), cpu.values()
    print(
        f"  offload / GPU only: {tier_wall / gpu_wall:.2f}x, CPU {tier_cpu / gpu_cpu:.2f}x"
        " (bar, issue 29: <= 1.5x)"
    )


if __name__ == "__main__":
    main()
