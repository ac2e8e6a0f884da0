"""KV offload tiers for the cost model: link presets (bandwidth and latency of the path between
the GPU and a tier) and the CPU tier's capacity in chunks, sized as vLLM 0.33 sizes it.

Units: bytes, bytes/s, seconds; the options say GiB, GB/s and microseconds. Every preset
number's source is in docs/offload.md ("Device presets"). Plain data, no numpy: kvsim.config
imports it for the option table, and the engine receives only the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.sharding import shard_model
from kvsim.costmodel.specio import CostModelError

GB = 1e9  # bytes: link bandwidths are decimal GB/s, as datasheets give them
GIB = 1 << 30  # bytes: --kv-offloading-size is GiB (vLLM: cpu_bytes_to_use = size x 2^30)
# vLLM rounds each CPU chunk up to a page (SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT =
# mmap.PAGESIZE): 4 KiB on x86-64 Linux, the host of every preset GPU but GH200 (whose
# kernels may use 64 KiB pages: plan_offload takes the alignment).
PAGE_BYTES = 4096
OFFLOAD_POLICIES = ("lru", "arc")  # vllm/v1/kv_offload/cpu/policies/{lru,arc}.py


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkPreset:
    """The path between the GPU and a tier, one direction each way.

    read_bytes_per_s: tier -> GPU (loads), bytes/s. write_bytes_per_s: GPU -> tier (stores),
    bytes/s. latency_s: the delay before a transfer moves its first byte, s.
    """

    name: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float
    what: str  # one line for the docs and --help


# Sources and reasoning per number: docs/offload.md "Device presets".
LINK_PRESETS: MappingProxyType[str, LinkPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            # PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per direction raw (A100's
            # datasheet: "PCIe Gen4: 64 GB/s" both ways); pinned copies reach about 25.
            LinkPreset(
                name="pcie4-host",
                read_bytes_per_s=25 * GB,
                write_bytes_per_s=25 * GB,
                latency_s=5e-6,
                what="host DRAM over PCIe 4.0 x16 (A100, L4)",
            ),
            # PCIe 5.0 x16: 63 GB/s per direction raw (H100's datasheet: "PCIe Gen5: 128 GB/s"
            # both ways); pinned copies reach about 50.
            LinkPreset(
                name="pcie5-host",
                read_bytes_per_s=50 * GB,
                write_bytes_per_s=50 * GB,
                latency_s=5e-6,
                what="host DRAM over PCIe 5.0 x16 (H100, H200)",
            ),
            # GH200: NVLink-C2C 900 GB/s between Grace and Hopper, 450 per direction.
            LinkPreset(
                name="nvlink-c2c",
                read_bytes_per_s=450 * GB,
                write_bytes_per_s=450 * GB,
                latency_s=5e-6,
                what="Grace LPDDR5X over NVLink-C2C (GH200 Grace Hopper)",
            ),
            # PCIe 4.0 x4 NVMe: Samsung 980 PRO 7,000 / 5,000 MB/s sequential; ~80 us QD1 read.
            LinkPreset(
                name="nvme-gen4",
                read_bytes_per_s=7 * GB,
                write_bytes_per_s=5 * GB,
                latency_s=80e-6,
                what="a PCIe 4.0 NVMe SSD (Samsung 980 PRO class)",
            ),
            # SATA III: 6 Gb/s, 8b/10b = 600 MB/s; Samsung 870 EVO 560 / 530 MB/s sequential.
            LinkPreset(
                name="sata-ssd",
                read_bytes_per_s=0.55 * GB,
                write_bytes_per_s=0.53 * GB,
                latency_s=100e-6,
                what="a SATA SSD (Samsung 870 EVO class)",
            ),
        )
    }
)
# The host link of each GPU preset (kvsim.costmodel.gpuspec.GPU_PRESETS); a GPU spec file
# whose name is none of these gets DEFAULT_LINK.
GPU_HOST_LINKS = MappingProxyType(
    {
        "a100-40gb": "pcie4-host",
        "a100-80gb": "pcie4-host",
        "l4": "pcie4-host",
        "l40s": "pcie4-host",
        "h100-sxm": "pcie5-host",
        "h200": "pcie5-host",
    }
)
DEFAULT_LINK = "pcie5-host"


def default_link(gpu_name: str) -> str:
    """The CPU tier's link preset for the GPU named ``gpu_name``: its host link."""
    return GPU_HOST_LINKS.get(gpu_name, DEFAULT_LINK)


