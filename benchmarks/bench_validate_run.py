"""Engine mode against calibrated cost mode on a held-out trace (issue 14's acceptance figure).

1. ``kvsim profile --mode engine --model tiny-llama`` (threads pinned) into a profile folder,
   unless ``--profile DIR`` names one already measured;
2. ``kvsim calibrate`` fits the "cpu" device from it;
3. a trace the profile never saw (Poisson arrivals fast enough to keep the engine busy,
   lognormal prompt and output lengths) runs ``--repeats`` times through ``kvsim validate-run``:
   engine mode, every step priced by the calibrated model, and cost mode on the same trace.

Prints the machine's load average before and after each part, the profile's noise, and the
medians over the repeats of: step-time MAPE, and the relative error of throughput, TTFT and
TPOT. Acceptance: step-time MAPE <= 10%, throughput within 5%.

Two noise figures say what a perfect model could reach on this machine: the step-time MAPE a
model exact in the mean would get against single measurements with the profile's repeat
spread (sqrt(2/pi) x the median coefficient of variation of its whole steps, the mean absolute
deviation of a normal variable), and how far the engine's own throughput moves between the
identical repeats (max / min - 1).

    python benchmarks/bench_validate_run.py [--profile DIR] [--repeats 3] [--timer wall|thread]
                                            [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.config import RunConfig
from kvsim.costmodel import load_coefficients, resolve_gpu, save_coefficients
from kvsim.costmodel.calibrate import fit_gpu
from kvsim.costmodel.profiles import load_profile_dir
from kvsim.outputs.validate_run import compare_runs, write_comparison
from kvsim.sim.engine_profile import write_engine_profile
from workloads import ArrivalProcess, generate_trace, save_trace

FIGURES = (
    ("step_time_mape_pct", "step-time MAPE (%)"),
    ("throughput_output_tokens_per_s", "throughput (output tok/s) error"),
    ("ttft_s.mean", "TTFT mean error"),
    ("ttft_s.p50", "TTFT p50 error"),
    ("tpot_s.mean", "TPOT mean error"),
    ("tpot_s.p50", "TPOT p50 error"),
    ("e2e_latency_s.mean", "end-to-end mean error"),
)


def load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def step_noise_floor_pct(profile: Path) -> float:
    """sqrt(2/pi) x the median CV of the profile's repeated whole steps, in %."""
    steps = pd.concat(pd.read_csv(f) for f in sorted((profile / "steps").glob("*.csv")))
    cv = steps["time_stats.step.std"] / steps["time_stats.step.median"]
    return 100 * math.sqrt(2 / math.pi) * float(cv.median())


def held_out_trace(folder: Path, seed: int) -> Path:
    trace = generate_trace(
        arrivals=ArrivalProcess(rate_per_s=60.0),
        prompt="lognormal:180:0.8:1500",
        output="lognormal:48:0.8:300",
        num_requests=160,
        seed=seed,
        name="held_out",
    )
    path = folder / "held_out.jsonl"
    save_trace(trace, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, help="an engine profile folder to reuse")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timer", choices=("wall", "thread"), default="wall")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, help="keep the profile, coefficients and folders")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="bench_validate_run-"))
    work.mkdir(parents=True, exist_ok=True)
    profile = args.profile
    if profile is None:
        profile = work / "profile"
        print(f"load average before profiling: {load()}")
        record = write_engine_profile(
            profile, "tiny-llama", threads=args.threads, repeats=15, timer=args.timer
        )
        print(f"profiled in {record['seconds']} s; noise {json.dumps(record['noise'])}")
        print(f"load average after profiling: {load()}")
    profiles = load_profile_dir(profile)
    gpu = resolve_gpu(profile / "device.json")
    coefficients = work / "cpu.json"
    save_coefficients(fit_gpu(profiles, gpu), coefficients)
    co = load_coefficients(coefficients)
    trace = held_out_trace(work, args.seed)
    config = RunConfig(
        trace=str(trace), mode="engine", model="tiny-llama", gpu=str(profile / "device.json"),
        coefficients=str(coefficients), num_blocks=2048, threads=args.threads,
        max_num_seqs=64, max_num_batched_tokens=2048, seed=args.seed,
    )  # fmt: skip
    results: list[dict[str, Any]] = []
    shape_mape: list[float] = []
    for i in range(args.repeats):
        print(f"validate-run {i + 1}/{args.repeats}, load average before: {load()}")
        comparison = compare_runs(config, gpu, co, args.timer)
        write_comparison(comparison, work / f"validate_run_{i}")
        results.append(comparison.summary)
        # The model's error once the run's overall speed is taken out: the machine's speed
        # moves between runs (see the noise line), the model's shape should not.
        steps = comparison.steps
        ratio = float((steps["measured_s"] / steps["predicted_s"]).median())
        scaled = steps["predicted_s"] * ratio / steps["measured_s"] - 1
        shape_mape.append(round(100 * float(scaled.abs().mean()), 2))
        s = comparison.summary
        print(f"  steps {s['num_steps']}, step MAPE {s['step_time_mape_pct']}%, "
              f"throughput {s['relative_error']['throughput_output_tokens_per_s']:+.2%}, "
              f"engine wall {s['engine_wall_s']} s")  # fmt: skip
    print(f"load average after: {load()}\n")
    for key, label in FIGURES:
        if key == "step_time_mape_pct":
            values = [r[key] for r in results]
            print(f"{label:34s} median {statistics.median(values):6.2f}   runs {values}")
        else:
            values = [100 * r["relative_error"][key] for r in results]
            shown = [round(v, 2) for v in values]
            print(f"{label:34s} median {statistics.median(values):+6.2f}%  runs {shown}")
    by_kind: dict[str, list[float]] = {}
    for r in results:
        for row in r["step_time_by_kind"]:
            by_kind.setdefault(row["kind"], []).append(row["mape_pct"])
    for kind, values in by_kind.items():
        print(f"step-time MAPE, {kind:8s}             median {statistics.median(values):6.2f}")
    bias: dict[str, list[float]] = {}
    for r in results:
        for row in r["step_time_by_kind"]:
            bias.setdefault(row["kind"], []).append(row["bias_pct"])
    for kind, values in bias.items():
        print(f"step-time bias, {kind:8s}             median {statistics.median(values):+6.2f}%"
              f"  runs {values}")  # fmt: skip
    print(f"step-time MAPE, run speed removed    median {statistics.median(shape_mape):6.2f}"
          f"   runs {shape_mape} (x the run's median measured / predicted)")  # fmt: skip
    engine = [r["engine"]["throughput_output_tokens_per_s"] for r in results]
    spread = max(engine) / min(engine) - 1
    print(f"\nnoise: a perfect model's step-time MAPE at the profile's spread "
          f"{step_noise_floor_pct(profile):.1f}%; engine throughput across the identical "
          f"repeats {[round(t) for t in engine]} tok/s, spread {spread:.1%}; "
          f"engine wall {[r['engine_wall_s'] for r in results]} s")  # fmt: skip
    print(f"\nfolders in {work}")


if __name__ == "__main__":
    main()
