"""Scheduler + BlockManager speed with no model: the loop that bounds the simulator.

50,000 requests (prompt ~ lognormal mean 1,000, output mean 200, like the Azure 2023
conversation trace), block size 16, 16,000 blocks, max_num_seqs 256, all queued at t=0 and
driven through schedule()/update() with fake tokens. Prints wall seconds, steps/s and decode
token-steps/s (one running sequence advanced by one token), as the median of --repeats runs:
the plain Scheduler with and without an event recorder, and the FastDecodeScheduler the
simulator's cost mode uses (identical results, O(allocations + finishes) per decode step).

    python benchmarks/bench_scheduler.py [--requests 50000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from engine import BlockManager, EventRecorder, SamplingParams, Scheduler, SchedulerConfig, Sequence
from engine.fast_decode import FastDecodeScheduler


def lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)


def make_requests(n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    prompts = np.clip(lognormal(rng, 1000, 1.0, n), 1, 4096).astype(int)
    outputs = np.clip(lognormal(rng, 200, 1.0, n), 1, 2048).astype(int)
    return list(zip(prompts.tolist(), outputs.tolist()))


def run_once(
    requests: list[tuple[int, int]], record_events: bool, scheduler_class: type[Scheduler]
) -> dict[str, float]:
    recorder = EventRecorder() if record_events else None
    bm = BlockManager(num_blocks=16_000, block_size=16, event_sink=recorder)
    config = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192)
    sched = scheduler_class(config, bm)
    for i, (prompt, output) in enumerate(requests):
        params = SamplingParams(max_tokens=output, ignore_eos=True)
        sched.add_request(Sequence(i, range(prompt), params))
    steps = decode_token_steps = 0
    fake_tokens = [1] * 256
    start = time.perf_counter()
    while sched.has_unfinished():
        out = sched.schedule()
        n = len(out.seqs)
        sched.update(out, fake_tokens[:n] if n <= 256 else [1] * n)
        steps += 1
        if out.kind == 1:  # decode
            decode_token_steps += n
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "steps": steps,
        "steps_per_s": steps / wall,
        "decode_token_steps_per_s": decode_token_steps / wall,
        "events": len(recorder) if recorder else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    requests = make_requests(args.requests, args.seed)
    variants = {
        "Scheduler, events off": (False, Scheduler),
        "Scheduler, events on": (True, Scheduler),
        "FastDecodeScheduler, events on": (True, FastDecodeScheduler),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (record, scheduler_class) in variants.items():
            results[name].append(run_once(requests, record, scheduler_class))
    medians = {}
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        medians[name] = med
        print(
            f"{name:32s} wall {med['wall_s']:6.2f} s  steps {med['steps']:,.0f}  "
            f"steps/s {med['steps_per_s']:8,.0f}  "
            f"decode token-steps/s {med['decode_token_steps_per_s']:11,.0f}  "
            f"events {med['events']:,.0f}  (median of {len(runs)})"
        )
    plain = medians["Scheduler, events off"]["decode_token_steps_per_s"]
    on = medians["Scheduler, events on"]["decode_token_steps_per_s"]
    fast = medians["FastDecodeScheduler, events on"]["decode_token_steps_per_s"]
    print(
        f"target >= 1,000,000 decode token-steps/s: plain Scheduler {plain / 1e6:.2f}x of target "
        f"(events off), {on / 1e6:.2f}x (events on); FastDecodeScheduler {fast / on:.1f}x the "
        "plain one with events on"
    )


if __name__ == "__main__":
    main()
