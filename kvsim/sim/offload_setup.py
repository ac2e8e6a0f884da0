"""What a run with a KV offload tier builds (docs/offload.md): the engine's OffloadConfig from
the run's plan (kvsim.config.offload_plan: vLLM's tier sizing) and the worker that times its
transfers on the tier's link."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.offload.connector import OffloadConfig
from engine.offload.transfer import make_transfer_link
from engine.offload.worker import OffloadWorker
from kvsim.config import RunConfig, offload_plan
from kvsim.costmodel import CostModel
from kvsim.costmodel.offload import OffloadPlan
from kvsim.option_spec import ConfigError


@dataclass(frozen=True, slots=True)
class OffloadSetup:
    """A run's CPU tier: ``plan`` (sizes, link) and the engine config built from it."""

    plan: OffloadPlan
    engine_config: OffloadConfig

    def worker(self) -> OffloadWorker:
        """A fresh worker on a fresh link (one per simulation; the compiled link when the
        extension is built, same times bit for bit)."""
        link = self.plan.link
        return OffloadWorker(
            make_transfer_link(link.read_bytes_per_s, link.write_bytes_per_s, link.latency_s),
            self.plan.gpu_block_transfer_bytes,
        )

    def describe(self) -> dict[str, Any]:
        """The plan as config.json's resolved section shows it."""
        return dataclasses.asdict(self.plan)


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
    engine_config = OffloadConfig(
        num_chunks=plan.num_chunks, blocks_per_chunk=plan.blocks_per_chunk, policy=plan.policy
    )
    return OffloadSetup(plan, engine_config)
