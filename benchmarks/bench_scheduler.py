"""Scheduler + BlockManager speed with no model: the loop that bounds the simulator.

Three sections, every variant timed in turns in one run (medians of --repeats):

1. synthetic: 50,000 requests (prompt ~ lognormal mean 1,000, output mean 200, like the
   Azure 2023 conversation trace), block size 16, 16,000 blocks, max_num_seqs 256, all
   queued at t=0, driven through schedule()/update() with placeholder tokens: the classic
   Scheduler (events off and on) and FastDecodeScheduler, then v1 (plain and fast, prefix
   caching off and on; prompts share nothing, so caching costs its bookkeeping only).
2. mooncake: the Mooncake FAST'25 conversation trace (--mooncake PATH; default: the
   repository's first 1,000 requests) with prefix caching from its 512-token hash ids,
   through kvsim's v1 loop with the reference's logical clock (a step lasts 5 ms + 10 us
   per scheduled token; arrivals join before the first step starting at or after them) and
   the same pool (--mooncake-blocks blocks of 16 tokens, 1,024 seqs, 8,192 tokens), and,
   when ~/vllm-ref exists, through vLLM 0.33.0's own scheduler loop (its driver's loop_s).
   kvsim's step count and final clock must equal the reference's.
3. azure: the Azure 2023 conversation trace (shipped) with the same logical clock, classic
   against v1 (fast path and multi-step decoding, as the simulator's cost mode drives them).

    python benchmarks/bench_scheduler.py [--requests 50000] [--repeats 3]
        [--sections synthetic,mooncake,azure] [--mooncake PATH] [--no-reference]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    Sequence,
    StepKind,
    make_scheduler,
)
from engine.v1.prefix_keys import UNIQUE_PREFIX, PrefixSource, prefix_from_hash_ids

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "workloads" / "traces"
DRIVER = REPO / "benchmarks" / "vllm_reference" / "drive_vllm.py"
REFERENCE_PYTHON = Path.home() / "vllm-ref" / "bin" / "python"
STEP_BASE_S, STEP_PER_TOKEN_S = 0.005, 1e-5  # the reference driver's default clock


def lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)


def make_requests(n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    prompts = np.clip(lognormal(rng, 1000, 1.0, n), 1, 4096).astype(int)
    outputs = np.clip(lognormal(rng, 200, 1.0, n), 1, 2048).astype(int)
    return list(zip(prompts.tolist(), outputs.tolist()))


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


# --- 1. synthetic ----------------------------------------------------------------------


def run_synthetic(
    requests: list[tuple[int, int]], record_events: bool, fast: bool, v1: bool,
    caching: bool, cache_events: bool = True,
) -> dict[str, float]:  # fmt: skip
    recorder = EventRecorder(prefix_cache_events=cache_events) if record_events else None
    bm = BlockManager(16_000, 16, event_sink=recorder, enable_prefix_caching=caching)
    config = SchedulerConfig(
        max_num_seqs=256, max_num_batched_tokens=8192, scheduler="v1" if v1 else "classic"
    )
    sched = make_scheduler(config, bm, fast=fast)
    for i, (prompt, output) in enumerate(requests):
        params = SamplingParams(max_tokens=output, ignore_eos=True)
        sched.add_request(Sequence(i, range(prompt), params, prefix=UNIQUE_PREFIX))
    steps = decode_token_steps = 0
    fake_tokens = [0] * 256
    start = time.perf_counter()
    while sched.has_unfinished():
        out = sched.schedule()
        n = len(out.seqs)
        sched.update(out, fake_tokens[:n] if n <= 256 else [0] * n)
        steps += 1
        if out.kind is StepKind.DECODE:
            decode_token_steps += n
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "steps": steps,
        "steps_per_s": steps / wall,
        "decode_token_steps_per_s": decode_token_steps / wall,
        "events": len(recorder) if recorder else 0,
    }


def section_synthetic(args: argparse.Namespace) -> None:
    print(f"== synthetic: {args.requests:,} requests queued at t=0 ==")
    requests = make_requests(args.requests, args.seed)
    variants: dict[str, tuple[bool, bool, bool, bool, bool]] = {
        "classic Scheduler, events off": (False, False, False, False, True),
        "classic Scheduler, events on": (True, False, False, False, True),
        "classic FastDecode, events on": (True, True, False, False, True),
        "v1 Scheduler, events on": (True, False, True, False, True),
        "v1 Scheduler + caching, events on": (True, False, True, True, True),
        "v1 Fast, events on": (True, True, True, False, True),
        "v1 Fast + caching, events on": (True, True, True, True, True),
        "v1 Fast + caching, no cache events": (True, True, True, True, False),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, variant in variants.items():
            results[name].append(run_synthetic(requests, *variant))
    medians = {name: median_of(runs) for name, runs in results.items()}
    for name, med in medians.items():
        print(
            f"{name:36s} wall {med['wall_s']:6.2f} s  steps {med['steps']:9,.0f}  "
            f"steps/s {med['steps_per_s']:8,.0f}  "
            f"decode token-steps/s {med['decode_token_steps_per_s']:11,.0f}  "
            f"events {med['events']:11,.0f}  (median of {args.repeats})"
        )
    plain = medians["classic Scheduler, events off"]["decode_token_steps_per_s"]
    on = medians["classic Scheduler, events on"]["decode_token_steps_per_s"]
    fast = medians["classic FastDecode, events on"]["wall_s"]
    print(
        f"target >= 1,000,000 decode token-steps/s: classic Scheduler {plain / 1e6:.2f}x of "
        f"target (events off), {on / 1e6:.2f}x (events on)"
    )
    for name in list(medians)[3:]:
        print(f"{name}: {medians[name]['wall_s'] / fast:.2f}x the wall of classic FastDecode")


# --- the reference's logical clock -------------------------------------------------------


def clock_loop(
    sched: Scheduler, rows: list[tuple[float, int, int, PrefixSource]], multi_step: bool
) -> dict[str, float]:
    """Drive ``sched`` as the reference driver drives vLLM: a step lasts STEP_BASE_S +
    STEP_PER_TOKEN_S x scheduled tokens; a request is added before the first step that
    starts at or after its arrival; when nothing can run, time jumps to the next arrival.
    ``multi_step`` runs plain decode stretches through run_plain_decodes, as the
    simulator's cost mode does. Rows: (arrival_s, prompt tokens, output tokens, prefix)."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i))
    now = 0.0
    k = 0
    steps = 0
    zeros = [0] * 4096
    arrival_next = rows[order[0]][0] if order else float("inf")
    plain = multi_step and hasattr(sched, "run_plain_decodes")

    def on_step(num_seqs: int, context_tokens: int, num_used_blocks: int) -> bool:
        nonlocal now, steps
        now += STEP_BASE_S + STEP_PER_TOKEN_S * num_seqs
        steps += 1
        return arrival_next > now  # else leave it pending: arrivals join before the next

    def ignore(finished: list[Sequence]) -> None:
        pass

    start = time.perf_counter()
    while True:
        while k < len(order) and rows[order[k]][0] <= now:
            i = order[k]
            arrival, prompt, output, prefix = rows[i]
            params = SamplingParams(max_tokens=output, ignore_eos=True)
            sched.add_request(Sequence(i, range(prompt), params, arrival, prefix=prefix))
            k += 1
        arrival_next = rows[order[k]][0] if k < len(order) else float("inf")
        if not sched.has_unfinished():
            if k == len(order):
                break
            now = max(now, arrival_next)
            continue
        if plain:
            if sched.run_plain_decodes(on_step, ignore):  # type: ignore[attr-defined]
                sched.end_plain_decode()  # type: ignore[attr-defined]
                continue
            if not sched.has_unfinished():
                continue
        out = sched.schedule()
        n = out.num_batched_tokens
        sched.update(out, zeros[: out.num_seqs] if out.num_seqs <= 4096 else [0] * out.num_seqs)
        if not n:
            if k < len(order):
                now = max(now, arrival_next)
            continue
        steps += 1
        now += STEP_BASE_S + STEP_PER_TOKEN_S * n
    return {"loop_s": time.perf_counter() - start, "steps": steps, "final_time_s": now}


