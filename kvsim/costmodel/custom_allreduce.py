"""vLLM's custom all-reduce kernel, as a serving stack runs it on NVLink GPUs (one call).

vLLM does not use NCCL for a tensor-parallel all-reduce of a few MiB: its own kernel
(csrc/custom_all_reduce.cuh) reads the peers' buffers over NVLink through CUDA IPC, inside the
CUDA graph of the step (the graph's buffers are IPC-registered at capture, so no copy). Two
variants, chosen by the kernel from the message size and worker count:

- **one-shot** (``cross_device_reduce_1stage``): every GPU reads the whole message from each of
  its ``w - 1`` peers and sums: ``one_shot_latency_s + (w - 1) * bytes / (link * eff)``;
- **two-shot** (``cross_device_reduce_2stage``): a reduce-scatter then an all-gather, each GPU
  reading ``(w - 1) / w`` of the message twice: ``two_shot_latency_s + 2 (w - 1) / w * bytes /
  (link * eff)``.

``link`` is GPUSpec ``interconnect_bandwidth`` (per direction). A message at or above the
worker count's ``max_bytes`` (vLLM's ``should_custom_ar`` refuses it), or a worker count with no
limits, goes to the NCCL protocols of the coefficient file instead. The limits come from vLLM's
source, the four time constants from published microbenchmarks of the kernel in a CUDA graph
(:data:`VLLM_0_15_HOPPER`, docs/costmodel.md "All-reduce under vLLM 0.15").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.costmodel.specio import (
    CostModelError,
    check_keys,
    fraction,
    nonempty_str,
    nonnegative_float,
    positive_int,
)

KIB = 1024
MIB = 1024 * KIB
MIN_EFFICIENCY = 1e-6  # as the coefficient files' (kvsim/costmodel/coefficients.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class CustomAllReduceLimits:
    """Which messages of one worker count the custom kernel takes (bytes, exclusive bounds)."""

    max_bytes: int  # below it the custom kernel runs; at or above it, NCCL
    one_shot_max_bytes: int  # below it one-shot, else two-shot


@dataclass(frozen=True, slots=True, kw_only=True)
class CustomAllReduce:
    """The custom kernel's price (seconds; efficiencies of the NVLink peak per direction)."""

    source: str  # where the limits and constants come from
    one_shot_latency_s: float
    one_shot_bw_efficiency: float
    two_shot_latency_s: float
    two_shot_bw_efficiency: float
    by_num_workers: Mapping[int, CustomAllReduceLimits]


def custom_allreduce_time(
    co: CustomAllReduce, link_bandwidth: float, num_workers: int, size_bytes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, taken): the kernel's time for each message of ``size_bytes``, and whether the
    custom kernel takes it at all (where it does not, the seconds are meaningless)."""
    limits = co.by_num_workers.get(num_workers)
    if limits is None:
        return np.zeros_like(size_bytes), np.zeros(size_bytes.shape, dtype=bool)
    w = float(num_workers)
    one_shot = co.one_shot_latency_s + (w - 1.0) * size_bytes / (
        link_bandwidth * co.one_shot_bw_efficiency
    )
    two_shot = co.two_shot_latency_s + 2.0 * (w - 1.0) / w * size_bytes / (
        link_bandwidth * co.two_shot_bw_efficiency
    )
    seconds = np.where(size_bytes < limits.one_shot_max_bytes, one_shot, two_shot)
    return seconds, size_bytes < limits.max_bytes


def fit_custom_allreduce(
    rows: Sequence[tuple[str, int, float, float]], link_bandwidth: float
) -> dict[str, float]:
    """Latency and bandwidth efficiency of each variant from measured rows ``(variant, workers,
    bytes, seconds)`` (variant ``one_shot`` or ``two_shot``): least squares on relative error,
    as kvsim's other fits (a 10 µs row counts as much as a 40 µs one)."""
    fitted: dict[str, float] = {}
    for variant in ("one_shot", "two_shot"):
        mine = [(w, b, t) for v, w, b, t in rows if v == variant]
        if len(mine) < 2:
            raise CostModelError(f"fit_custom_allreduce: {variant} needs 2 rows, got {len(mine)}")
        w, b, t = (np.array(c, dtype=float) for c in zip(*mine, strict=True))
        moved = (w - 1.0) if variant == "one_shot" else 2.0 * (w - 1.0) / w  # bytes per byte
        design = np.column_stack([np.ones_like(t), moved * b / link_bandwidth]) / t[:, None]
        (latency, inverse_efficiency), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
        if latency < 0 or inverse_efficiency <= 0:
            raise CostModelError(f"fit_custom_allreduce: {variant} fit is unphysical")
        fitted[f"{variant}_latency_s"] = float(latency)
        fitted[f"{variant}_bw_efficiency"] = float(1.0 / inverse_efficiency)
    return fitted


