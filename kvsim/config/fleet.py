"""RunConfig's fleet options: replicas and their router, prefill/decode disaggregation
(kvsim/fleet, docs/fleet.md)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.config.types import (
    MAX_REPLICAS,
    ROUTER_NAMES,
    FleetEvents,
)
from kvsim.option_spec import (
    MAX_TOKENS,
    above,
    at_least,
    not_empty,
    one_of,
    option,
    parse_pd,
    parse_router_weights,
)


@dataclass(frozen=True, kw_only=True)
class FleetOptions:
    """RunConfig's fleet options (kvsim/config/run_config.py puts the groups together in this
    order; each field is defined once, here)."""

    # a fleet (kvsim/fleet, docs/fleet.md)
    replicas: int = option(
        1,
        help="Fleet: this many replicas of the engine, each with its own KV pool, behind --router",
        unit="N",
        sweep="axis",
        sweep_help="Fleet sizes to sweep, e.g. 1,2,4,8 (comma-separated)",
        check=at_least(1, maximum=MAX_REPLICAS),
    )
    router: str = option(
        "round-robin",
        help="Fleet: which replica each request goes to: "
        + ", ".join(ROUTER_NAMES)
        + " (docs/fleet.md gives each formula and its source)",
        unit="NAME",
        sweep="axis",
        sweep_help="Routers to sweep, e.g. round-robin,prefix,kv-router (comma-separated)",
        check=one_of(*ROUTER_NAMES),
    )
    router_weights: str = option(
        "2:1:1",
        help="Fleet, --router prefix: the weights of llm-d's prefix-cache, queue and "
        "KV-utilisation scorers",
        unit="PREFIX:QUEUE:KV",
        sweep="param",
        check=lambda name, value: parse_router_weights(value) and None,
    )
    router_event_delay_s: float = option(
        0.05,
        help="Fleet: how late a prefix-aware router learns of a replica's KV events",
        unit="SECONDS",
        flag="--router-event-delay",
        sweep="param",
        check=at_least(0, maximum=2.0**32),
    )
    router_speculative_ttl_s: float = option(
        0.0,
        help="Fleet, --router prefix: llm-d's speculative indexing: a routed prompt's blocks "
        "count as held by its replica for this long, before its KV events confirm them (0: "
        "off, as llm-d's scorer defaults; llm-d's precise prefix-cache guide turns it on with "
        "a 2 s TTL)",
        unit="SECONDS",
        flag="--router-speculative-ttl",
        sweep="param",
        check=at_least(0, maximum=3600.0),
        omit_default=True,
    )
    router_oracle: bool = option(
        False,
        help="Fleet: a prefix-aware router reads the replicas' caches directly instead of their "
        "KV events (what stale events cost, by comparison)",
        sweep="param",
    )
    fleet_events: FleetEvents = option(
        "routing",
        help="Fleet: events.parquet holds the routing decisions (ROUTE events; routing) or "
        "also every replica's own events (all: as many rows as the replicas' one-replica "
        "runs together, and their time to write)",
        unit="WHAT",
        sweep="no",
        omit_default=True,
    )
    # prefill/decode disaggregation (kvsim/fleet/pd.py, docs/fleet.md)
    pd: str | None = option(
        None,
        help="Fleet: P prefill and D decode replicas (vLLM's NIXL connector, llm-d's "
        "decider); --router picks in each pool",
        unit="P:D",
        default_text="off",
        sweep="param",
        check=lambda name, value: parse_pd(value) and None,
        omit_default=True,
    )
    pd_threshold: int = option(
        16,
        help="P/D: disaggregate only when the decode replica's uncached prompt is at least "
        "this many tokens (llm-d's nonCachedTokens), else it runs the whole request",
        unit="TOKENS",
        sweep="param",
        check=at_least(0, maximum=MAX_TOKENS),
        omit_default=True,
    )
    pd_link_gbps: float = option(
        25.0,
        help="P/D: each decode replica's network bandwidth for pulling KV, shared by its "
        "concurrent pulls (per GPU: 200 Gb/s RDMA NIC = 25 GB/s)",
        unit="GB/S",
        sweep="param",
        check=above(0, maximum=1e6),
        omit_default=True,
    )
    pd_link_latency_us: float = option(
        50.0,
        help="P/D: a pull's latency before its first byte moves",
        unit="MICROSECONDS",
        sweep="param",
        check=at_least(0, maximum=1e9),
        omit_default=True,
    )
    pd_prefill_gpu: str | None = option(
        None,
        help="P/D: the prefill replicas' GPU preset or spec file (their pool and step times)",
        unit="NAME|PATH",
        default_text="--gpu",
        sweep="param",
        check=not_empty,
        omit_default=True,
    )
    pd_prefill_tp: int | None = option(
        None,
        help="P/D: the prefill replicas' tensor-parallel GPUs",
        unit="GPUS",
        default_text="--tp",
        sweep="param",
        check=at_least(1, maximum=4096),
        omit_default=True,
    )
    pd_decode_gpu: str | None = option(
        None,
        help="P/D: the decode replicas' GPU preset or spec file (their pool and step times)",
        unit="NAME|PATH",
        default_text="--gpu",
        sweep="param",
        check=not_empty,
        omit_default=True,
    )
    pd_decode_tp: int | None = option(
        None,
        help="P/D: the decode replicas' tensor-parallel GPUs (vLLM's NIXL connector pulls "
        "between TP sizes of which one divides the other)",
        unit="GPUS",
        default_text="--tp",
        sweep="param",
        check=at_least(1, maximum=4096),
        omit_default=True,
    )
