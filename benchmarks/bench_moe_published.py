"""Mixtral-8x7B in kvsim against published vLLM measurements (docs/costmodel.md, "Mixture of
experts"). Nothing here is fitted: the shipped coefficients price every step.

1. vLLM PR #3240 (github.com/vllm-project/vllm/pull/3240): ``benchmark_latency.py`` on 2 x
   A100-80GB, Mixtral-8x7B-Instruct, 1000 prompt and 50 output tokens, batch 1-64, tuned fused
   MoE config: mean end-to-end latency of one batch. kvsim prices the same steps: the prompts
   prefilled whole (at most 32 per step: vLLM 0.3's max_num_batched_tokens = max_model_len
   32768), then 49 decode steps of the batch.
2. vLLM PR #2979 (github.com/vllm-project/vllm/pull/2979): ``benchmark_serving`` on 2 x H100,
   1000 prompt and 50 output tokens, Poisson arrivals at 1, 2, 4, 6 req/s: "ITL", which
   benchmark_serving of February 2024 computed per request as (E2E - TTFT) / (output - 1),
   kvsim's TPOT (its own ``itl_s`` also counts the gap from an idle GPU's last decode step to a
   new request's first decode, which at 1 req/s doubles its mean). kvsim runs a trace of the
   same shape (300 requests, seed 0) with the classic scheduler (vLLM 0.3's).

Each with the GPU's shipped kernel-profile coefficients (3 ms per-step prior of vLLM 0.6) and
with the ``vllm-0.15`` serving stack (0.2 ms): the published runs predate both.

    python benchmarks/bench_moe_published.py [--bounds]

``--bounds`` prints instead the step times of docs/costmodel.md's bounds table: each MoE preset
against dense models with its active and with all its parameters (shipped coefficients).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from kvsim.costmodel import (
    BatchShape,
    CostModel,
    ModelSpec,
    estimate_num_params,
    preset_coefficients,
    resolve_gpu,
    resolve_model,
)
from kvsim.costmodel.coefficients import STACK_DIR
from kvsim.costmodel.stacks import VLLM_0_15, stack_preset

PROMPT, OUTPUT = 1000, 50
# PR #3240, "This PR" (tuned config), seconds per batch.
LATENCY_A100_TP2 = {1: 0.762, 2: 1.033, 4: 1.449, 8: 2.034, 16: 2.893, 32: 4.531, 64: 7.537}
# PR #2979, "this PR" (tuned fused MoE), mean "ITL" (per-request TPOT) in ms.
ITL_H100_TP2 = {1: 11.6, 2: 12.6, 4: 23.6, 6: 32.9}


def batch_latency(cost: CostModel, batch: int) -> float:
    """One benchmark_latency iteration: whole-prompt prefills, then OUTPUT - 1 decode steps."""
    seconds, left = 0.0, batch
    while left:
        n = min(32768 // PROMPT, left)
        seconds += cost.step_time(BatchShape.of(prefill_chunks=[(PROMPT, 0)] * n))
        left -= n
    for i in range(1, OUTPUT):
        context = PROMPT + i + 1
        blocks = -(-context // 16)
        seconds += cost.step_time(BatchShape.decode(batch, batch * context, batch * blocks))
    return seconds


def write_trace(path: Path, rate: float, count: int = 300, seed: int = 0) -> None:
    rng = random.Random(seed)
    t = 0.0
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["request_id", "arrival_time_s", "prompt_tokens", "output_tokens"])
        for i in range(count):
            writer.writerow([i, f"{t:.6f}", PROMPT, OUTPUT])
            t += rng.expovariate(rate)


def serving_tpot_ms(rate: float, coefficients: Path | None, work: Path) -> float:
    trace, out = work / f"poisson_{rate:g}.csv", work / f"run_{rate:g}_{coefficients is None}"
    write_trace(trace, rate)
    command = [sys.executable, "-m", "kvsim", "run", str(trace), "--model", "mixtral-8x7b",
               "--gpu", "h100-sxm", "--tp", "2", "--scheduler", "classic", "--no-plots",
               "--out", str(out)]  # fmt: skip
    if coefficients is not None:
        command += ["--coefficients", str(coefficients)]
    subprocess.run(command, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    return 1e3 * float(summary["tpot_s"]["mean"])


def dense_like(model: ModelSpec, experts: int) -> ModelSpec:
    """``model`` with one dense MLP as wide as ``experts`` of its experts."""
    width = experts * model.moe_intermediate_size
    params = estimate_num_params(
        num_layers=model.num_layers, hidden_size=model.hidden_size, num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads, head_dim=model.head_dim, intermediate_size=width,
        vocab_size=model.vocab_size,
    )  # fmt: skip
    return dataclasses.replace(
        model, name=f"dense {experts} x {model.moe_intermediate_size}", intermediate_size=width,
        num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, num_params=params,
    )  # fmt: skip


def bounds() -> None:
    print("| model | gpu | tp | decode 1 | decode 8 | decode 64 | decode 256 | prefill 512 | "
          "prefill 2000 |")  # fmt: skip
    for name, gpu_name, tp in (
        ("mixtral-8x7b", "h100-sxm", 2),
        ("mixtral-8x7b", "a100-80gb", 2),
        ("qwen3-30b-a3b", "h100-sxm", 1),
    ):
        moe, gpu = resolve_model(name), resolve_gpu(gpu_name)
        for model in (
            moe,
            dense_like(moe, moe.num_experts_per_tok),
            dense_like(moe, moe.num_experts),
        ):
            cost = CostModel(model, gpu, tp=tp)
            ms = [cost.step_time(BatchShape.decode(n, n * 1000, n * 63)) for n in (1, 8, 64, 256)]
            ms += [cost.step_time(BatchShape.of(prefill_chunks=[(p, 0)])) for p in (512, 2000)]
            cells = " | ".join(f"{1e3 * t:.1f}" for t in ms)
            print(f"| {model.name} | {gpu_name} | {tp} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bounds", action="store_true", help="print the bounds table only")
    if parser.parse_args().bounds:
        bounds()
        return
    model = resolve_model("mixtral-8x7b")
    a100 = resolve_gpu("a100-80gb")
    sources = {
        "kernel profiles": preset_coefficients("a100-80gb"),
        "+ vllm-0.15": stack_preset("a100-80gb", VLLM_0_15),
    }
    costs = {name: CostModel(model, a100, tp=2, coefficients=co) for name, co in sources.items()}
    print("PR #3240: A100-80GB TP2, 1000 in / 50 out, batch latency (s)")
    print(f"{'batch':>5} {'measured':>9} " + " ".join(f"{n:>22}" for n in costs))
    for batch, measured in LATENCY_A100_TP2.items():
        cells = []
        for cost in costs.values():
            predicted = batch_latency(cost, batch)
            cells.append(f"{predicted:7.3f} ({100 * (predicted / measured - 1):+6.1f}%)")
        print(f"{batch:>5} {measured:>9.3f} " + " ".join(f"{c:>22}" for c in cells))

    print("\nPR #2979: H100 TP2, 1000 in / 50 out, Poisson, mean TPOT (ms)")
    print(f"{'rate':>6} {'measured':>9} {'kernel profiles':>18} {'+ vllm-0.15':>18}")
    stack_file = STACK_DIR / "h100-sxm+vllm-0.15.json"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for rate, measured in ITL_H100_TP2.items():
            cells = []
            for coefficients in (None, stack_file):
                tpot = serving_tpot_ms(rate, coefficients, work)
                cells.append(f"{tpot:5.1f} ({100 * (tpot / measured - 1):+6.1f}%)")
            print(f"{rate:>4g}/s {measured:>9.1f} " + " ".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