# --- JSON (the optional ``allreduce.custom`` block of a coefficient file) ----------------------

_KEYS = (
    "source",
    "one_shot_latency_s",
    "one_shot_bw_efficiency",
    "two_shot_latency_s",
    "two_shot_bw_efficiency",
    "by_num_workers",
)
_LIMIT_KEYS = ("max_bytes", "one_shot_max_bytes")


def custom_to_json(co: CustomAllReduce) -> dict[str, object]:
    def six(x: float) -> float:
        return float(f"{x:.6g}")

    return {
        "source": co.source,
        "one_shot_latency_s": six(co.one_shot_latency_s),
        "one_shot_bw_efficiency": six(co.one_shot_bw_efficiency),
        "two_shot_latency_s": six(co.two_shot_latency_s),
        "two_shot_bw_efficiency": six(co.two_shot_bw_efficiency),
        "by_num_workers": {
            str(w): {"max_bytes": lim.max_bytes, "one_shot_max_bytes": lim.one_shot_max_bytes}
            for w, lim in sorted(co.by_num_workers.items())
        },
    }


def custom_from_json(value: object, where: str) -> CustomAllReduce:
    """Validate ``allreduce.custom``; every error names ``where`` and the key."""
    if not isinstance(value, dict):
        raise CostModelError(f"{where} must be a JSON object, got {value!r}")
    check_keys(value, allowed=_KEYS, required=_KEYS, source=where)
    times = {k: nonnegative_float(value[k], k, where) for k in _KEYS if k.endswith("_s")}
    effs = {k: fraction(value[k], k, where) for k in _KEYS if k.endswith("efficiency")}
    for key, number in times.items():
        if number > 1.0:  # a second per call: no kernel of a step is that slow
            raise CostModelError(f"{where}: {key} must be at most 1 s, got {number!r}")
    for key, number in effs.items():
        if number < MIN_EFFICIENCY:  # smaller ones overflow the step prices
            raise CostModelError(f"{where}: {key} must be at least {MIN_EFFICIENCY:g}")
    workers = value["by_num_workers"]
    if not isinstance(workers, dict) or not workers:
        raise CostModelError(f"{where}.by_num_workers must be a non-empty JSON object")
    limits: dict[int, CustomAllReduceLimits] = {}
    for w, raw in workers.items():
        here = f"{where}.by_num_workers.{w}"
        if not w.isdigit() or int(w) < 2 or not isinstance(raw, dict):
            raise CostModelError(f"{here}: expected a worker count >= 2 with its byte limits")
        check_keys(raw, allowed=_LIMIT_KEYS, required=_LIMIT_KEYS, source=here)
        limits[int(w)] = CustomAllReduceLimits(
            max_bytes=positive_int(raw["max_bytes"], "max_bytes", here),
            one_shot_max_bytes=positive_int(raw["one_shot_max_bytes"], "one_shot_max_bytes", here),
        )
    return CustomAllReduce(
        source=nonempty_str(value["source"], "source", where),
        one_shot_latency_s=times["one_shot_latency_s"],
        one_shot_bw_efficiency=effs["one_shot_bw_efficiency"],
        two_shot_latency_s=times["two_shot_latency_s"],
        two_shot_bw_efficiency=effs["two_shot_bw_efficiency"],
        by_num_workers=limits,
    )
