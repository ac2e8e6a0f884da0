"""A P/D fleet's two pools, each on its own GPU and TP (``--pd-prefill-gpu``,
``--pd-prefill-tp``, ``--pd-decode-gpu``, ``--pd-decode-tp``; docs/fleet.md): each pool's
memory plan (its KV blocks), batch limits and step-time model, and the bytes a pull moves per
token between them.

Bytes per token on a pull's busiest NIC (vLLM 0.33's NIXL connector,
``vllm/distributed/kv_transfer/kv_connector/v1/nixl/tp_mapping.py`` ``compute_tp_mapping``
and ``base_worker.py`` ``add_remote_agent``): every decode GPU reads exactly the KV heads it
holds. With decode TP >= prefill TP, ``D_TP / P_TP`` decode GPUs read their slices from one
prefill GPU, so that GPU's NIC sends ``D_TP / P_TP`` x the decode GPU's bytes (the prefill
GPU's own bytes, or more when the decode side replicates KV heads: each replica reads its
copy). With prefill TP > decode TP a decode GPU reads from several prefill GPUs (one per
distinct head, vLLM's GQA dedup) and its own NIC receives its bytes, the most any NIC moves.
kvsim models one link per decode replica at ``--pd-link-gbps`` (one GPU's NIC), so a pull
moves ``kv_bytes_per_token_per_gpu(decode TP) x max(1, D_TP / P_TP)`` bytes per token on it;
with equal TP that is one GPU's KV bytes per token, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kvsim.config import RunConfig, SchedulingLimits, pd_pool_tps
from kvsim.costmodel import CostModel, CostModelError
from kvsim.costmodel.sharding import shard_model
from kvsim.option_spec import ConfigError
from kvsim.sim.executor import Executor

Role = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class PDPool:
    """One pool's hardware and what it resolves to (blocks, limits, step-time model)."""

    role: Role
    config: RunConfig  # the run's options with this pool's GPU and TP as --gpu and --tp
    cost_model: CostModel
    limits: SchedulingLimits
    num_blocks: int
    memory_plan: dict[str, Any]
    executor_factory: Callable[[], Executor]  # kvsim.runner.build_executor of the pool

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """Bytes of KV one of the pool's GPUs holds per token (its KV heads' shard)."""
        return shard_model(self.cost_model.model, self.config.tp).kv_bytes_per_token_per_gpu

    def make_executor(self) -> Executor:
        """A fresh step-time model for one replica of the pool."""
        return self.executor_factory()

    def describe(self) -> dict[str, Any]:
        """summary.json's ``fleet.pd.prefill`` / ``decode``: GPU, TP, KV pool, batch limits."""
        return {
            "gpu": self.cost_model.gpu.name,
            "tp": self.config.tp,
            "num_blocks": self.num_blocks,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            **dataclasses.asdict(self.limits),
        }


def pool_flags(config: RunConfig, role: Role) -> str:
    """The options that set ``role``'s pool apart from --gpu / --tp ('' when none)."""
    gpu = config.pd_prefill_gpu if role == "prefill" else config.pd_decode_gpu
    tp = config.pd_prefill_tp if role == "prefill" else config.pd_decode_tp
    flags = [f"--pd-{role}-gpu {gpu}"] if gpu is not None else []
    return " ".join([*flags, *([f"--pd-{role}-tp {tp}"] if tp is not None else [])])


def pool_config(config: RunConfig, role: Role) -> RunConfig:
    """``config`` with ``role``'s GPU and TP in --gpu and --tp."""
    gpu = config.pd_prefill_gpu if role == "prefill" else config.pd_decode_gpu
    tp = pd_pool_tps(config)[0 if role == "prefill" else 1]
    return dataclasses.replace(config, gpu=config.gpu if gpu is None else gpu, tp=tp)


# How a pool is planned, given its config (the run's with the pool's --gpu and --tp), the
# run's max_model_len and the warnings list: (cost model, batch limits, KV blocks, memory plan,
# executor factory). kvsim.runner plans it as a one-replica run (kvsim.runner.plan_pd_pool).
PlanPool = Callable[
    [RunConfig, int | None, list[str]],
    tuple[CostModel, SchedulingLimits, int, dict[str, Any], Callable[[], Executor]],
]


def resolve_pool(
    config: RunConfig,
    role: Role,
    max_model_len: int | None,
    warnings: list[str],
    plan_pool: PlanPool,
) -> PDPool:
    """``role``'s pool, planned by ``plan_pool`` on its GPU and TP. A model that does not fit
    there (or a TP it cannot split into) is a ConfigError naming the pool's options."""
    flags = pool_flags(config, role)
    pool = pool_config(config, role)
    try:
        planned = plan_pool(pool, max_model_len, warnings)
    except (CostModelError, ConfigError) as exc:
        if not flags:
            raise
        # the plan's advice names --tp: here the pool's own option sets it
        text = str(exc).replace("--tp ", f"--pd-{role}-tp ")
        raise ConfigError(f"{flags} ({role} pool): {text}") from exc
    return PDPool(role, pool, *planned)


def resolve_pools(
    config: RunConfig, max_model_len: int | None, warnings: list[str], plan_pool: PlanPool
) -> tuple[PDPool, PDPool]:
    """(prefill pool, decode pool) of ``config.pd``'s fleet; a warning both pools give (the
    same --num-blocks what-if on the same GPU) is said once."""
    pools, said = [], len(warnings)
    roles: tuple[Role, Role] = ("prefill", "decode")
    for role in roles:
        mine: list[str] = []
        pools.append(resolve_pool(config, role, max_model_len, mine, plan_pool))
        warnings.extend(w for w in mine if w not in warnings[said:])
    return pools[0], pools[1]


def pull_bytes_per_token(prefill: PDPool, decode: PDPool) -> float:
    """Bytes per pulled token on the busiest NIC of a pull (module docstring)."""
    ratio = max(1, decode.config.tp // prefill.config.tp)
    return float(decode.kv_bytes_per_token_per_gpu * ratio)
