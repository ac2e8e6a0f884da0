"""What a run with a KV offload tier builds (docs/offload.md): the engine's OffloadConfig from
the run's plan (kvsim.config.offload_plan: vLLM's tier sizing) and the worker that times its
transfers on the tier's link."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.offload.transfer import make_transfer_link
from engine.offload.worker import OffloadWorker
from kvsim.config import RunConfig, offload_plan
from kvsim.costmodel import CostModel
from kvsim.costmodel.offload import (
    OffloadPlan,
    SecondaryTierPlan,
    parse_tier_specs,
    plan_secondary_tiers,
)
from kvsim.option_spec import ConfigError

if TYPE_CHECKING:
    from engine.offload.connector import OffloadConfig


@dataclass(frozen=True, slots=True)
class OffloadSetup:
    """A run's CPU tier: ``plan`` (sizes, link) and the engine config built from it;
    ``tiers``: the secondary tiers behind it (--kv-offload-tier), none by default."""

    plan: OffloadPlan
    engine_config: OffloadConfig
    tiers: tuple[SecondaryTierPlan, ...] = ()

    def worker(self) -> OffloadWorker:
        """A fresh worker on a fresh link (one per simulation; the compiled link when the
        extension is built, same times bit for bit)."""
        link = self.plan.link
        return OffloadWorker(
            make_transfer_link(link.read_bytes_per_s, link.write_bytes_per_s, link.latency_s),
            self.plan.gpu_block_transfer_bytes,
        )

    def describe(self) -> dict[str, Any]:
        """The plan as config.json's resolved section shows it (secondary tiers only when
        there are some: a CPU-only run's config.json is unchanged)."""
        out = dataclasses.asdict(self.plan)
        if self.tiers:
            out["secondary_tiers"] = [dataclasses.asdict(t) for t in self.tiers]
        return out


def build_offload(config: RunConfig, cost_model: CostModel) -> OffloadSetup | None:
    """The run's tier, or None without ``--kv-offloading-size``. Offloading runs on the
    readable v1 scheduler in cost mode, one replica."""
    plan = offload_plan(config, cost_model.model, cost_model.gpu.name)
    if plan is None:
        return None
    if config.resolved_scheduler() != "v1":
        raise ConfigError("--kv-offloading-size needs --scheduler v1 (vLLM's offloading connector)")
    if config.replicas > 1:
        raise ConfigError("--kv-offloading-size is not supported with --replicas > 1 yet")
    # imported here, as the scheduler that takes them (engine.factory): a run without a CPU
    # tier never loads the tier's connector, manager, policies or secondary tiers
    from engine.offload.connector import OffloadConfig
    from engine.offload.secondary_tier import SecondaryTierConfig

    if config.kv_offload_tier is None:
        engine_config = OffloadConfig(
            num_chunks=plan.num_chunks, blocks_per_chunk=plan.blocks_per_chunk, policy=plan.policy
        )
        return OffloadSetup(plan, engine_config)
    tiers = plan_secondary_tiers(parse_tier_specs(config.kv_offload_tier), plan.chunk_bytes)
    engine_config = OffloadConfig(
        num_chunks=plan.num_chunks,
        blocks_per_chunk=plan.blocks_per_chunk,
        policy=plan.policy,
        secondary_tiers=tuple(
            SecondaryTierConfig(
                t.name,
                t.num_chunks,
                t.chunk_bytes,
                t.read_bytes_per_s,
                t.write_bytes_per_s,
                t.latency_s,
            )
            for t in tiers
        ),
    )
    return OffloadSetup(plan, engine_config, tiers)
