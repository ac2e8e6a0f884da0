"""The Python BlockManager (v1) against the compiled block pool on one operation stream.

A v1-style loop (admissions with prefix lookups, then a token for each running request:
decodes and prefill chunks, preemption when blocks run out, finishes) is run once on the
Python BlockManager and its pool calls recorded; the stream is then replayed on each side,
in interleaved repeats, and the medians compared. Both sides record their events (the
Python one into an EventRecorder keeping block hashes). Prompts come from a few shared
trace-style hash-id prefixes.

    python benchmarks/bench_compiled_pool.py [--requests 2000] [--repeats 5] [--no-caching]
        [--no-events] [--block-size 16] [--num-blocks 4000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from engine import BlockManager, EventRecorder, SamplingParams, Sequence
from engine.compiled import load, unavailable_reason
from engine.v1.prefix_keys import prefix_from_hash_ids

# op codes of the recorded stream
ADD, FIND, ALLOC, CACHE, FREE, APPEND = range(6)
NO_LIMIT: dict[str, Any] = {"watermark_blocks": 0, "max_model_len": None}


def make_requests(n: int, seed: int) -> list[tuple[list[int], int, int]]:
    """(hash ids, prompt tokens, output tokens) per request; hash blocks of 16 tokens."""
    rng = random.Random(seed)
    bases = [[rng.randrange(1 << 40) for _ in range(64)] for _ in range(8)]
    out = []
    for i in range(n):
        prompt = rng.randrange(32, 1024)
        shared = rng.randrange(0, prompt // 16 + 1) if rng.random() < 0.6 else 0
        ids = bases[rng.randrange(8)][:shared] + [i * 1000 + j for j in range(64)]
        out.append((ids[: -(-prompt // 16)], prompt, rng.randrange(8, 256)))
    return out


def record_stream(args: argparse.Namespace) -> list[tuple[Any, ...]]:
    """Run the loop on the Python pool, recording every pool call with its arguments."""
    bs = args.block_size
    bm = BlockManager(args.num_blocks, bs, enable_prefix_caching=args.caching)
    bm.use_v1_free_queue()
    ops: list[tuple[Any, ...]] = []
    waiting: list[Sequence] = []
    running: list[Sequence] = []
    pending = make_requests(args.requests, args.seed)
    pending.reverse()
    seq_id = 0
    while pending or waiting or running:
        for _ in range(min(4, len(pending))):  # arrivals
            ids, prompt, output = pending.pop()
            params = SamplingParams(max_tokens=output, ignore_eos=True)
            prefix = prefix_from_hash_ids(ids, 16, prompt, bs)
            waiting.append(Sequence(seq_id, range(prompt), params, prefix=prefix))
            ops.append((ADD, seq_id, ids, prompt))
            seq_id += 1
        for seq in list(running):  # the running pass: decodes and the rest of prompts
            if seq not in running:
                continue  # preempted earlier in this pass
            cached, idx = seq.cached_token_count, seq.seq_id
            n = min(seq.num_tokens - cached, 512)
            if cached + n <= len(seq.block_table) * bs:
                if args.caching and (cached + n) // bs > seq._num_cached_blocks:  # as V1Scheduler
                    bm.cache_blocks(seq, cached + n)
                    ops.append((CACHE, idx, cached + n))
            else:
                while not bm.allocate_slots(seq, n, [], full_sequence_tokens=0, **NO_LIMIT):
                    ops.append((ALLOC, idx, cached, n, [], 0))
                    victim = running.pop()
                    bm.free_sequence_v1(victim, preempted=True)
                    ops.append((FREE, victim.seq_id, True))
                    victim.cached_token_count = 0
                    waiting.insert(0, victim)
                    if victim is seq:
                        break
                if seq not in running:
                    continue
                ops.append((ALLOC, idx, cached, n, [], 0))
            seq.cached_token_count = cached = cached + n
            if cached == seq.num_tokens:
                seq.generated_token_ids.append(7)
                ops.append((APPEND, idx))
                if cached >= seq._finish_cached_count:
                    running.remove(seq)
                    bm.free_sequence_v1(seq)
                    ops.append((FREE, idx, False))
        while waiting and len(running) < 256:  # admissions
            seq = waiting[0]
            hits = bm.find_cached_prefix(seq)
            ops.append((FIND, seq.seq_id))
            n = seq.num_tokens - len(hits) * bs
            ok = bm.allocate_slots(seq, n, hits, full_sequence_tokens=seq.num_tokens, **NO_LIMIT)
            ops.append((ALLOC, seq.seq_id, 0, n, hits, seq.num_tokens))
            if not ok:
                break
            waiting.pop(0)
            running.append(seq)
            seq.cached_token_count = len(hits) * bs + n
            if seq.cached_token_count == seq.num_tokens:
                seq.generated_token_ids.append(7)
                ops.append((APPEND, seq.seq_id))
    return ops


def replay_python(args: argparse.Namespace, ops: list[tuple[Any, ...]]) -> tuple[float, int]:
    recorder = EventRecorder(keep_block_hashes=True) if args.events else None
    bm = BlockManager(
        args.num_blocks, args.block_size, event_sink=recorder, enable_prefix_caching=args.caching
    )
    bm.use_v1_free_queue()
    seqs: dict[int, Sequence] = {}
    bs = args.block_size
    start = time.perf_counter()
    for op in ops:
        code = op[0]
        if code == ALLOC:
            seq = seqs[op[1]]
            seq.cached_token_count = op[2]
            bm.allocate_slots(seq, op[3], op[4], full_sequence_tokens=op[5], **NO_LIMIT)
        elif code == CACHE:
            bm.cache_blocks(seqs[op[1]], op[2])
        elif code == FIND:
            bm.find_cached_prefix(seqs[op[1]])
        elif code == FREE:
            bm.free_sequence_v1(seqs[op[1]], preempted=op[2])
        elif code == APPEND:
            seqs[op[1]].generated_token_ids.append(7)
        else:
            prefix = prefix_from_hash_ids(op[2], 16, op[3], bs)
            params = SamplingParams(max_tokens=1 << 20, ignore_eos=True)
            seqs[op[1]] = Sequence(op[1], range(op[3]), params, prefix=prefix)
    elapsed = time.perf_counter() - start
    return elapsed, len(recorder) if recorder is not None else bm.get_num_free_blocks()


def replay_compiled(
    core: Any, args: argparse.Namespace, ops: list[tuple[Any, ...]]
) -> tuple[float, int]:
    pool = core.BlockPool(
        args.num_blocks, args.block_size, args.caching, record_events=args.events,
        event_capacity=1 << 16,
    )  # fmt: skip
    handles: dict[int, int] = {}
    start = time.perf_counter()
    for op in ops:
        code = op[0]
        if code == ALLOC:
            pool.allocate_slots(
                handles[op[1]], op[2], op[3], op[4], full_sequence_tokens=op[5], **NO_LIMIT
            )
        elif code == CACHE:
            pool.cache_blocks(handles[op[1]], op[2])
        elif code == FIND:
            pool.find_cached_prefix(handles[op[1]])
        elif code == FREE:
            pool.free(handles[op[1]], op[2])
        elif code == APPEND:
            pool.append_tokens(handles[op[1]], (7,))
        else:
            handles[op[1]] = pool.add_hash_id_request(op[1], op[3], op[2], 16)
    elapsed = time.perf_counter() - start
    return elapsed, pool.num_events if args.events else pool.get_num_free_blocks()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-caching", dest="caching", action="store_false")
    parser.add_argument("--no-events", dest="events", action="store_false")
    args = parser.parse_args()
    core = load()
    if core is None:
        print(unavailable_reason())
        return 1
    ops = record_stream(args)
    counts = {name: sum(1 for op in ops if op[0] == code) for code, name in enumerate(
        ("add", "find", "alloc", "cache", "free", "append"))}  # fmt: skip
    print(f"{len(ops):,} operations: {counts}")
    py_times, c_times = [], []
    for _ in range(args.repeats):  # interleaved, so drift hits both sides alike
        py, py_check = replay_python(args, ops)
        c, c_check = replay_compiled(core, args, ops)
        assert py_check == c_check, (py_check, c_check)  # same events (or free blocks)
        py_times.append(py)
        c_times.append(c)
    py_med, c_med = statistics.median(py_times), statistics.median(c_times)
    print(f"python   {py_med:8.3f} s  {len(ops) / py_med:12,.0f} ops/s")
    print(f"compiled {c_med:8.3f} s  {len(ops) / c_med:12,.0f} ops/s  ({py_med / c_med:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
