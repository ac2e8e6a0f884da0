"""RunConfig's KV offload options: the CPU tier and the tiers behind it (docs/offload.md)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.config.types import (
    MAX_OFFLOAD_GIB,
    OffloadPolicy,
)
from kvsim.costmodel.offload import (
    LINK_PRESETS,
    parse_tier_specs,
)
from kvsim.costmodel.specio import CostModelError
from kvsim.option_spec import (
    MAX_BLOCK_SIZE,
    ConfigError,
    above,
    at_least,
    one_of,
    option,
)


def _check_tiers(value: str) -> None:
    try:
        parse_tier_specs(value)
    except CostModelError as e:
        raise ConfigError(str(e)) from None


@dataclass(frozen=True, kw_only=True)
class OffloadOptions:
    """RunConfig's offload options (kvsim/config/run_config.py puts the groups together in this
    order; each field is defined once, here)."""

    # KV offload tiers (docs/offload.md): vLLM's native OffloadingConnector with a CPU tier
    kv_offloading_size: float = option(
        0.0,
        help="KV offload: the CPU tier's size behind the GPU prefix cache, as vLLM's "
        "--kv-offloading-size (0: no offload)",
        unit="GiB",
        default_text="0 (off)",
        sweep="param",
        check=at_least(0, maximum=MAX_OFFLOAD_GIB),
        omit_default=True,
    )
    kv_offload_policy: OffloadPolicy = option(
        "lru",
        help="KV offload: which CPU chunk to evict, lru or arc (vLLM's extra_config "
        "eviction_policy)",
        unit="POLICY",
        sweep="param",
        omit_default=True,
    )
    kv_offload_block_size: int | None = option(
        None,
        help="KV offload: tokens per offloaded chunk, a multiple of --block-size (vLLM's "
        "extra_config block_size)",
        unit="TOKENS",
        default_text="--block-size",
        sweep="param",
        check=at_least(1, maximum=MAX_BLOCK_SIZE),
        omit_default=True,
    )
    kv_offload_link: str | None = option(
        None,
        help="KV offload: the CPU tier's link: "
        + ", ".join(LINK_PRESETS)
        + " (docs/offload.md gives each one's numbers and sources)",
        unit="PRESET",
        default_text="the GPU's host link (pcie4-host on A100 and L4, pcie5-host on H100, "
        "H200 and GPU spec files)",
        sweep="param",
        check=one_of(*LINK_PRESETS),
        omit_default=True,
    )
    kv_offload_read_gbps: float | None = option(
        None,
        help="KV offload: the link's tier -> GPU (load) bandwidth, replacing the preset's",
        unit="GB/S",
        default_text="the link preset's",
        sweep="param",
        check=above(0, maximum=1e6),
        omit_default=True,
    )
    kv_offload_write_gbps: float | None = option(
        None,
        help="KV offload: the link's GPU -> tier (store) bandwidth, replacing the preset's",
        unit="GB/S",
        default_text="the link preset's",
        sweep="param",
        check=above(0, maximum=1e6),
        omit_default=True,
    )
    kv_offload_latency_us: float | None = option(
        None,
        help="KV offload: the link's latency before a transfer moves its first byte, "
        "replacing the preset's",
        unit="MICROSECONDS",
        default_text="the link preset's",
        sweep="param",
        check=at_least(0, maximum=1e9),
        omit_default=True,
    )
    kv_offload_tier: str | None = option(
        None,
        help="KV offload: secondary tiers behind the CPU tier, a comma list of "
        "NAME:SIZE[:READ_GBPS:WRITE_GBPS:LATENCY_US] (presets disk: NVMe gen4, sata: SATA "
        "SSD; SIZE as 2TiB, 500GB), as vLLM's tiering spec's secondary_tiers",
        unit="NAME:SIZE",
        default_text="none",
        sweep="param",
        check=lambda name, value: _check_tiers(value),
        omit_default=True,
    )