def v1_scheduler(num_blocks: int, max_model_len: int, fast: bool, caching: bool = True):
    bm = BlockManager(num_blocks, 16, enable_prefix_caching=caching)
    config = SchedulerConfig(
        max_num_seqs=1024, max_num_batched_tokens=8192, max_model_len=max_model_len,
        scheduler="v1",
    )  # fmt: skip
    return make_scheduler(config, bm, fast=fast)


def run_reference(trace: Path, options: list[str]) -> dict[str, Any] | None:
    if not REFERENCE_PYTHON.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.jsonl"
        cmd = [str(REFERENCE_PYTHON), str(DRIVER), str(trace), "--out", str(out), *options]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        with out.open() as f:
            *_, last = f
    summary: dict[str, Any] = json.loads(last)
    return summary


# --- 2. mooncake -------------------------------------------------------------------------


def load_mooncake(path: Path) -> list[dict[str, Any]]:
    """Raw Mooncake lines (timestamp ms, input_length, output_length, hash_ids) or the
    repository's kvsim-format sample; returned in the reference driver's native format."""
    rows: list[dict[str, Any]] = []
    hbs = 512
    with path.open() as f:
        for line in f:
            d = json.loads(line)
            if "kvsim_trace" in d:
                hbs = d.get("hash_block_size", hbs)
            elif "input_length" in d:
                rows.append(
                    {"request_id": str(len(rows)), "arrival_time_s": d["timestamp"] / 1000.0,
                     "prompt_tokens": d["input_length"], "output_tokens": d["output_length"],
                     "hash_ids": d["hash_ids"], "hash_block_size": 512}
                )  # fmt: skip
            else:
                rows.append({**d, "hash_block_size": d.get("hash_block_size", hbs)})
    return rows


