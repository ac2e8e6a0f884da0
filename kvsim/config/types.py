"""The value types, bounds and defaults RunConfig's option groups share."""

from __future__ import annotations

import typing
from typing import Literal

Mode = Literal["cost", "engine"]
Allocator = Literal["paged", "max", "pow2", "oracle"]  # kvsim.sim.allocators builds them
SchedulerName = Literal["v1", "classic"]
Policy = Literal["fcfs", "priority"]
OffloadPolicy = Literal["lru", "arc"]  # kvsim.costmodel.offload.OFFLOAD_POLICIES
FleetEvents = Literal["routing", "all"]  # what a fleet's events.parquet holds (docs/fleet.md)
MODES: tuple[str, ...] = typing.get_args(Mode)
ALLOCATORS: tuple[str, ...] = typing.get_args(Allocator)

MAX_CONFIG_BYTES = 1 << 24  # a run's config.json is a few KB
MAX_REPLICAS = 4096
MAX_OFFLOAD_GIB = 1 << 20  # GiB: a PiB of host memory or disk: beyond any one server
# kvsim.fleet.routers.ROUTERS's names (a test holds them equal; config imports no router code)
ROUTER_NAMES = ("round-robin", "random", "least-loaded", "prefix", "kv-router", "cache-aware")


# Engine mode's pinned torch threads: one thread is the setting other processes disturb least,
# and whose timings (and calibrated "cpu" coefficients) mean the same on any machine.
DEFAULT_THREADS = 1
