"""The Python V1Scheduler against the compiled V1Core on one synthetic workload.

Requests (trace-style hash-id prompts sharing a few prefixes, placeholder outputs) arrive
a few per step; each side runs schedule / update until every request has finished, the
Python side with a BlockManager and an EventRecorder (keeping CACHE / EVICT keys, as the
compiled buffer does), the compiled side with its own event buffer. By default each Python
step is also priced and accounted the way the simulator does it (kvsim/sim/executor.py's
``_counts`` with BlockManager.num_used_blocks, kvsim/sim/simulation.py's ``prefill_tokens``),
which V1Core's ``schedule()`` returns; ``--no-counts`` leaves that out. Runs alternate
between the two sides; both must take the same number of steps and record the same number
of events. Reports steps per second, medians of the repeats.

    python benchmarks/bench_compiled_v1.py [--requests 20000] [--repeats 3] [--no-caching]
        [--no-events] [--no-counts] [--block-size 16] [--num-blocks 8000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    Sequence,
)
from engine.compiled import load, unavailable_reason
from engine.v1.prefix_keys import prefix_from_hash_ids
from kvsim.sim.executor import _counts
from kvsim.sim.simulation import prefill_tokens

HASH_BLOCK = 16  # tokens per trace hash id

Request = tuple[list[int], int, int, int]  # hash ids, prompt tokens, output tokens, step due


def make_requests(n: int, per_step: float, seed: int) -> list[Request]:
    """Prompts of 32-2,047 tokens, 60% sharing a prefix of one of 8 bases; outputs of
    8-511 tokens; request i arrives at step i / per_step."""
    rng = random.Random(seed)
    bases = [[rng.randrange(1 << 40) for _ in range(128)] for _ in range(8)]
    out = []
    for i in range(n):
        prompt = int(min(2047, max(32, rng.lognormvariate(6.0, 0.8))))
        shared = rng.randrange(0, prompt // HASH_BLOCK + 1) if rng.random() < 0.6 else 0
        ids = bases[rng.randrange(8)][:shared] + [i * 1000 + j for j in range(128)]
        output = int(min(511, max(8, rng.lognormvariate(4.5, 0.8))))
        out.append((ids[: -(-prompt // HASH_BLOCK)], prompt, output, int(i / per_step)))
    return out


def config(args: argparse.Namespace) -> SchedulerConfig:
    return SchedulerConfig(
        scheduler="v1", max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.budget
    )


def run_python(args: argparse.Namespace, requests: list[Request]) -> tuple[float, int, int]:
    recorder = EventRecorder(keep_block_hashes=True) if args.events else None
    bm = BlockManager(
        args.num_blocks, args.block_size, event_sink=recorder, enable_prefix_caching=args.caching
    )
    sched = Scheduler(config(args), bm)
    params: dict[int, SamplingParams] = {}
    zeros = [0] * (args.max_num_seqs + 1)
    counts = args.counts
    bs = args.block_size
    start = time.perf_counter()
    i = steps = 0
    while i < len(requests) or sched.has_unfinished():
        while i < len(requests) and requests[i][3] <= steps:
            ids, prompt, output, _ = requests[i]
            p = params.get(output)
            if p is None:
                p = params[output] = SamplingParams(max_tokens=output, ignore_eos=True)
            prefix = prefix_from_hash_ids(ids, HASH_BLOCK, prompt, bs)
            sched.add_request(Sequence(i, range(prompt), p, float(steps), prefix=prefix))
            i += 1
        out = sched.schedule()
        if counts:
            _counts(out, bm.num_used_blocks, sched)
            prefill_tokens(out)
        sched.update(out, zeros[: len(out.seqs)])
        steps += 1
    elapsed = time.perf_counter() - start
    return elapsed, steps, len(recorder) if recorder is not None else 0


def run_compiled(
    core: Any, args: argparse.Namespace, requests: list[Request]
) -> tuple[float, int, int]:
    v = core.V1Core.from_config(
        config(args), args.num_blocks, args.block_size, args.caching, record_events=args.events
    )
    add, schedule, update = v.add_hash_id_request, v.schedule, v.update
    start = time.perf_counter()
    i = steps = 0
    while i < len(requests) or v.has_unfinished():
        while i < len(requests) and requests[i][3] <= steps:
            ids, prompt, output, _ = requests[i]
            add(i, prompt, ids, HASH_BLOCK, output, float(steps))
            i += 1
        schedule()
        update()
        steps += 1
    elapsed = time.perf_counter() - start
    return elapsed, steps, v.num_events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--per-step", type=float, default=1.0, help="arrivals per step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=8000)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    parser.add_argument("--no-caching", dest="caching", action="store_false")
    parser.add_argument("--no-events", dest="events", action="store_false")
    parser.add_argument("--no-counts", dest="counts", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    core = load()
    if core is None:
        print(unavailable_reason())
        return 1
    requests = make_requests(args.requests, args.per_step, args.seed)
    py_times: list[float] = []
    c_times: list[float] = []
    steps = events = None
    for _ in range(args.repeats):
        for side in ("python", "compiled"):
            if side == "python":
                elapsed, n, e = run_python(args, requests)
                py_times.append(elapsed)
            else:
                elapsed, n, e = run_compiled(core, args, requests)
                c_times.append(elapsed)
            if steps is None:
                steps, events = n, e
            assert (n, e) == (steps, events), f"{side}: {n} steps, {e} events"
    assert steps is not None
    py, c = statistics.median(py_times), statistics.median(c_times)
    print(
        f"{args.requests} requests, {steps} steps, {events} events; blocks {args.num_blocks} x "
        f"{args.block_size}, caching {args.caching}, events {args.events}, "
        f"counts {args.counts}"
    )
    print(f"python V1Scheduler  {py:8.3f} s  {steps / py:10.0f} steps/s  {py_times}")
    print(f"compiled V1Core     {c:8.3f} s  {steps / c:10.0f} steps/s  {c_times}")
    print(f"speed-up {py / c:.1f}x (medians of {args.repeats}, interleaved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
