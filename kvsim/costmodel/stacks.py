"""Serving stacks: what a serving engine changes about the kernel-profile coefficients.

The shipped coefficients describe kernels as Vidur profiled them (KINETO kernel times of an
eager PyTorch stack of 2023-24) plus public priors for the costs outside the kernels, taken
from vLLM v0.6.0 (a synchronous engine whose GPU sat idle 62% of a step). A serving stack
replaces what its engine does differently, by physical argument, never by a per-model fit
(docs/costmodel.md, "Against real vLLM runs: the decode step"):

- **costs outside the kernels**: vLLM's V1 engine keeps a persistent batch, replays decode
  steps as CUDA graphs and schedules the next step while the current one runs (async
  scheduling), so the host's scheduling, input preparation and output processing are hidden
  behind the GPU; what stays exposed is the GPU's own work outside the profiled operators
  (embedding, final norm, sampling, input copies, the gaps between graph nodes);
- **decode attention on Hopper**: the H100 / H200 attention coefficients are the A100's
  FlashAttention-2 fit scaled by datasheet peaks (no H100 attention profile exists), which
  keeps the A100 kernel's wave structure and its 78% of peak bandwidth. vLLM 0.15 runs
  FlashAttention 3 on Hopper: one persistent launch whose thread blocks take work tiles as
  they free up (no per-wave cost) and stream K/V at the rate the same GPU's profiles measure
  for streaming weights (the fitted GEMM's ``bw_efficiency``);
- **all-reduce on Hopper**: the NCCL lines were profiled outside CUDA graphs. vLLM 0.15 runs
  its own custom all-reduce kernel inside the step's graph for every message below a few MiB
  (all of decode), and NCCL only above (kvsim/costmodel/custom_allreduce.py).

A stack also says what its API server adds on the client's clock (``frontend_latency_s``):
not a step price, so not in the coefficient files; ``kvsim validate-real`` adds it to TTFT and
E2E.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from kvsim.costmodel.coefficients import (
    STACK_DIR,
    AllReduceCoefficients,
    Provenance,
    StepCoefficients,
    preset_coefficient_names,
    preset_coefficients,
    save_coefficients,
)
from kvsim.costmodel.custom_allreduce import (
    KIB,
    MIB,
    CustomAllReduce,
    CustomAllReduceLimits,
)
from kvsim.costmodel.specio import CostModelError


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingStack:
    """A serving engine's corrections to kernel-profile coefficients (seconds)."""

    name: str
    description: str
    step_overhead_s: float  # exposed GPU work per step outside the profiled operators
    seq_overhead_s: float  # exposed work per scheduled sequence per step (sampling row)
    persistent_decode_gpus: tuple[str, ...]  # GPUs whose decode attention runs persistent
    custom_allreduce: CustomAllReduce | None  # the engine's own all-reduce kernel, if any
    custom_allreduce_gpus: tuple[str, ...]  # GPUs it is priced on (published measurements)
    # The API server's own time per request, on the client's clock and never in a step price:
    # added to TTFT and E2E by validate-real (kvsim/outputs/validate_real.py, ClientView).
    frontend_latency_s: float = 0.0


# vLLM 0.15's custom all-reduce on Hopper (compute capability 9.0), NVSwitch-connected GPUs:
# - limits, from vLLM's source: custom_all_reduce.py (should_custom_ar: size < max_size, any
#   world size when fully connected; max_size = min(CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][w],
#   8 MiB default) with torch symmetric memory on, the default since vllm#24111: 8 MiB at 2 and
#   4 GPUs, 512 KiB at 6, 256 KiB at 8); csrc/custom_all_reduce.cuh (one-shot always at 2
#   GPUs, below 512 KiB at up to 4, below 256 KiB at up to 8; two-shot above).
# - time constants: least squares on relative error (fit_custom_allreduce) over every H100 row
#   vLLM's CUDA-graph microbenchmark (benchmarks/kernels/benchmark_device_communicators.py)
#   published for the kernel: vllm#24111 (2, 4 and 6 GPUs) and vllm#24532 (4 GPUs), 0.5-4 MiB,
#   at GPUSpec h100-sxm's 450 GB/s NVLink per direction; the rows and the fit are
#   benchmarks/data/custom_allreduce_h100_published.json and
#   benchmarks/fit_custom_allreduce.py (one-shot 4.2% MAPE, two-shot 9.5%).
VLLM_0_15_HOPPER_ALLREDUCE = CustomAllReduce(
    source="vLLM 0.15 custom all-reduce (csrc/custom_all_reduce.cuh) in a CUDA graph: limits "
    "from vLLM's source (all_reduce_utils.py, compute capability 9.0, torch symmetric memory "
    "on), constants fitted to vllm#24111 and vllm#24532's published H100 microbenchmarks "
    "(docs/costmodel.md, All-reduce under vLLM 0.15)",
    one_shot_latency_s=5.58334e-06,
    one_shot_bw_efficiency=0.794842,
    two_shot_latency_s=1.23261e-05,
    two_shot_bw_efficiency=0.540661,
    by_num_workers={
        2: CustomAllReduceLimits(max_bytes=8 * MIB, one_shot_max_bytes=8 * MIB),
        4: CustomAllReduceLimits(max_bytes=8 * MIB, one_shot_max_bytes=512 * KIB),
        6: CustomAllReduceLimits(max_bytes=512 * KIB, one_shot_max_bytes=256 * KIB),
        8: CustomAllReduceLimits(max_bytes=256 * KIB, one_shot_max_bytes=256 * KIB),
    },
)


