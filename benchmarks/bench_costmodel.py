"""The cost model's sanity tables (docs/costmodel.md) and the speed of its hot paths.

1. Step times in ms of the shipped presets: decode of N sequences with 1000-token contexts and
   single-sequence prefills, per (model, GPU, tp); the breakdown of one decode step; the same
   decode at other block sizes.
2. ns per call, medians of interleaved rounds: the decode closure the simulator calls per plain
   decode step, ``step_time_of`` on a decode, a prefill and a mixed v1 step, and the executor's
   ``step_time`` on a mixed step of 64 sequences, as the plain and as the fast v1 scheduler
   give it (63 lazy decoders counted from the scheduler's counters).

    python benchmarks/bench_costmodel.py [--rounds 15] [--calls 1000] [--tables-only]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from engine import SamplingParams, SchedulerOutput, Sequence, StepKind
from engine.fast.fast_v1 import FastV1Output
from kvsim.costmodel import BatchShape, CostModel, resolve_gpu, resolve_model
from kvsim.sim.executor import CostModelExecutor

TABLE = (
    ("llama-2-7b", "a100-80gb", 1),
    ("llama-3-8b", "h100-sxm", 1),
    ("llama-2-70b", "a100-80gb", 2),
    ("llama-2-70b", "h100-sxm", 4),
    ("opt-13b", "a100-40gb", 1),
)


def decode(n: int, context: int = 1000, block_size: int = 16) -> BatchShape:
    return BatchShape.decode(n, n * context, n * math.ceil(context / block_size))


def prefill(tokens: int, block_size: int = 16) -> BatchShape:
    return BatchShape.of(prefill_chunks=[(tokens, 0)], num_blocks_walked=-(-tokens // block_size))


def tables() -> None:
    print("| model | gpu | tp | decode 1 x 1000 | decode 64 x 1000 | decode 256 x 1000 | "
          "prefill 512 | prefill 2000 |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for model, gpu, tp in TABLE:
        cost = CostModel(resolve_model(model), resolve_gpu(gpu), tp=tp)
        shapes = (decode(1), decode(64), decode(256), prefill(512), prefill(2000))
        cells = " | ".join(f"{cost.step_time(s) * 1e3:.1f}" for s in shapes)
        print(f"| {model} | {gpu} | {tp} | {cells} |")
    cost = CostModel(resolve_model("llama-2-7b"), resolve_gpu("a100-80gb"))
    shape = decode(64)
    print(f"\nllama-2-7b / a100-80gb, decode 64 x 1000: {cost.step_time(shape) * 1e3:.1f} ms")
    for term, seconds in sorted(cost.breakdown(shape).items(), key=lambda kv: -kv[1]):
        print(f"| {term} | {seconds * 1e3:.1f} |")
    cells = " | ".join(
        f"{cost.step_time(decode(64, block_size=bs)) * 1e3:.1f}" for bs in (1, 8, 16, 32, 128)
    )
    print(f"\nblock size 1 / 8 / 16 / 32 / 128: | {cells} |")
    mixed = BatchShape.of(
        prefill_chunks=[(512, 4096)], decode_contexts=(1000,) * 63, num_blocks_walked=4300
    )
    print(f"mixed v1 step (63 decodes x 1000 + a 512-token chunk after 4,096 cached): "
          f"{cost.step_time(mixed) * 1e3:.1f} ms")  # fmt: skip


def _ns_per_call(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def _mixed_output(n: int) -> SchedulerOutput:
    seqs, new = [], []
    for i in range(n):
        s = Sequence(i, range(900), SamplingParams(max_tokens=200, ignore_eos=True))
        s.cached_token_count = 1000 if i else 256
        s.generated_token_ids.extend([0] * (101 if i else 0))
        s.block_table = list(range(64))
        seqs.append(s)
        new.append(1 if i else 512)
    return SchedulerOutput(step=0, kind=StepKind.PREFILL, seqs=seqs, num_new_tokens=new,
                           block_size=16, preempted=[], rejected=[])  # fmt: skip


class _UsedBlocks:
    num_used_blocks = 4_096


class _V1:
    """What the executor reads of a v1 scheduler."""

    is_v1 = True
    num_running = 64
    num_cached_tokens = 256 + 63 * 1000  # every running sequence's cached_token_count
    block_manager = _UsedBlocks()


def _fast_v1_output(out: SchedulerOutput) -> FastV1Output:
    """``out`` as FastV1Scheduler gives it: only the prefilling sequence is listed exact."""
    fast = FastV1Output(step=0, kind=out.kind, seqs=out.seqs, num_new_tokens=out.num_new_tokens,
                        block_size=16, preempted=[], rejected=[])  # fmt: skip
    fast.exact_seqs = [(out.seqs[0], out.num_new_tokens[0])]
    return fast


def speed(rounds: int, calls: int) -> None:
    cost = CostModel(resolve_model("llama-2-70b"), resolve_gpu("a100-80gb"), tp=2)
    closure = cost.decode_step_time_fn()
    of = cost.step_time_of
    executor = CostModelExecutor(cost)
    out, v1 = _mixed_output(64), _V1()
    fast = _fast_v1_output(out)
    assert executor.step_time(fast, v1) == executor.step_time(out, v1)  # type: ignore[arg-type]
    cases: dict[str, Callable[[], Any]] = {
        "decode closure (per plain decode step)": lambda: closure(64, 64_000, 4_032),
        "step_time_of, decode": lambda: of(64, 64, 64, 64_000, 0, 0, 0, 4_032),
        "step_time_of, prefill 2000": lambda: of(1, 2000, 0, 0, 2_001_000, 0, 0, 125),
        "step_time_of, mixed": lambda: of(64, 575, 63, 63_000, 131_328, 131_072, 256, 4_096),
        "executor.step_time, mixed 64 seqs": lambda: executor.step_time(out, v1),  # type: ignore[arg-type]
        "executor.step_time, FastV1 mixed 64 seqs": lambda: executor.step_time(fast, v1),  # type: ignore[arg-type]
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):  # interleaved: drift hits every case alike
        for name, fn in cases.items():
            samples[name].append(_ns_per_call(fn, calls))
    for name, values in samples.items():
        print(f"{name:42s} {statistics.median(values):8.0f} ns/call "
              f"(median of {rounds} rounds of {calls})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--tables-only", action="store_true")
    args = parser.parse_args()
    tables()
    if not args.tables_only:
        print()
        speed(args.rounds, args.calls)


if __name__ == "__main__":
    main()