def section_mooncake(args: argparse.Namespace) -> None:
    path = (
        Path(args.mooncake)
        if args.mooncake
        else TRACES / ("mooncake_fast25_conversation_first_1000.jsonl")
    )
    raw = load_mooncake(path)
    max_len = max(r["prompt_tokens"] + r["output_tokens"] for r in raw)
    print(
        f"== mooncake: {len(raw):,} requests from {path.name}, {args.mooncake_blocks:,} blocks =="
    )

    def rows() -> list[tuple[float, int, int, PrefixSource]]:
        # built in the timed region's setup: prefix_from_hash_ids is O(hash ids)
        return [
            (r["arrival_time_s"], r["prompt_tokens"], r["output_tokens"],
             prefix_from_hash_ids(r["hash_ids"], r["hash_block_size"], r["prompt_tokens"], 16))
            for r in raw
        ]  # fmt: skip

    def run(fast: bool, multi_step: bool) -> dict[str, float]:
        # The reference's loop_s includes building its requests: so does this one.
        start = time.perf_counter()
        prefixed = rows()
        build_s = time.perf_counter() - start
        result = clock_loop(v1_scheduler(args.mooncake_blocks, max_len, fast), prefixed, multi_step)
        result["loop_s"] += build_s
        return result

    variants: dict[str, Callable[[], dict[str, float]]] = {
        "kvsim v1 Scheduler": lambda: run(False, False),
        "kvsim v1 Fast": lambda: run(True, False),
        "kvsim v1 Fast, multi-step": lambda: run(True, True),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    reference: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "mooncake.jsonl"
        trace.write_text("".join(json.dumps(r) + "\n" for r in raw))
        for repeat in range(args.repeats):
            for name, variant in variants.items():
                results[name].append(variant())
            if repeat == 0 and not args.no_reference:
                reference = run_reference(
                    trace,
                    ["--block-size", "16", "--num-blocks", str(args.mooncake_blocks + 1),
                     "--max-num-seqs", "1024", "--max-num-batched-tokens", "8192",
                     "--block-ids", "none"],
                )  # fmt: skip
    medians = {name: median_of(runs) for name, runs in results.items()}
    for name, med in medians.items():
        print(
            f"{name:28s} loop {med['loop_s']:7.2f} s  steps {med['steps']:9,.0f}  "
            f"final clock {med['final_time_s']:10.3f} s  (median of {args.repeats})"
        )
    if reference is None:
        print("vLLM 0.33.0 reference: skipped (no ~/vllm-ref, or --no-reference)")
        return
    print(
        f"{'vLLM 0.33.0 scheduler loop':28s} loop {reference['loop_s']:7.2f} s  steps "
        f"{reference['nonempty_steps']:9,.0f}  final clock {reference['final_time_s']:10.3f} s"
        f"  (its driver's loop_s, one run; wall {reference['wall_s']:.1f} s)"
    )
    for name, med in medians.items():
        same = med["steps"] == reference["nonempty_steps"] and (
            round(med["final_time_s"], 6) == round(reference["final_time_s"], 6)
        )
        print(
            f"  {name}: {reference['loop_s'] / med['loop_s']:.1f}x faster than vLLM's loop; "
            f"same steps and clock: {same}"
        )


# --- 3. azure ----------------------------------------------------------------------------


def section_azure(args: argparse.Namespace) -> None:
    rows_raw = []
    with (TRACES / "azure_llm_2023_conv.jsonl").open() as f:
        for line in f:
            d = json.loads(line)
            if "request_id" in d:
                rows_raw.append((d["arrival_time_s"], d["prompt_tokens"], d["output_tokens"]))
    max_len = max(p + o for _, p, o in rows_raw)
    num_blocks = args.azure_blocks
    print(f"== azure 2023 conversation: {len(rows_raw):,} requests, {num_blocks:,} blocks ==")
    rows = [(t, p, o, UNIQUE_PREFIX) for t, p, o in rows_raw]

    def classic(fast: bool) -> Scheduler:
        config = SchedulerConfig(
            max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=max_len
        )
        bm = BlockManager(num_blocks, 16)
        return make_scheduler(config, bm, fast=fast)

    def v1(fast: bool, caching: bool) -> Scheduler:
        config = SchedulerConfig(
            max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=max_len, scheduler="v1"
        )
        bm = BlockManager(num_blocks, 16, enable_prefix_caching=caching)
        return make_scheduler(config, bm, fast=fast)

    variants: dict[str, Callable[[], dict[str, float]]] = {
        "classic FastDecode, multi-step": lambda: clock_loop(classic(True), rows, True),
        "v1 Fast, multi-step": lambda: clock_loop(v1(True, False), rows, True),
        "v1 Fast + caching, multi-step": lambda: clock_loop(v1(True, True), rows, True),
        "classic Scheduler": lambda: clock_loop(classic(False), rows, False),
        "v1 Scheduler + caching": lambda: clock_loop(v1(False, True), rows, False),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, variant in variants.items():
            results[name].append(variant())
    medians = {name: median_of(runs) for name, runs in results.items()}
    base = medians["classic FastDecode, multi-step"]["loop_s"]
    for name, med in medians.items():
        print(
            f"{name:32s} loop {med['loop_s']:6.2f} s ({med['loop_s'] / base:4.2f}x classic fast) "
            f"steps {med['steps']:9,.0f}  (median of {args.repeats})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sections", default="synthetic,mooncake,azure")
    parser.add_argument("--mooncake", help="a Mooncake trace (raw JSONL or kvsim format)")
    parser.add_argument("--mooncake-blocks", type=int, default=30_000)
    parser.add_argument("--azure-blocks", type=int, default=7_500)
    parser.add_argument("--no-reference", action="store_true", help="skip vLLM's own loop")
    args = parser.parse_args()
    sections = {"synthetic": section_synthetic, "mooncake": section_mooncake,
                "azure": section_azure}  # fmt: skip
    for name in args.sections.split(","):
        sections[name](args)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
