"""GPUs for the cost model: GPUSpec, datasheet presets, and ``--gpu-spec file.json``.

Units are SI: bytes, bytes/s, FLOP/s. Sources for every preset number are in docs/costmodel.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from kvsim.costmodel.specio import (
    CostModelError,
    check_keys,
    nonempty_str,
    path_exists,
    positive_float,
    positive_int,
    read_json_object,
    shown,
)

_MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One GPU.

    memory_bytes: device memory the driver reports (nvidia-smi "Total"), which is what vLLM
        multiplies by gpu_memory_utilization (bytes).
    hbm_bandwidth: peak device-memory bandwidth (bytes/s).
    peak_flops: peak dense (non-sparse) bf16/fp16 tensor-core throughput (FLOP/s).
    interconnect_bandwidth: GPU-to-GPU bandwidth per direction used by all-reduce: NVLink, or
        PCIe for cards without it (bytes/s).
    """

    name: str
    memory_bytes: int
    hbm_bandwidth: float
    peak_flops: float
    interconnect_bandwidth: float

    def __post_init__(self) -> None:
        source = f"gpu {self.name!r}"
        nonempty_str(self.name, "name", "gpu")
        positive_int(self.memory_bytes, "memory_bytes", source)
        for field in ("hbm_bandwidth", "peak_flops", "interconnect_bandwidth"):
            positive_float(getattr(self, field), field, source)


GPU_PRESETS: MappingProxyType[str, GPUSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            # A100 SXM4: 1,555 / 2,039 GB/s HBM2e, 312 TFLOP/s dense bf16, NVLink3 600 GB/s total.
            GPUSpec(
                name="a100-40gb",
                memory_bytes=40960 * _MIB,
                hbm_bandwidth=1.555e12,
                peak_flops=312e12,
                interconnect_bandwidth=300e9,
            ),
            GPUSpec(
                name="a100-80gb",
                memory_bytes=81920 * _MIB,
                hbm_bandwidth=2.039e12,
                peak_flops=312e12,
                interconnect_bandwidth=300e9,
            ),
            # H100 SXM5: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 (1,979 is with sparsity),
            # NVLink4 900 GB/s total.
            GPUSpec(
                name="h100-sxm",
                memory_bytes=81559 * _MIB,
                hbm_bandwidth=3.35e12,
                peak_flops=989e12,
                interconnect_bandwidth=450e9,
            ),
            # H200 SXM: 141 GB HBM3e at 4.8 TB/s; same compute and NVLink as H100 SXM.
            GPUSpec(
                name="h200",
                memory_bytes=143771 * _MIB,
                hbm_bandwidth=4.8e12,
                peak_flops=989e12,
                interconnect_bandwidth=450e9,
            ),
            # L4: 24 GB GDDR6 at 300 GB/s, 121 TFLOP/s dense bf16 (242 with sparsity),
            # no NVLink: PCIe Gen4 x16, 64 GB/s total.
            GPUSpec(
                name="l4",
                memory_bytes=23034 * _MIB,
                hbm_bandwidth=300e9,
                peak_flops=121e12,
                interconnect_bandwidth=32e9,
            ),
            # L40S: 48 GB GDDR6 at 864 GB/s, 362 TFLOP/s dense bf16 (733 with sparsity; the
            # 181 / 362 pair is the L40's), no NVLink: PCIe Gen4 x16, 64 GB/s total.
            GPUSpec(
                name="l40s",
                memory_bytes=46068 * _MIB,
                hbm_bandwidth=864e9,
                peak_flops=362.05e12,
                interconnect_bandwidth=32e9,
            ),
        )
    }
)

_GPU_FIELDS = ("name", "memory_bytes", "hbm_bandwidth", "peak_flops", "interconnect_bandwidth")


def load_gpu_spec(path: str | Path) -> GPUSpec:
    """Read a GPUSpec from a JSON object with exactly the GPUSpec fields (no others)."""
    source = str(path)
    data = read_json_object(path)
    check_keys(data, allowed=_GPU_FIELDS, required=_GPU_FIELDS, source=source)
    # Check here (not only in __post_init__) so the message names the file.
    return GPUSpec(
        name=nonempty_str(data["name"], "name", source),
        memory_bytes=positive_int(data["memory_bytes"], "memory_bytes", source),
        hbm_bandwidth=positive_float(data["hbm_bandwidth"], "hbm_bandwidth", source),
        peak_flops=positive_float(data["peak_flops"], "peak_flops", source),
        interconnect_bandwidth=positive_float(
            data["interconnect_bandwidth"], "interconnect_bandwidth", source
        ),
    )


def resolve_gpu(name_or_path: str | Path) -> GPUSpec:
    """A preset name (``a100-80gb``) or a path to a GPU spec JSON file."""
    key = str(name_or_path)
    if key in GPU_PRESETS:
        return GPU_PRESETS[key]
    if path_exists(name_or_path):
        return load_gpu_spec(name_or_path)
    presets = ", ".join(GPU_PRESETS)
    raise CostModelError(f"unknown gpu {shown(key)}: not a preset ({presets}) and no such file")
