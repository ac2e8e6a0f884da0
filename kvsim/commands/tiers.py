"""``kvsim cache-curve TRACE --tiers gpu:CAPS,cpu:CAPS``: the two-tier (GPU + CPU) cache curve.

Parses the tier spec, converts each capacity to blocks (tokens, blocks or bytes at the model's
KV bytes per block), hands off to kvsim.analysis.tier_curve and kvsim.outputs.tier_folder, and
prints the table and the hit rates at the marked pool / --kv-offloading-size. Errors are
TierSpecError (a KvsimError): kvsim.commands.cache_curve turns them into one line, exit 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich import box
from rich.table import Table

from kvsim.commands.console import console, say
from kvsim.errors import KvsimError

TIERS = ("gpu", "cpu")
GIB = 1 << 30
PAGE_BYTES = 4096  # vLLM rounds a CPU chunk up to mmap.PAGESIZE (SharedOffloadRegion)
_BYTE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
}
_CAPACITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)")


class TierSpecError(KvsimError):
    """A bad ``--tiers`` spec or tier capacity."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """One capacity as spelled: ``value`` in ``unit`` (tokens, blocks or bytes); inf allowed."""

    spelled: str
    value: float
    unit: str  # "tokens", "blocks" or "bytes"

    def blocks(self, block_size: int, bytes_per_block: float) -> float:
        """Whole blocks (chunks) this capacity holds: tokens // block_size, bytes //
        bytes_per_block; ``inf`` stays unlimited."""
        if math.isinf(self.value):
            return math.inf
        per = {"tokens": block_size, "blocks": 1, "bytes": bytes_per_block}[self.unit]
        return float(math.floor(self.value / per))


def parse_capacity(text: str, tier: str) -> Capacity:
    """``480000`` (tokens), ``30000blocks``, ``64GiB`` / ``500MB`` (bytes), ``0`` or ``inf``."""
    spelled = text.strip()
    if spelled.lower() == "inf":
        return Capacity(spelled, math.inf, "tokens")
    match = _CAPACITY.fullmatch(spelled)
    unit = match.group(2) if match else ""
    if match is None or (unit and unit not in _BYTE_UNITS and unit not in ("blocks", "tokens")):
        raise TierSpecError(
            f"--tiers: {tier} capacity {spelled!r} is not a number of tokens, N blocks, a size "
            "in bytes (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB) or inf"
        )
    value = float(match.group(1))
    if math.isinf(value):
        raise TierSpecError(f"--tiers: {tier} capacity {spelled} is too large (write inf)")
    if value < 0:
        raise TierSpecError(f"--tiers: {tier} capacity must be >= 0, got {spelled}")
    if unit in _BYTE_UNITS:
        return Capacity(spelled, value * _BYTE_UNITS[unit], "bytes")
    return Capacity(spelled, value, unit or "tokens")


def parse_tiers(text: str) -> dict[str, list[Capacity]]:
    """``gpu:1e5,480000,cpu:0,16GiB,64GiB`` as each tier's capacities: an item ``NAME:VALUE``
    starts a tier, the items after it are more of its capacities. Both tiers, each once."""
    tiers: dict[str, list[Capacity]] = {}
    current = None
    for item in text.split(","):
        if ":" in item:
            name, _, item = item.partition(":")
            current = name.strip().lower()
            if current not in TIERS:
                raise TierSpecError(
                    f"--tiers: unknown tier {name.strip()!r}: the tiers are gpu and cpu "
                    "(e.g. gpu:1e5,1e6,cpu:0,64GiB)"
                )
            if current in tiers:
                raise TierSpecError(f"--tiers: tier {current} is given twice")
            tiers[current] = []
        if current is None:
            raise TierSpecError(
                f"--tiers: {item.strip()!r} names no tier; write gpu:CAPS,cpu:CAPS "
                "(e.g. gpu:1e5,1e6,cpu:0,64GiB)"
            )
        if not item.strip():
            raise TierSpecError(f"--tiers: an empty {current} capacity (stray comma?)")
        tiers[current].append(parse_capacity(item, current))
    missing = [name for name in TIERS if name not in tiers]
    if missing:
        raise TierSpecError(
            f"--tiers: no {missing[0]} tier; write gpu:CAPS,cpu:CAPS (e.g. gpu:1e5,1e6,cpu:0,64GiB)"
        )
    return tiers


@dataclass(frozen=True, slots=True)
class KvBytes:
    """Bytes of one GPU block and of one CPU chunk (one GPU block's KV on every tp rank,
    rounded up to a 4 KiB page as vLLM's CPUOffloadingSpec sizes its chunks)."""

    gpu_block: int
    cpu_chunk: int
    label: str

    @classmethod
    def of(cls, model: str, tp: int, block_size: int) -> KvBytes:
        from kvsim.costmodel import resolve_model, shard_model

        spec = resolve_model(model)
        block = block_size * shard_model(spec, tp).kv_bytes_per_token_per_gpu * tp
        chunk = -(-block // PAGE_BYTES) * PAGE_BYTES
        return cls(block, chunk, spec.name if tp == 1 else f"{spec.name}, tp {tp}")


def cpu_chunks_of_size(size_gib: float, kv: KvBytes) -> int:
    """vLLM's num_chunks for ``--kv-offloading-size`` GiB: cpu_bytes // aligned chunk bytes."""
    return int(size_gib * GIB) // kv.cpu_chunk


def _check_distinct(tier: str, asked: list[Capacity], blocks: list[float]) -> None:
    """Refuse two capacities of one tier that hold the same number of blocks."""
    seen: dict[float, str] = {}
    for capacity, count in zip(asked, blocks):
        if count in seen:
            raise TierSpecError(
                f"--tiers: {tier} capacities {seen[count]} and {capacity.spelled} are both "
                f"{count:,.0f} blocks; give each once"
            )
        seen[count] = capacity.spelled


def _percent(rate: float) -> str:
    return f"{100 * rate:.2f}%"


def _table(title: str, rates: np.ndarray, gpu: list[Capacity], cpu: list[Capacity]) -> Table:
    """One GPU x CPU table of hit rates (``rates``: a GPU x CPU array of shares)."""
    table = Table(title=f"{title} (%)", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("GPU \\ CPU", justify="right", no_wrap=True)
    for capacity in cpu:
        table.add_column(capacity.spelled, justify="right")
    for i, capacity in enumerate(gpu):
        table.add_row(
            capacity.spelled,
            *(f"{100 * rates[i, j]:.2f}" for j in range(len(cpu))),
        )
    return table


def run_tiers(
    *,
    trace: str,
    spec: str,
    block_size: int | None,
    model: str,
    tp: int,
    num_blocks: int | None,
    plan_pool: Callable[[int], tuple[int, str]],
    offload_gib: float | None,
    out: Path | None,
    force: bool,
) -> None:
    """The ``--tiers`` branch of ``kvsim cache-curve`` (raises KvsimError / WorkloadError /
    OSError; the caller turns them into one line). ``plan_pool(block_size)``: the planned KV
    pool's capacity (tokens) and label, used unless ``num_blocks`` gives the pool."""
    from kvsim.analysis.prefix_blocks import PrefixBlocksError
    from kvsim.analysis.tier_curve import replay_tiers, tier_curve, tier_rows
    from kvsim.outputs.tier_folder import check_out_folder, write_tier_folder
    from workloads import load_trace, resolve_trace

    tiers = parse_tiers(spec)
    if offload_gib is not None and not (offload_gib >= 0 and math.isfinite(offload_gib)):
        raise TierSpecError(f"--kv-offloading-size must be >= 0 GiB, got {offload_gib}")
    if out is not None:
        check_out_folder(out, force=force)
    loaded = load_trace(resolve_trace(trace))
    b = block_size if block_size is not None else (loaded.hash_block_size or 1)
    if b < 1:
        raise PrefixBlocksError(f"block size must be a positive integer, got {b!r}")
    kv = KvBytes.of(model, tp, b)
    gpu_blocks = [c.blocks(b, kv.gpu_block) for c in tiers["gpu"]]
    cpu_blocks = [c.blocks(b, kv.cpu_chunk) for c in tiers["cpu"]]
    for name, blocks in (("gpu", gpu_blocks), ("cpu", cpu_blocks)):
        _check_distinct(name, tiers[name], blocks)
    curve = tier_curve(loaded, gpu_blocks, cpu_blocks, block_size)  # no hash_ids: it says so
    if num_blocks is not None:
        pool_blocks, pool_label = num_blocks, "GPU pool (--num-blocks)"
    else:
        pool_tokens, pool_label = plan_pool(b)
        pool_blocks = pool_tokens // b
    cpu_mark = None if not offload_gib else cpu_chunks_of_size(offload_gib, kv)
    cpu_label = f"CPU tier of {offload_gib:g} GiB" if offload_gib else ""
    marks = {
        "gpu_mark": (pool_blocks, f"{pool_label}: {pool_blocks:,} blocks"),
        "cpu_mark": None if cpu_mark is None else (cpu_mark, f"{cpu_label}: {cpu_mark:,} chunks"),
    }
    if out is not None:
        write_tier_folder(
            tier_rows(curve, kv.gpu_block, kv.cpu_chunk),
            out,
            gpu_labels=[c.spelled for c in tiers["gpu"]],
            cpu_labels=[c.spelled for c in tiers["cpu"]],
            **marks,
            title=f"Prefix-cache hit rate, GPU + CPU tier: {loaded.name}, {b}-token blocks",
            force=force,
        )
    for title, rates in (
        ("prefix-cache hit rate, GPU + CPU tier: LRU with vLLM's offload rules", curve.hit_rate()),
        ("optimal (Belady) for GPU + CPU blocks: no policy hits more", curve.optimal_hit_rate()),
    ):
        console.print(_table(title, rates, tiers["gpu"], tiers["cpu"]))
    console.print(
        f"{loaded.name}: {len(loaded):,} requests, {curve.query_tokens:,} prompt tokens, "
        f"{b}-token blocks; KV of {kv.label}: {kv.gpu_block:,} bytes a GPU block, "
        f"{kv.cpu_chunk:,} a CPU chunk",
        soft_wrap=True,
    )
    rate = b / curve.query_tokens  # hit rate of one block
    alone = curve.hits_at(pool_blocks, 0)
    console.print(
        f"{pool_label}: {pool_blocks:,} blocks ({pool_blocks * b:,} tokens) -> GPU only: "
        f"LRU {_percent(alone.total_blocks * rate)}, "
        f"optimal {_percent(curve.optimal_at(pool_blocks, 0) * rate)}",
        soft_wrap=True,
    )
    if cpu_mark is not None:
        both = curve.hits_at(pool_blocks, cpu_mark)
        replayed = replay_tiers(loaded, pool_blocks, cpu_mark, b)
        console.print(
            f"  + {cpu_label} ({cpu_mark:,} chunks): LRU {_percent(both.total_blocks * rate)} "
            f"(+{100 * (both.total_blocks - alone.total_blocks) * rate:.2f} points; replayed "
            f"with vLLM's store rule: {_percent(replayed.total_blocks * rate)}), "
            f"optimal {_percent(curve.optimal_at(pool_blocks, cpu_mark) * rate)}",
            soft_wrap=True,
        )
    if out is not None:
        say("wrote ", out / "tiers.csv", " and ", out / "tiers.png")
