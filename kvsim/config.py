"""RunConfig: every option of one simulation, resolved and serialisable.

A run folder's config.json is ``RunConfig.to_dict()``; ``kvsim run --config config.json``
rebuilds the same config, so a cost-mode run can be repeated exactly (an engine-mode run
measures wall time: it repeats the requests and options, not the times, nor so the exact steps).

Each field's type is checked (JSON's types: no string for a number, no number for a flag) and
then its bounds (``option(check=...)``); contradicting options are refused by ``_RULES``.

Each field is defined once, here: its type, default, help text and unit (``option(...)``
metadata). The ``kvsim run`` and ``kvsim sweep`` options (kvsim/commands/options.py), the sweep's
reproduce command and docs/options.md are all derived from these definitions, so adding an
option means adding a field here, and its behaviour where it acts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvsim.costmodel.gpuspec import GPU_PRESETS, GPUSpec
from kvsim.costmodel.memory_plan import serving_batch_defaults
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.offload import (
    LINK_PRESETS,
    OffloadPlan,
    parse_tier_specs,
    plan_offload,
    resolve_link,
)
from kvsim.costmodel.specio import CostModelError
from kvsim.option_spec import (
    MAX_BLOCK_SIZE,
    MAX_CONCURRENCY,
    MAX_NUM_BLOCKS,
    MAX_SEED,
    MAX_TOKENS,
    ConfigError,
    OptionSpec,
    above,
    at_least,
    check_step_time,
    check_type,
    fraction,
    not_empty,
    one_of,
    option,
    parse_pd,
    parse_router_weights,
    shown,
)

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


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """One simulation. Units: tokens, blocks, seconds, requests per second."""

    trace: str = option(
        dataclasses.MISSING,
        help="Trace file (.json/.jsonl/.csv) or shipped trace name",
        run=False,
        sweep="no",
        check=not_empty,
    )
    mode: Mode = option(
        "cost",
        help="cost: step times from the cost model; engine: the torch engine runs every step",
        sweep="no",
    )
    model: str = option(
        "llama-2-7b",
        help="Model preset or a Hugging Face config.json path",
        unit="NAME|PATH",
        check=not_empty,
    )
    gpu: str = option(
        "a100-80gb",
        help=f"GPU preset ({', '.join(GPU_PRESETS)}) or a GPU spec JSON file",
        unit="NAME|PATH",
        check=not_empty,
    )
    tp: int = option(1, help="Tensor-parallel GPUs", unit="GPUS", check=at_least(1, maximum=4096))
    coefficients: str | None = option(
        None,
        help="Cost-model coefficient overrides (JSON file)",
        unit="FILE",
        path=True,
        default_text="none",
        check=not_empty,
    )
    step_time: str | None = option(
        None,
        help="Replace the cost model: linear:BASE_S:PER_TOKEN_S prices a step at BASE_S + "
        "PER_TOKEN_S x scheduled tokens (the clock of vLLM's reference scheduler driver)",
        unit="SPEC",
        default_text="the cost model",
        check=lambda name, value: check_step_time(value),
    )
    block_size: int = option(
        16,
        help="Tokens per KV block",
        unit="TOKENS",
        sweep="axis",
        sweep_help="Block sizes to sweep, e.g. 1,2,4,8,16,32,64,128,256",
        check=at_least(1, maximum=MAX_BLOCK_SIZE, why=" tokens (no context is that long)"),
    )
    num_blocks: int | None = option(
        None,
        help="KV blocks in the pool",
        unit="BLOCKS",
        default_text="planned from GPU memory",
        sweep_help="KV blocks (of the base block size, 16, when block sizes are swept: the "
        "slots are held)",
        check=at_least(1, maximum=MAX_NUM_BLOCKS),
    )
    gpu_memory_utilization: float = option(
        0.9,
        help="Share of GPU memory for weights, activations and KV",
        unit="FRACTION",
        check=fraction(low_open=True, high_open=False),
    )
    max_num_seqs: int | None = option(
        None,
        help="Most sequences in one batch",
        unit="SEQS",
        default_text="v1: vLLM 0.33's serving default for the GPU (1024 on H100/H200-class, "
        "256 on A100 and smaller), at most the token budget; classic: 256",
        check=at_least(1, maximum=MAX_TOKENS),
    )
    max_num_batched_tokens: int | None = option(
        None,
        help="Token budget of one step (classic: of one prefill step)",
        unit="TOKENS",
        default_text="v1: vLLM 0.33's serving default for the GPU (8192 on H100/H200-class, "
        "2048 on A100 and smaller), at least max_model_len without chunked prefill; "
        "classic: 8192",
        check=at_least(1, maximum=MAX_TOKENS),
    )
    max_model_len: int | None = option(
        None,
        help="Longest sequence, prompt + output",
        unit="TOKENS",
        default_text="the model's",
        check=at_least(1, maximum=MAX_TOKENS),
    )
    allow_long_max_model_len: bool = option(
        False,
        help="Accept --max-model-len beyond the model's context as a what-if (vLLM 0.33 "
        "refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
        omit_default=True,
    )
    watermark: float | None = option(
        None,
        help="Share of blocks kept free when admitting",
        unit="FRACTION",
        default_text="v1: 0 (vLLM 0.33); classic: 0.01",
        check=fraction(low_open=False, high_open=True),
    )
    scheduler: SchedulerName | None = option(
        None,
        help="v1: vLLM 0.33's scheduler (one token budget shared by decodes and prefill "
        "chunks, prefix caching, priorities); classic: vLLM's 2023 scheduler (a step is a "
        "prefill or a decode batch; the vLLM paper's figures)",
        default_text="v1; classic with a contiguous --allocator (the paper's comparison)",
    )
    enable_chunked_prefill: bool = option(
        True, help="v1: cut prefills into chunks that fit the step's token budget"
    )
    long_prefill_token_threshold: int = option(
        0,
        help="v1: cap one sequence's prefill chunk at this many tokens (0: no cap)",
        unit="TOKENS",
        check=at_least(0, maximum=MAX_TOKENS),
    )
    enable_prefix_caching: bool = option(
        True,
        help="v1: reuse cached full KV blocks across requests (a trace's hash_ids, else its "
        "session ids, say which prompts share a prefix: docs/formats.md)",
    )
    scheduling_policy: Policy = option(
        "fcfs",
        unit="POLICY",
        help="v1: fcfs (arrival order) or priority (the trace's priority, lower first)",
    )
    rate: float | None = option(
        None,
        help="Rescale arrivals to this mean rate",
        unit="REQ/S",
        default_text="the trace's",
        sweep="axis",
        sweep_help="Request rates to sweep (requests/s), e.g. 1,2,4,8",
        # faster, two arrivals fall within a microsecond, the resolution kvsim keeps times at
        check=above(0, maximum=1e6, why=" requests/s (arrivals a microsecond apart)"),
    )
    time_scale: float | None = option(
        None,
        help="Multiply arrival times by this factor",
        unit="FACTOR",
        default_text="1",
        check=above(0),
    )
    concurrency: int | None = option(
        None,
        help="Closed loop: this many users, one request each in flight",
        unit="USERS",
        default_text="open loop",
        check=at_least(1, maximum=MAX_CONCURRENCY),
    )
    think_time_s: float = option(
        0.0,
        help="Closed loop: mean think time between a user's requests",
        unit="SECONDS",
        flag="--think-time",
        check=at_least(0, maximum=2.0**32),
    )
    seed: int = option(
        0, help="Seed for every random choice", unit="INT", check=at_least(0, maximum=MAX_SEED)
    )
    until: float | None = option(
        None,
        help="Stop at this simulated time",
        unit="SECONDS",
        default_text="the end",
        check=above(0),
    )
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
    allocator: Allocator = option(
        "paged",
        help="KV allocator: paged (vLLM), or a contiguous baseline reserving max_model_len "
        "(max), prompt + next power of two of the output (pow2), or prompt + the exact "
        "output (oracle)",
        unit="NAME",
        sweep="axis",
        sweep_help="Allocators to sweep: paged, max, pow2, oracle (comma-separated)",
    )
    fast_decode: bool = option(
        True,
        help="FastDecodeScheduler in cost mode (results identical either way; False runs the "
        "plain Scheduler, for comparisons)",
        run=False,
        sweep="param",
    )
    # engine mode only
    device: str = option(
        "cpu",
        help="Engine mode: cpu or cuda (cuda:N for one of several GPUs)",
        unit="DEVICE",
        sweep="no",
        check=one_of("cpu", "cuda", pattern=r"cuda:\d{1,3}"),
    )
    dtype: str = option(
        "float32",
        help="Engine mode: float32, bfloat16 or float16",
        unit="DTYPE",
        sweep="no",
        check=one_of("float32", "bfloat16", "float16"),
    )
    threads: int | None = option(
        DEFAULT_THREADS,
        help="Engine mode: torch CPU threads, pinned (one inter-op thread); 1 keeps measured step "
        "times stable on a shared machine, raise it on a dedicated one; null in config.json: "
        "torch's choice (one per core: runs can differ 300x under contention)",
        unit="THREADS",
        sweep="no",
        check=at_least(1, maximum=4096),
    )

    def __post_init__(self) -> None:
        hints = _field_types()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            check_type(field.name, value, hints[field.name])
            check = field.metadata["option"].check
            if check is not None and value is not None:
                check(field.name, value)
        for rule in _RULES:
            problem = rule(self)
            if problem is not None:
                raise ConfigError(problem)

    def sets_pd_pools(self) -> bool:
        """Whether a P/D pool's own GPU or TP is given (--pd-prefill-gpu, ...)."""
        pools = (self.pd_prefill_gpu, self.pd_prefill_tp, self.pd_decode_gpu, self.pd_decode_tp)
        return any(v is not None for v in pools)

    def caches_prefixes(self) -> bool:
        """Whether the run caches prefixes (v1 only: classic never reuses a block)."""
        return self.resolved_scheduler() == "v1" and self.enable_prefix_caching

    def resolved_scheduler(self) -> str:
        """``scheduler``, or its default: v1, classic for a contiguous allocator."""
        if self.scheduler is not None:
            return self.scheduler
        return "v1" if self.allocator == "paged" else "classic"

    def to_dict(self) -> dict[str, Any]:
        """config.json's options: every field, less those marked ``omit_default`` at their
        default (a run without KV offload writes what it wrote before offload existed)."""
        data = dataclasses.asdict(self)
        for name, default in _OMITTED_AT_DEFAULT.items():
            if data[name] == default and type(data[name]) is type(default):
                del data[name]
        return data

    def offloads(self) -> bool:
        """Whether the run has a KV offload tier (--kv-offloading-size above 0)."""
        return self.kv_offloading_size > 0

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"{source}: unknown field {shown(unknown[0])}")
        if "trace" not in data:
            raise ConfigError(f"{source}: missing field 'trace'")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        """Read a run's config.json. The ``resolved`` section is ignored but for one thing: a
        trace file given by a relative path that does not exist from the current folder is
        read from ``resolved.trace_path_absolute``, where the run found it."""
        try:
            if path.exists() and not path.is_file():  # a FIFO would block, a device not end
                raise ConfigError(f"{path}: not a regular file; give a run folder's config.json")
            if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
                raise ConfigError(f"{path}: not a config.json (over {MAX_CONFIG_BYTES:,} bytes)")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            if isinstance(exc, ConfigError):
                raise
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise ConfigError(f"{path}: cannot read config: {reason}") from None
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
            raise ConfigError(f"{path}: expected an object with an 'options' object")
        options = _trace_found_from_here(data["options"], data.get("resolved"))
        return cls.from_dict(options, source=str(path))


