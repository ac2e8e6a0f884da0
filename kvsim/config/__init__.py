"""RunConfig: every option of one simulation, resolved and serialisable.

A run folder's config.json is ``RunConfig.to_dict()``; ``kvsim run --config config.json``
rebuilds the same config, so a cost-mode run can be repeated exactly (an engine-mode run
measures wall time: it repeats the requests and options, not the times, nor so the exact steps).

The options come in groups, one module each, every field defined once there with its type,
default, help text and unit (``option(...)`` metadata): serving.py (trace, model, hardware, KV
pool, scheduler limits), workload.py (arrivals), fleet.py (replicas, router, P/D), offload.py
(KV offload tiers); run_config.py joins them into RunConfig (with the allocator and the
engine-mode options) and refuses contradicting options (its rules); limits.py resolves vLLM's
batch-limit defaults. The ``kvsim run`` and ``kvsim sweep`` options (kvsim/commands/options.py),
the sweep's reproduce command and docs/options.md are all derived from these definitions, so
adding an option means adding a field to its group, and its behaviour where it acts.
"""

from kvsim.config.limits import CLASSIC_LIMITS, SchedulingLimits, scheduling_limits
from kvsim.config.run_config import RunConfig, offload_plan, option_specs, pd_pool_tps
from kvsim.config.types import (
    ALLOCATORS,
    DEFAULT_THREADS,
    MAX_CONFIG_BYTES,
    MAX_OFFLOAD_GIB,
    MAX_REPLICAS,
    MODES,
    ROUTER_NAMES,
)

__all__ = [
    "ALLOCATORS",
    "CLASSIC_LIMITS",
    "DEFAULT_THREADS",
    "MAX_CONFIG_BYTES",
    "MAX_OFFLOAD_GIB",
    "MAX_REPLICAS",
    "MODES",
    "ROUTER_NAMES",
    "RunConfig",
    "SchedulingLimits",
    "offload_plan",
    "option_specs",
    "pd_pool_tps",
    "scheduling_limits",
]
