"""The vllm-0.15 stack's custom all-reduce constants, fitted to published H100 measurements
(docs/costmodel.md, "All-reduce under vLLM 0.15"), and each published row beside the fit and
beside the NCCL line kvsim's h100-sxm preset fitted to Vidur's profiles (measured outside CUDA
graphs).

    PYTHONPATH=. python benchmarks/fit_custom_allreduce.py      # < 1 s

The rows are benchmarks/data/custom_allreduce_h100_published.json (figures only, typed from two
vLLM pull requests; provenance in the file). The printed constants are the ones
kvsim/costmodel/stacks.py ships (tests/costmodel/test_custom_allreduce.py holds them equal).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvsim.costmodel import resolve_gpu
from kvsim.costmodel.coefficients import preset_coefficients
from kvsim.costmodel.custom_allreduce import MIB, fit_custom_allreduce
from kvsim.costmodel.stacks import VLLM_0_15_HOPPER_ALLREDUCE
from kvsim.costmodel.terms import allreduce_time

DATA = Path(__file__).parent / "data" / "custom_allreduce_h100_published.json"
VARIANTS = ("one_shot", "two_shot")


def published_rows(path: Path = DATA) -> list[tuple[str, int, float, float]]:
    """(variant, workers, bytes, seconds) of every published row, custom kernel and pynccl."""
    doc = json.loads(path.read_text())
    sizes = [s * MIB for s in doc["size_mib"]]
    return [
        (row["variant"], row["workers"], size, us * 1e-6)
        for row in doc["rows"]
        for size, us in zip(sizes, row["us"], strict=False)
    ]


def fitted_constants(path: Path = DATA) -> dict[str, float]:
    """The four constants, fitted to the custom kernel's rows at the H100's NVLink peak."""
    rows = [r for r in published_rows(path) if r[0] in VARIANTS]
    return fit_custom_allreduce(rows, resolve_gpu("h100-sxm").interconnect_bandwidth)


def main() -> None:
    gpu = resolve_gpu("h100-sxm")
    fitted = fitted_constants()
    print("fitted (vllm-0.15 stack ships, 6 digits):")
    for key, value in fitted.items():
        print(f"  {key:24s} {value:.6g}   shipped {getattr(VLLM_0_15_HOPPER_ALLREDUCE, key):.6g}")
    custom = VLLM_0_15_HOPPER_ALLREDUCE
    nccl = preset_coefficients("h100-sxm").allreduce
    print("\nvariant   w   MiB  measured µs  custom fit µs  err %   NCCL preset (Vidur) µs")
    errors: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for variant, w, size, seconds in published_rows():
        b = np.array([size])
        nccl_us = allreduce_time(nccl, gpu, w, b)[0] * 1e6
        if variant in VARIANTS:
            lat = getattr(custom, f"{variant}_latency_s")
            eff = getattr(custom, f"{variant}_bw_efficiency")
            moved = (w - 1) if variant == "one_shot" else 2 * (w - 1) / w
            pred = (lat + moved * size / (gpu.interconnect_bandwidth * eff)) * 1e6
            err = pred / (seconds * 1e6) - 1
            errors[variant].append(abs(err))
            print(
                f"{variant:9s} {w:2d} {size / MIB:5.1f} {seconds * 1e6:12.0f} {pred:14.1f}"
                f" {err * 100:+6.1f} {nccl_us:14.1f}"
            )
        else:
            print(
                f"{variant:9s} {w:2d} {size / MIB:5.1f} {seconds * 1e6:12.0f} {'':14s} {'':6s}"
                f" {nccl_us:14.1f}"
            )
    for variant, errs in errors.items():
        print(f"{variant}: MAPE {np.mean(errs) * 100:.1f}% over {len(errs)} rows")


if __name__ == "__main__":
    main()