def _trace_found_from_here(options: dict[str, Any], resolved: Any) -> dict[str, Any]:
    """``options`` with the trace at its absolute path when the path given is relative, not
    found from here (and no shipped trace's name), and the absolute one exists."""
    from workloads import shipped_trace_names

    trace = options.get("trace")
    absolute = resolved.get("trace_path_absolute") if isinstance(resolved, dict) else None
    if not (isinstance(trace, str) and isinstance(absolute, str)) or not trace.strip():
        return options
    given = Path(trace)
    if given.is_absolute() or given.exists() or trace in shipped_trace_names():
        return options
    if not Path(absolute).is_file():
        return options
    return {**options, "trace": absolute}


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)


def pd_pool_tps(c: RunConfig) -> tuple[int, int]:
    """A P/D fleet's tensor-parallel sizes: (prefill, decode), each its option or --tp."""
    prefill = c.tp if c.pd_prefill_tp is None else c.pd_prefill_tp
    return prefill, c.tp if c.pd_decode_tp is None else c.pd_decode_tp


def _pd_tp_problem(c: RunConfig) -> str | None:
    """vLLM's NIXL connector pulls between TP sizes of which one divides the other
    (TransferTopology.tp_ratio in vllm/distributed/kv_transfer/kv_connector/utils.py asserts
    it at the handshake)."""
    if c.pd is None:
        return None
    prefill, decode = pd_pool_tps(c)
    if max(prefill, decode) % min(prefill, decode) == 0:
        return None
    return (
        f"--pd-prefill-tp {prefill} and --pd-decode-tp {decode}: one must divide the other "
        "(vLLM's NIXL connector maps TP ranks between pools only then)"
    )


