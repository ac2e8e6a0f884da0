"""The whole ``kvsim run`` process on the Mooncake FAST'25 conversation trace against vLLM
0.33.0's own scheduler loop, on the same trace and pool, measured in one benchmark run. The
bar is issue 26's: kvsim's v1 process at least 30x faster than the reference's ``loop_s``
(issue 13's earlier 5x bar is printed beside it).

In one run, in turns:

- ``kvsim run TRACE --model llama-3.1-8b --gpu h100-sxm --max-model-len 200000
  --allow-long-max-model-len --num-blocks 200000 --no-plots`` (v1, prefix caching on, the
  cost model): wall and CPU seconds of the whole process, median of --repeats;
- the same with ``--scheduler classic`` beside it (which rejects the prompts longer than the
  8,192-token budget: classic has no chunked prefill);
- the reference driver (benchmarks/vllm_reference/drive_vllm.py, vLLM 0.33.0's unmodified v1
  Scheduler + KVCacheManager, no model) on the same trace and pool: 200,001 vLLM blocks of
  16 (its block 0 is the null block), 1,024 seqs, 8,192 batched tokens, max_model_len
  200,000; its summary's ``loop_s``, once (it runs for minutes), between kvsim's first and
  second rounds. Skipped with a message when ~/vllm-ref (its venv, see its README) is absent,
  or with --no-reference; --reference-summary FILE prints the figures of an earlier reference
  run (its steps file's last line) instead, labelled as not measured in this run.

TRACE is the shipped ``mooncake_fast25_conversation`` (12,031 requests, 512-token hash ids);
--trace takes another (e.g. the _first_1000 sample for a quick look).

    python benchmarks/bench_mooncake.py [--repeats 3] [--trace NAME|FILE] [--no-reference]
        [--reference-summary STEPS.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_cli import timed
from bench_scheduler import DRIVER, REFERENCE_PYTHON, load_mooncake

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "workloads" / "traces"
NUM_BLOCKS = 200_000  # kvsim's usable blocks; the reference gets one more (its null block)
POOL = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "200000"]
POOL += ["--allow-long-max-model-len"]  # past the model's 131,072 tokens, as the reference
# kvsim's v1 process at least this many times faster than the reference's loop_s
TARGETS = {"issue 26": 30.0, "issue 13": 5.0}


def kvsim_command(trace: str, out: Path, scheduler: str) -> list[str]:
    cmd = [sys.executable, "-m", "kvsim", "run", trace, *POOL, "--num-blocks", str(NUM_BLOCKS)]
    cmd += ["--scheduler", scheduler, "--no-plots", "--force", "--out", str(out)]
    return cmd


def trace_file(trace: str) -> Path:
    path = Path(trace)
    return path if path.suffix else TRACES / f"{trace}.jsonl"


def reference(trace: Path, tmp: Path) -> dict[str, Any]:
    """One reference run on ``trace`` (converted to its native format): its summary line,
    with its process's wall and CPU seconds."""
    native = tmp / "reference_trace.jsonl"
    with native.open("w") as f:
        for row in load_mooncake(trace):
            f.write(json.dumps(row) + "\n")
    steps = tmp / "reference_steps.jsonl"
    cmd = [str(REFERENCE_PYTHON), str(DRIVER), str(native), "--out", str(steps)]
    cmd += ["--block-size", "16", "--num-blocks", str(NUM_BLOCKS + 1), "--max-num-seqs", "1024"]
    cmd += ["--max-num-batched-tokens", "8192", "--max-model-len", "200000", "--block-ids", "none"]
    wall, cpu = timed(cmd)
    summary = last_line(steps)
    steps.unlink()
    return {**summary, "process_wall_s": wall, "process_cpu_s": cpu}


def last_line(path: Path) -> dict[str, Any]:
    with path.open() as f:
        *_, last = f
    summary: dict[str, Any] = json.loads(last)
    if summary.get("type") != "summary":
        raise SystemExit(f"{path}: its last line is not the driver's summary")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace", default="mooncake_fast25_conversation")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--reference-summary", type=Path, metavar="STEPS.jsonl")
    args = parser.parse_args()

    env = dict(os.environ, PYTHONPATH=str(REPO))
    times: dict[str, list[tuple[float, float]]] = {"v1": [], "classic": []}
    ref: dict[str, Any] | None = None
    ref_note = ""
    if args.reference_summary is not None:
        ref = last_line(args.reference_summary)
        ref_note = f" (from {args.reference_summary}: NOT measured in this run)"
    elif args.no_reference:
        ref_note = "skipped (--no-reference)"
    elif not REFERENCE_PYTHON.exists():
        ref_note = f"skipped: no {REFERENCE_PYTHON} (build it: benchmarks/vllm_reference/README.md)"
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-mooncake-") as tmp:
        root = Path(tmp)
        for repeat in range(args.repeats):
            for scheduler in times:
                cmd = kvsim_command(args.trace, root / scheduler, scheduler)
                times[scheduler].append(timed(cmd, env))
            if repeat == 0 and not ref_note:
                ref = reference(trace_file(args.trace), root)
    print(
        f"{args.trace}: llama-3.1-8b on h100-sxm, {NUM_BLOCKS:,} blocks of 16, prefix caching, "
        f"max_model_len 200,000; kvsim median of {args.repeats}"
    )
    medians = {}
    for scheduler, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        medians[scheduler] = wall
        print(
            f"  kvsim run --no-plots, {scheduler:7s} process  wall {wall:7.1f} s  CPU {cpu:7.1f} s"
        )
    if ref is None:
        print(f"  vLLM 0.33.0 reference: {ref_note}")
        return
    loop = ref["loop_s"]
    measured = ""
    if "process_wall_s" in ref:
        measured = (
            f"  (its process: wall {ref['process_wall_s']:.1f} s, CPU {ref['process_cpu_s']:.1f} s)"
        )
    print(
        f"  vLLM 0.33.0 scheduler loop            loop_s {loop:7.1f} s  "
        f"{ref['nonempty_steps']:,} steps, hit rate {ref['prefix_hit_rate']:.4f}"
        f"{measured}{ref_note}"
    )
    ratio = loop / medians["v1"]
    print(
        f"  kvsim v1 process {ratio:.1f}x faster than the reference loop; "
        f"classic {loop / medians['classic']:.1f}x"
    )
    for issue, target in TARGETS.items():
        verdict = "meets" if ratio >= target else "MISSES"
        print(f"    {issue}'s {target:.0f}x bar: {verdict} ({ratio / target:.2f} of it)")


if __name__ == "__main__":
    main()
