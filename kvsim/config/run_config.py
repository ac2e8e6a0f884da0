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
from typing import Any

from kvsim.config.fleet import FleetOptions
from kvsim.config.offload import OffloadOptions
from kvsim.config.serving import ServingOptions
from kvsim.config.types import (
    DEFAULT_THREADS,
    MAX_CONFIG_BYTES,
    Allocator,
)
from kvsim.config.workload import WorkloadOptions
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.offload import (
    OffloadPlan,
    plan_offload,
    resolve_link,
)
from kvsim.option_spec import (
    ConfigError,
    OptionSpec,
    at_least,
    check_type,
    one_of,
    option,
    parse_pd,
    shown,
)


# The groups' fields come first, in this order (dataclasses collect base fields from the last
# base to the first): serving, workload, fleet, offload, then RunConfig's own. The order is
# config.json's, --help's and docs/options.md's.
@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig(OffloadOptions, FleetOptions, WorkloadOptions, ServingOptions):
    """One simulation. Units: tokens, blocks, seconds, requests per second."""

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