def _check_tiers(value: str) -> None:
    try:
        parse_tier_specs(value)
    except CostModelError as e:
        raise ConfigError(str(e)) from None


def _tier_without_cpu_problem(c: RunConfig) -> str | None:
    if c.kv_offload_tier is None or c.offloads():
        return None
    return (
        "--kv-offload-tier needs --kv-offloading-size above 0 (secondary tiers sit behind "
        "the CPU tier, as in vLLM's tiering spec)"
    )


def _offload_block_size_problem(c: RunConfig) -> str | None:
    size = c.kv_offload_block_size
    if size is None or size % c.block_size == 0:
        return None
    return (
        f"--kv-offload-block-size {size} must be a multiple of --block-size {c.block_size} "
        "(an offloaded chunk is whole GPU blocks, as vLLM requires)"
    )


def _engine_only_in_cost_mode(c: RunConfig) -> str | None:
    if c.mode != "cost":
        return None
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    given = [n for n in ("device", "dtype", "threads") if getattr(c, n) != defaults[n]]
    if not given:
        return None
    flags = ", ".join(option_specs()[n].cli_flag(n) for n in given)
    return f"{flags} applies to --mode engine only (cost mode runs no model)"


# Options that contradict each other: each rule returns what is wrong, or None.
_RULES: tuple[Callable[[RunConfig], str | None], ...] = (
    lambda c: (
        "give --rate or --time-scale, not both"
        if c.rate is not None and c.time_scale is not None
        else None
    ),
    lambda c: (
        "--rate rescales an open-loop trace; with --concurrency the users set the rate "
        "(give one of them)"
        if c.rate is not None and c.concurrency is not None
        else None
    ),
    lambda c: (
        "--time-scale rescales an open-loop trace; with --concurrency the users set the "
        "rate (give one of them)"
        if c.time_scale is not None and c.concurrency is not None
        else None
    ),
    lambda c: (
        "--think-time is the pause of a closed-loop user: it needs --concurrency"
        if c.think_time_s > 0 and c.concurrency is None
        else None
    ),
    lambda c: (
        f"allocator {c.allocator!r} runs in cost mode only (the torch engine is paged)"
        if c.allocator != "paged" and c.mode != "cost"
        else None
    ),
    lambda c: (
        f"allocator {c.allocator!r} runs with the classic scheduler (the contiguous baselines "
        "reproduce the vLLM paper's comparison of 2023 schedulers), not --scheduler v1"
        if c.allocator != "paged" and c.scheduler == "v1"
        else None
    ),
    lambda c: (
        # vLLM's SchedulerConfig refuses this too: no prompt longer than one step's budget
        # could ever be scheduled
        f"--max-num-batched-tokens {c.max_num_batched_tokens} is below --max-model-len "
        f"{c.max_model_len} with chunked prefill off, so longer prompts could never run (as "
        "vLLM says): raise it, lower --max-model-len or enable chunked prefill"
        if not c.enable_chunked_prefill
        and c.resolved_scheduler() == "v1"
        and c.max_num_batched_tokens is not None
        and c.max_model_len is not None
        and c.max_num_batched_tokens < c.max_model_len
        else None
    ),
    lambda c: (
        # vLLM's SchedulerConfig.verify_max_model_len; the defaulted cases are checked once
        # the GPU's defaults are known (scheduling_limits)
        f"--max-num-batched-tokens {c.max_num_batched_tokens:,} is below --max-num-seqs "
        f"{c.max_num_seqs:,}: a step could never schedule every running sequence (vLLM 0.33 "
        "refuses it too); raise --max-num-batched-tokens or lower --max-num-seqs"
        if c.max_num_batched_tokens is not None
        and c.max_num_seqs is not None
        and c.max_num_batched_tokens < c.max_num_seqs
        else None
    ),
    lambda c: (
        f"--long-prefill-token-threshold {c.long_prefill_token_threshold:,} is above "
        f"--max-model-len {c.max_model_len:,} (vLLM 0.33 refuses it too): lower it"
        if c.max_model_len is not None and c.long_prefill_token_threshold > c.max_model_len
        else None
    ),
    lambda c: (
        "--step-time prices cost-mode steps; engine mode measures them"
        if c.step_time is not None and c.mode != "cost"
        else None
    ),
    lambda c: (
        "a fleet (--replicas above 1) runs in cost mode with the v1 scheduler and paged KV "
        "blocks, open loop (no --concurrency)"
        if c.replicas > 1
        and (c.mode != "cost" or c.resolved_scheduler() != "v1" or c.concurrency is not None)
        else None
    ),
    lambda c: (
        "--fleet-events all writes the replicas' events of a --replicas fleet (a P/D fleet "
        "writes its routing decisions only)"
        if c.fleet_events == "all" and c.pd is not None
        else None
    ),
    lambda c: (
        "--router-speculative-ttl is llm-d's speculative indexing: it needs --router prefix "
        "in a fleet (--replicas above 1 or --pd)"
        if c.router_speculative_ttl_s > 0
        and (c.router != "prefix" or (c.replicas <= 1 and c.pd is None))
        else None
    ),
    lambda c: (
        "--pd P:D sets the fleet: --replicas is P + D (or leave it out)"
        if c.pd is not None and c.replicas not in (1, sum(parse_pd(c.pd)))
        else None
    ),
    lambda c: (
        "a P/D fleet (--pd) runs in cost mode with the v1 scheduler and paged KV blocks, open "
        "loop (no --concurrency), without KV offload"
        if c.pd is not None
        and (
            c.mode != "cost"
            or c.resolved_scheduler() != "v1"
            or c.concurrency is not None
            or c.offloads()
        )
        else None
    ),
    lambda c: (
        "--pd-prefill-gpu, --pd-prefill-tp, --pd-decode-gpu and --pd-decode-tp set a P/D "
        "fleet's pools: give --pd P:D"
        if c.pd is None and c.sets_pd_pools()
        else None
    ),
    _pd_tp_problem,
    lambda c: (
        "KV offload (--kv-offloading-size above 0) runs with the v1 scheduler and paged KV "
        "blocks (vLLM's OffloadingConnector is a v1 KV connector)"
        if c.offloads() and c.resolved_scheduler() != "v1"
        else None
    ),
    _offload_block_size_problem,
    _tier_without_cpu_problem,
    _engine_only_in_cost_mode,
)


