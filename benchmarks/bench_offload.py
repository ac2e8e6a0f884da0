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
        [--python-scheduler] [--python-tier] [--processes [--baseline DIR]]

`--processes` adds the other reading of the bar: whole `kvsim run --no-plots` processes, as a
user starts them (Python's start, the trace, events.parquet and the other files included),
GPU-only and with the tier, in turns, wall and CPU (children's user + system) medians.
`--baseline DIR` times the processes of another checkout (its compiled core built) in the
same turns: an A/B comparison on a machine whose speed drifts; it also times the simulation
alone of both checkouts in turns, each run in a fresh process of its own (`run(config,
keep_events=False)`, timed inside it), before the processes.

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
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also time this other checkout's simulations (and --processes), in the same turns",
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
    if args.baseline is not None:
        bench_simulations(args.trace, args.size, args.repeats, args.baseline)
    if args.processes:
        bench_processes(args.trace, args.size, args.repeats, args.baseline)


# One simulation, timed inside a fresh process: prints its wall and CPU seconds.
SIMULATION = """
import sys, time
from kvsim.config import RunConfig
from kvsim.runner import run
config = RunConfig(trace=sys.argv[1], model="llama-3.1-8b", gpu="h100-sxm", num_blocks=30_000,
                   max_model_len=200_000, allow_long_max_model_len=True,
                   kv_offloading_size=float(sys.argv[2]))
start, cpu = time.perf_counter(), time.process_time()
run(config, keep_events=False)
print(time.perf_counter() - start, time.process_time() - cpu)
"""


def bench_simulations(trace: str, size: float, repeats: int, baseline: str) -> None:
    """The simulation alone, GPU-only and with a ``size`` GiB CPU tier, of this checkout and
    of ``baseline``, in turns, each in a fresh process: wall and CPU medians, ratios."""
    root = os.path.abspath(baseline)
    checkouts = {"baseline: ": {**os.environ, "PYTHONPATH": root}, "": None}
    sizes = {"gpu only": 0.0, f"cpu tier {size:g} GiB": size}
    walls: dict[str, list[float]] = {c + n: [] for c in checkouts for n in sizes}
    cpus: dict[str, list[float]] = {name: [] for name in walls}
    for _ in range(repeats):
        for label, env in checkouts.items():
            for name, gib in sizes.items():
                out = subprocess.run(
                    [sys.executable, "-c", SIMULATION, trace, f"{gib:g}"], check=True,
                    capture_output=True, text=True, env=env, cwd=root if env else None,
                ).stdout.split()  # fmt: skip
                walls[label + name].append(float(out[0]))
                cpus[label + name].append(float(out[1]))
    print(f"simulation alone, a fresh process each, medians of {repeats}")
    _print_medians(walls, cpus, checkouts, sizes)


def _print_medians(
    walls: dict[str, list[float]], cpus: dict[str, list[float]], checkouts: Any, runs: Any
) -> None:
    """Each checkout's GPU-only and tier medians (wall, CPU) and their ratios."""
    wall = {name: statistics.median(v) for name, v in walls.items()}
    cpu = {name: statistics.median(v) for name, v in cpus.items()}
    for label in checkouts:
        for name in runs:
            key = label + name
            runs_text = ", ".join(f"{v:.2f}" for v in walls[key])
            print(f"  {key:30s} {wall[key]:6.2f} s  (runs: {runs_text}; CPU {cpu[key]:.2f} s)")
        gpu, tier = (label + name for name in runs)
        print(
            f"  {label}offload / GPU only: {wall[tier] / wall[gpu]:.2f}x, CPU"
            f" {cpu[tier] / cpu[gpu]:.2f}x (bar, issue 29: <= 1.5x)"
        )


def bench_processes(trace: str, size: float, repeats: int, baseline: str | None = None) -> None:
    """Whole `kvsim run --no-plots` processes, GPU-only and with a ``size`` GiB CPU tier, in
    turns: wall and CPU (user + system of the child) medians and their ratios; with
    ``baseline`` (a checkout's directory), its processes too, in the same turns, run from
    there."""
    command = [sys.executable, "-c", "from kvsim.cli import main; main()", "run", trace,
               "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--num-blocks", "30000",
               "--max-model-len", "200000", "--allow-long-max-model-len", "--no-plots"]  # fmt: skip
    runs = {"gpu only": [], f"cpu tier {size:g} GiB": ["--kv-offloading-size", f"{size:g}"]}
    # checkout label -> (working directory, PYTHONPATH): None for this process's own
    checkouts: dict[str, tuple[str, str] | None] = {"": None}
    if baseline is not None:
        root = os.path.abspath(baseline)
        checkouts = {"baseline: ": (root, root), **checkouts}
    walls: dict[str, list[float]] = {c + n: [] for c in checkouts for n in runs}
    cpus: dict[str, list[float]] = {name: [] for name in walls}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for label, place in checkouts.items():
                cwd, env = None, None
                if place is not None:
                    cwd, env = place[0], {**os.environ, "PYTHONPATH": place[1]}
                for name, extra in runs.items():
                    key = label + name
                    out = os.path.join(tmp, f"{len(walls[key])}-{i}-{len(extra)}-{len(label)}")
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    start = time.perf_counter()
                    subprocess.run([*command, *extra, "--out", out], check=True, cwd=cwd,
                                   env=env, stdout=subprocess.DEVNULL)  # fmt: skip
                    walls[key].append(time.perf_counter() - start)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpus[key].append(
                        after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                    )
    print(f"whole `kvsim run --no-plots` processes, medians of {repeats}")
    _print_medians(walls, cpus, checkouts, runs)


if __name__ == "__main__":
    main()