@dataclass(frozen=True, slots=True)
class OffloadLink:
    """A resolved link: a preset with any of its numbers overridden (bytes/s, bytes/s, s)."""

    preset: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float


def resolve_link(
    preset: str | None,
    gpu_name: str,
    *,
    read_gbps: float | None = None,
    write_gbps: float | None = None,
    latency_us: float | None = None,
) -> OffloadLink:
    """``preset`` (default: ``gpu_name``'s host link) with the numbers given replacing its own
    (GB/s, GB/s, microseconds)."""
    name = preset if preset is not None else default_link(gpu_name)
    base = LINK_PRESETS.get(name)
    if base is None:
        raise CostModelError(
            f"kv_offload_link must be one of {', '.join(LINK_PRESETS)}, got {name!r}"
        )
    return OffloadLink(
        preset=name,
        read_bytes_per_s=base.read_bytes_per_s if read_gbps is None else read_gbps * GB,
        write_bytes_per_s=base.write_bytes_per_s if write_gbps is None else write_gbps * GB,
        latency_s=base.latency_s if latency_us is None else latency_us / 1e6,
    )


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """What the engine needs for a CPU tier (vLLM's CPUOffloadingSpec, one KV group).

    num_chunks: chunks the tier holds. blocks_per_chunk: GPU blocks per chunk (the offloaded
    block size / the GPU block size). chunk_bytes: one chunk's bytes in host memory, all
    tensor-parallel ranks, rounded up to a page. gpu_block_transfer_bytes: bytes one GPU moves
    per GPU block (its shard: each rank copies over its own link at the same time).
    """

    num_chunks: int
    blocks_per_chunk: int
    chunk_bytes: int
    gpu_block_transfer_bytes: int
    policy: str
    link: OffloadLink


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def plan_offload(
    model: ModelSpec,
    *,
    tp: int,
    gpu_block_size: int,
    size_gib: float,
    offload_block_size: int | None = None,
    policy: str = "lru",
    link: OffloadLink,
    alignment: int = PAGE_BYTES,
) -> OffloadPlan:
    """The CPU tier of ``size_gib`` GiB for ``model`` on ``tp`` GPUs, as vLLM 0.33 sizes it
    (vllm/v1/kv_offload/cpu/spec.py, CPUOffloadingSpec.__init__): a chunk is
    ``blocks_per_chunk`` GPU blocks of every rank (``num_copies = world_size``: the default
    layout is not replicated), rounded up to ``alignment`` bytes, and the tier holds
    ``floor(size_gib x 2^30 / that)`` chunks."""
    block_tokens = gpu_block_size if offload_block_size is None else offload_block_size
    if block_tokens % gpu_block_size:
        raise CostModelError(
            f"kv_offload_block_size {block_tokens} must be a multiple of the GPU block size "
            f"{gpu_block_size}"
        )
    if policy not in OFFLOAD_POLICIES:
        raise CostModelError(
            f"kv_offload_policy must be one of {', '.join(OFFLOAD_POLICIES)}, got {policy!r}"
        )
    blocks_per_chunk = block_tokens // gpu_block_size
    worker_block_bytes = gpu_block_size * shard_model(model, tp).kv_bytes_per_token_per_gpu
    chunk_bytes = round_up(worker_block_bytes * tp * blocks_per_chunk, alignment)
    # vLLM: int(cpu_bytes_to_use) // aligned_kv_bytes_per_chunk, cpu_bytes_to_use a float
    num_chunks = int(size_gib * GIB) // chunk_bytes
    if num_chunks < 1:
        raise CostModelError(
            f"kv_offloading_size {size_gib:g} GiB holds no chunk of {model.name} "
            f"({chunk_bytes:,} bytes each): give at least {chunk_bytes / GIB:.6g} GiB"
        )
    return OffloadPlan(
        num_chunks=num_chunks,
        blocks_per_chunk=blocks_per_chunk,
        chunk_bytes=chunk_bytes,
        gpu_block_transfer_bytes=worker_block_bytes,
        policy=policy,
        link=link,
    )


# --- secondary tiers (--kv-offload-tier NAME:SIZE[:READ_GBPS:WRITE_GBPS:LATENCY_US]) ----------