def option_specs() -> dict[str, OptionSpec]:
    """Every RunConfig field's OptionSpec, in field order (the order of config.json)."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(RunConfig)}


# Fields config.json leaves out at their default (OptionSpec.omit_default), with the default.
_OMITTED_AT_DEFAULT = {
    f.name: f.default for f in dataclasses.fields(RunConfig) if f.metadata["option"].omit_default
}


def offload_plan(config: RunConfig, model: ModelSpec, gpu_name: str) -> OffloadPlan | None:
    """The CPU tier ``config`` asks for, sized for ``model`` (its KV bytes per block over
    ``config.tp`` GPUs) with the link of ``gpu_name`` unless one is given; None without
    offload. kvsim.costmodel.offload.plan_offload has the arithmetic (vLLM's)."""
    if not config.offloads():
        return None
    link = resolve_link(
        config.kv_offload_link,
        gpu_name,
        read_gbps=config.kv_offload_read_gbps,
        write_gbps=config.kv_offload_write_gbps,
        latency_us=config.kv_offload_latency_us,
    )
    return plan_offload(
        model,
        tp=config.tp,
        gpu_block_size=config.block_size,
        size_gib=config.kv_offloading_size,
        offload_block_size=config.kv_offload_block_size,
        policy=config.kv_offload_policy,
        link=link,
    )


@dataclass(frozen=True, slots=True)
class SchedulingLimits:
    """The batch limits a run uses once its defaults are resolved (sequences, tokens, share
    of blocks)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    watermark: float


CLASSIC_LIMITS = SchedulingLimits(max_num_seqs=256, max_num_batched_tokens=8192, watermark=0.01)


def scheduling_limits(
    config: RunConfig, gpu: GPUSpec, max_model_len: int | None = None
) -> SchedulingLimits:
    """``config``'s limits, with vLLM 0.33's serving defaults for ``gpu`` under v1 (watermark
    0) and the 2023 defaults (256 sequences, 8,192 tokens, watermark 0.01) under classic.

    With the run's resolved ``max_model_len`` (tokens) the v1 defaults are fitted as vLLM 0.33
    fits them (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``): a defaulted
    token budget is raised to ``max_model_len`` without chunked prefill (else no long prompt
    could run) and capped at ``max_num_seqs * max_model_len``; a defaulted ``max_num_seqs`` is
    capped at the token budget. Then vLLM's own checks (``SchedulerConfig.verify_max_model_len``)
    raise ConfigError: a budget below ``max_num_seqs``, a long-prefill threshold above
    ``max_model_len``."""
    if config.resolved_scheduler() != "v1":
        return SchedulingLimits(
            max_num_seqs=config.max_num_seqs or CLASSIC_LIMITS.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens
            or CLASSIC_LIMITS.max_num_batched_tokens,
            watermark=CLASSIC_LIMITS.watermark if config.watermark is None else config.watermark,
        )
    tokens, seqs = serving_batch_defaults(gpu)
    seqs = config.max_num_seqs or seqs
    tokens = config.max_num_batched_tokens or tokens
    if max_model_len is not None and config.max_num_batched_tokens is None:
        if not config.enable_chunked_prefill:
            tokens = max(tokens, max_model_len)
        tokens = min(tokens, seqs * max_model_len)
    if config.max_num_seqs is None:
        seqs = min(seqs, tokens)
    if tokens < seqs:
        given = "" if config.max_num_batched_tokens else " (the default for this GPU)"
        raise ConfigError(
            f"--max-num-batched-tokens {tokens:,}{given} is below --max-num-seqs {seqs:,}: "
            "a step could never schedule every running sequence (vLLM 0.33 refuses it too); "
            "raise --max-num-batched-tokens or lower --max-num-seqs"
        )
    if max_model_len is not None and config.long_prefill_token_threshold > max_model_len:
        raise ConfigError(
            f"--long-prefill-token-threshold {config.long_prefill_token_threshold:,} is above "
            f"max_model_len {max_model_len:,} (vLLM 0.33 refuses it too): lower it"
        )
    return SchedulingLimits(
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        watermark=0.0 if config.watermark is None else config.watermark,
    )