VLLM_0_15 = ServingStack(
    name="vllm-0.15",
    description="vLLM 0.15 (V1 engine): CUDA-graphed decode, async scheduling, "
    "FlashAttention 3 on Hopper",
    step_overhead_s=200e-6,
    seq_overhead_s=2e-6,
    persistent_decode_gpus=("h100-sxm", "h200"),
    custom_allreduce=VLLM_0_15_HOPPER_ALLREDUCE,
    # H200: the same GH100 chip and NVLink 4 as the H100 (GPUSpec). The A100 runs the same
    # kernel under vLLM, but no in-graph A100 measurement of it is published: its NCCL fit stays.
    custom_allreduce_gpus=("h100-sxm", "h200"),
    # Request parsing, tokenization, the ZMQ hand-off to the engine core and back,
    # detokenization and the first SSE chunk: a constant per request, no published per-request
    # figure found, so fitted (least squares on relative TTFT error) on the five served stages
    # of the four Llama-2-7B TP1 runs and nowhere else: 5.34 ms, shipped as 5.3 ms
    # (benchmarks/fit_frontend_latency.py; docs/costmodel.md, "The client's clock").
    frontend_latency_s=5.3e-3,
)
SERVING_STACKS = {VLLM_0_15.name: VLLM_0_15}


def resolve_stack(name: str) -> ServingStack:
    """The serving stack named ``name``; CostModelError naming the known ones otherwise."""
    try:
        return SERVING_STACKS[name]
    except KeyError:
        known = ", ".join(SERVING_STACKS)
        raise CostModelError(f"unknown serving stack {name!r} (known: {known})") from None


def apply_serving_stack(co: StepCoefficients, stack: ServingStack) -> StepCoefficients:
    """``co`` with ``stack``'s corrections: its overheads, and on the GPUs it names, decode
    attention without per-wave cost, streaming K/V at the GEMM fit's bandwidth efficiency, and
    the engine's custom all-reduce below its size limits. The provenance of each changed part
    says what changed and why."""
    overheads = dataclasses.replace(
        co.overheads, step_overhead_s=stack.step_overhead_s, seq_overhead_s=stack.seq_overhead_s
    )
    provenance = dict(co.provenance)
    provenance["overheads"] = Provenance(
        kind="prior",
        source=f"serving stack {stack.name} (docs/costmodel.md, Against real vLLM runs)",
        note=f"{stack.description}: host work hidden behind the GPU; per step and per "
        "sequence only the GPU work outside the profiled operators; block walk unchanged",
    )
    decode = co.decode_attention
    if co.gpu in stack.persistent_decode_gpus:
        decode = dataclasses.replace(
            decode, wave_latency_s=0.0, bw_efficiency=co.gemm.bw_efficiency
        )
        before = co.provenance["attention"]
        provenance["attention"] = Provenance(
            kind="corrected",
            source=f"{before.kind} from {before.source}; decode corrected for {stack.name}",
            profiles=before.profiles,
            note="decode: persistent FlashAttention 3 kernel (no per-wave cost), K/V streamed "
            "at this GPU's fitted GEMM bw_efficiency; prefill as before",
        )
    allreduce = co.allreduce
    if co.gpu in stack.custom_allreduce_gpus and stack.custom_allreduce is not None:
        allreduce = AllReduceCoefficients(
            system=co.allreduce.system,
            by_num_workers=co.allreduce.by_num_workers,
            custom=stack.custom_allreduce,
        )
        before = co.provenance["allreduce"]
        provenance["allreduce"] = Provenance(
            kind="corrected",
            source=f"{before.kind} from {before.source}; custom all-reduce of {stack.name}",
            profiles=before.profiles,
            note="below allreduce.custom's max_bytes the engine's own kernel in a CUDA graph "
            "(allreduce.custom.source); at or above it the NCCL lines as profiled",
        )
    return dataclasses.replace(
        co,
        overheads=overheads,
        decode_attention=decode,
        allreduce=allreduce,
        provenance=provenance,
        source=f"{co.source or 'in memory'} + serving stack {stack.name}",
    )


def stack_preset_name(gpu_name: str, stack: ServingStack) -> str:
    """The shipped file stem of GPU preset ``gpu_name`` under ``stack``: ``GPU+STACK``."""
    return f"{gpu_name}+{stack.name}"


def stack_preset(gpu_name: str, stack: ServingStack) -> StepCoefficients:
    """GPU preset ``gpu_name``'s shipped coefficients with ``stack`` applied."""
    return apply_serving_stack(preset_coefficients(gpu_name), stack)


def write_stack_presets(out_dir: Path = STACK_DIR) -> list[Path]:
    """Write every GPU preset under every serving stack to ``out_dir`` (the shipped files:
    ``python -m kvsim.costmodel.stacks``); return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for stack in SERVING_STACKS.values():
        for gpu_name in preset_coefficient_names():
            path = out_dir / f"{stack_preset_name(gpu_name, stack)}.json"
            save_coefficients(stack_preset(gpu_name, stack), path)
            paths.append(path)
    return paths


if __name__ == "__main__":
    write_stack_presets()