# A secondary tier's device: its link preset (LINK_PRESETS above, with the sources in
# docs/offload.md). Its transfers run between the tier and host memory (vLLM's secondary
# tiers read and write the CPU tier's memory, never the GPU's), so the drive is the link.
TIER_PRESETS = MappingProxyType({"disk": "nvme-gen4", "sata": "sata-ssd"})
TIER_OPTION = "--kv-offload-tier"
_SIZE_UNITS = {
    "": GIB,  # a bare number is GiB, as --kv-offloading-size
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": GIB,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
MAX_TIER_BYTES = 1 << 60  # an EiB: beyond any one server's disks


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One secondary tier as the user gave it: ``name``, ``size_bytes``, and its link
    (bytes/s tier -> CPU, bytes/s CPU -> tier, s)."""

    name: str
    size_bytes: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float


def _bad(spec: str, why: str) -> CostModelError:
    return CostModelError(
        f"{TIER_OPTION} {spec!r}: {why} (expected NAME:SIZE[:READ_GBPS:WRITE_GBPS:LATENCY_US], "
        f"e.g. disk:2TiB; NAME {' or '.join(TIER_PRESETS)}, or any name with all three numbers)"
    )


def _number(spec: str, text: str, what: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad(spec, f"{what} {text!r} is not a number") from None
    if not (0 <= value < float("inf")) or (positive and value == 0):
        raise _bad(spec, f"{what} must be {'> 0' if positive else '>= 0'}, got {text}")
    return value


def parse_size_bytes(spec: str, text: str) -> int:
    """``text`` ("2TiB", "500GB", "64": GiB) in bytes."""
    t = text.strip().lower()
    digits = t.rstrip("kmgtib")
    unit = t[len(digits) :]
    try:
        float(digits)
    except ValueError:
        digits = ""
    if unit not in _SIZE_UNITS or not digits:
        raise _bad(spec, f"size {text!r} is not a number with a unit (B, GiB, TiB, GB, TB...)")
    size = _number(spec, digits, "size", positive=True) * _SIZE_UNITS[unit]
    if size > MAX_TIER_BYTES:
        raise _bad(spec, f"size {text} is above an EiB")
    return int(size)


def parse_tier_specs(value: str) -> tuple[TierSpec, ...]:
    """The secondary tiers of ``--kv-offload-tier`` (a comma list, in lookup order: vLLM's
    ``secondary_tiers`` list)."""
    tiers: list[TierSpec] = []
    for spec in value.split(","):
        parts = spec.strip().split(":")
        if len(parts) not in (2, 5) or not parts[0]:
            raise _bad(spec, "give a name and a size, and either all three link numbers or none")
        name, size_text = parts[0], parts[1]
        size = parse_size_bytes(spec, size_text)
        if len(parts) == 5:
            read = _number(spec, parts[2], "READ_GBPS", positive=True) * GB
            write = _number(spec, parts[3], "WRITE_GBPS", positive=True) * GB
            latency = _number(spec, parts[4], "LATENCY_US", positive=False) / 1e6
        else:
            preset = TIER_PRESETS.get(name)
            if preset is None:
                raise _bad(spec, f"unknown tier {name!r} without link numbers")
            link = LINK_PRESETS[preset]
            read, write, latency = link.read_bytes_per_s, link.write_bytes_per_s, link.latency_s
        if name in (t.name for t in tiers) or name == "cpu":
            raise _bad(spec, f"tier name {name!r} is used twice")
        tiers.append(TierSpec(name, size, read, write, latency))
    return tuple(tiers)


@dataclass(frozen=True, slots=True)
class SecondaryTierPlan:
    """A secondary tier sized in CPU chunks: ``num_chunks`` of ``chunk_bytes`` (the CPU
    tier's page-aligned chunk: what vLLM's fs tier writes per key)."""

    name: str
    size_bytes: int
    num_chunks: int
    chunk_bytes: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float


def plan_secondary_tiers(
    specs: tuple[TierSpec, ...], chunk_bytes: int
) -> tuple[SecondaryTierPlan, ...]:
    """Each tier of ``specs`` holds ``size // chunk_bytes`` chunks (at least one)."""
    plans = []
    for s in specs:
        num_chunks = s.size_bytes // chunk_bytes
        if num_chunks < 1:
            raise CostModelError(
                f"{TIER_OPTION} {s.name}: {s.size_bytes:,} bytes hold no chunk of "
                f"{chunk_bytes:,} bytes"
            )
        plans.append(
            SecondaryTierPlan(
                s.name,
                s.size_bytes,
                num_chunks,
                chunk_bytes,
                s.read_bytes_per_s,
                s.write_bytes_per_s,
                s.latency_s,
            )
        )
    return tuple(plans)
