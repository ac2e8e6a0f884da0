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
        [--python-scheduler] [--python-tier]

The default trace is the first 1,000 requests of the Mooncake conversation trace (the whole
trace takes minutes with offload on); `--trace mooncake_fast25_conversation` is the issue's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import engine.offload.connector as connector_module
import kvsim.runner.execute as execute_module
from engine.offload.cpu_manager import make_cpu_tier
from kvsim.config import RunConfig
from kvsim.runner import run
from kvsim.sim.compiled_offload import compiled_offload_applies


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
    walls: dict[str, list[float]] = {name: [] for name in configs}
    # CPU seconds of the process (all threads): on a machine shared with other jobs the wall
    # time also counts the time others had the cores
    cpus: dict[str, list[float]] = {name: [] for name in configs}
    hit: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, (config, core, compiled) in configs.items():  # in turns: the speed drifts
            setattr(connector_module, "make_cpu_tier", _tier_maker(compiled))  # noqa: B010
            applies = compiled_offload_applies if core else lambda *_args: False
            setattr(execute_module, "compiled_offload_applies", applies)  # noqa: B010
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


if __name__ == "__main__":
    main()
