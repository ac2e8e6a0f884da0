"""Scheduler + BlockManager speed with no model: the loop that bounds the simulator.

50,000 requests (prompt ~ lognormal mean 1,000, output mean 200, like the Azure 2023
conversation trace), block size 16, 16,000 blocks, max_num_seqs 256, all queued at t=0 and
driven through schedule()/update() with fake tokens. Prints wall seconds, steps/s and decode
token-steps/s (one running sequence advanced by one token), as the median of --repeats runs,
with and without an event recorder attached.

    python benchmarks/bench_scheduler.py [--requests 50000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from engine import BlockManager, EventRecorder, SamplingParams, Scheduler, SchedulerConfig, Sequence


def lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)


def make_requests(n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    prompts = np.clip(lognormal(rng, 1000, 1.0, n), 1, 4096).astype(int)
    outputs = np.clip(lognormal(rng, 200, 1.0, n), 1, 2048).astype(int)
    return list(zip(prompts.tolist(), outputs.tolist()))


def run_once(requests: list[tuple[int, int]], record_events: bool) -> dict[str, float]:
    recorder = EventRecorder() if record_events else None
    bm = BlockManager(num_blocks=16_000, block_size=16, event_sink=recorder)
    sched = Scheduler(SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192), bm)
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
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for record in (False, True):
            results[record].append(run_once(requests, record))
    for record, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"events={'on ' if record else 'off'}  wall {med['wall_s']:.2f} s  "
            f"steps {med['steps']:.0f}  steps/s {med['steps_per_s']:,.0f}  "
            f"decode token-steps/s {med['decode_token_steps_per_s']:,.0f}  "
            f"events {med['events']:,.0f}  (median of {len(runs)})"
        )
    off = statistics.median(r["decode_token_steps_per_s"] for r in results[False])
    on = statistics.median(r["decode_token_steps_per_s"] for r in results[True])
    print(
        f"target >= 1,000,000 decode token-steps/s: {off / 1e6:.2f}x of target (events off), "
        f"recorder overhead {off / on:.2f}x"
    )


if __name__ == "__main__":
    main()
