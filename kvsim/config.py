"""RunConfig: every option of one simulation, resolved and serialisable.

A run folder's config.json is ``RunConfig.to_dict()``; ``kvsim run --config config.json``
rebuilds the same config, so a run can be repeated exactly.

Each field is defined once, here: its type, default, help text and unit (``option(...)``
metadata). The ``kvsim run`` and ``kvsim sweep`` options (kvsim/commands/options.py), the sweep's
reproduce command and docs/options.md are all derived from these definitions, so adding an
option means adding a field here, and its behaviour where it acts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvsim.costmodel.gpuspec import GPU_PRESETS, GPUSpec
from kvsim.costmodel.memory_plan import serving_batch_defaults
from kvsim.errors import KvsimError

Mode = Literal["cost", "engine"]
Allocator = Literal["paged", "max", "pow2", "oracle"]  # kvsim.sim.allocators builds them
SchedulerName = Literal["v1", "classic"]
Policy = Literal["fcfs", "priority"]
MODES: tuple[str, ...] = typing.get_args(Mode)
ALLOCATORS: tuple[str, ...] = typing.get_args(Allocator)
SCHEDULERS: tuple[str, ...] = typing.get_args(SchedulerName)
POLICIES: tuple[str, ...] = typing.get_args(Policy)

# How `kvsim sweep` offers a field: given once like `kvsim run` ("option"), as its own
# comma-separated axis ("axis"), only through --param ("param"), or not at all ("no").
SweepUse = Literal["option", "axis", "param", "no"]


class ConfigError(KvsimError):
    """An option or a config.json field is invalid."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OptionSpec:
    """How a RunConfig field is offered to users.

    ``unit`` is the CLI metavar and the unit column of docs/options.md; ``default_text`` says
    what a None default means; ``flag`` is the CLI flag when it is not ``--field-name``.
    """

    help: str
    unit: str = ""
    flag: str | None = None
    default_text: str | None = None
    path: bool = False  # a file path (the CLI takes a Path; config.json stores the string)
    run: bool = True  # offered by `kvsim run`
    sweep: SweepUse = "option"
    sweep_help: str | None = None  # the help of the sweep option, where it differs

    def cli_flag(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")


def option(default: Any, **spec: Any) -> Any:
    """A RunConfig field with its user-facing definition (see OptionSpec)."""
    return dataclasses.field(default=default, metadata={"option": OptionSpec(**spec)})


def _positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if type(value) is not int or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _positive_float(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """One simulation. Units: tokens, blocks, seconds, requests per second."""

    trace: str = option(
        dataclasses.MISSING,
        help="Trace file (.json/.jsonl/.csv) or shipped trace name",
        run=False,
        sweep="no",
    )
    mode: Mode = option(
        "cost",
        help="cost: step times from the cost model; engine: the torch engine runs every step",
        sweep="no",
    )
    model: str = option(
        "llama-2-7b", help="Model preset or a Hugging Face config.json path", unit="NAME|PATH"
    )
    gpu: str = option(
        "a100-80gb",
        help=f"GPU preset ({', '.join(GPU_PRESETS)}) or a GPU spec JSON file",
        unit="NAME|PATH",
    )
    tp: int = option(1, help="Tensor-parallel GPUs", unit="GPUS")
    coefficients: str | None = option(
        None,
        help="Cost-model coefficient overrides (JSON file)",
        unit="FILE",
        path=True,
        default_text="none",
    )
    step_time: str | None = option(
        None,
        help="Replace the cost model: linear:BASE_S:PER_TOKEN_S prices a step at BASE_S + "
        "PER_TOKEN_S x scheduled tokens (the clock of vLLM's reference scheduler driver)",
        unit="SPEC",
        default_text="the cost model",
    )
    block_size: int = option(
        16,
        help="Tokens per KV block",
        unit="TOKENS",
        sweep="axis",
        sweep_help="Block sizes to sweep, e.g. 1,2,4,8,16,32,64,128,256",
    )
    num_blocks: int | None = option(
        None,
        help="KV blocks in the pool",
        unit="BLOCKS",
        default_text="planned from GPU memory",
        sweep_help="KV blocks (of the base block size, 16, when block sizes are swept: the "
        "slots are held)",
    )
    gpu_memory_utilization: float = option(
        0.9, help="Share of GPU memory for weights, activations and KV", unit="FRACTION"
    )
    max_num_seqs: int | None = option(
        None,
        help="Most sequences in one batch",
        unit="SEQS",
        default_text="v1: vLLM 0.33's serving default for the GPU (1024 on H100/H200-class, "
        "256 on A100 and smaller); classic: 256",
    )
    max_num_batched_tokens: int | None = option(
        None,
        help="Token budget of one step (classic: of one prefill step)",
        unit="TOKENS",
        default_text="v1: vLLM 0.33's serving default for the GPU (8192 on H100/H200-class, "
        "2048 on A100 and smaller); classic: 8192",
    )
    max_model_len: int | None = option(
        None,
        help="Longest sequence, prompt + output (beyond the model's context: a what-if, "
        "with a warning)",
        unit="TOKENS",
        default_text="the model's",
    )
    watermark: float | None = option(
        None,
        help="Share of blocks kept free when admitting",
        unit="FRACTION",
        default_text="v1: 0 (vLLM 0.33); classic: 0.01",
    )
    scheduler: SchedulerName = option(
        "v1",
        help="v1: vLLM 0.33's scheduler (one token budget shared by decodes and prefill "
        "chunks, prefix caching, priorities); classic: vLLM's 2023 scheduler (a step is a "
        "prefill or a decode batch; the vLLM paper's figures)",
    )
    enable_chunked_prefill: bool = option(
        True, help="v1: cut prefills into chunks that fit the step's token budget"
    )
    long_prefill_token_threshold: int = option(
        0,
        help="v1: cap one sequence's prefill chunk at this many tokens (0: no cap)",
        unit="TOKENS",
    )
    enable_prefix_caching: bool = option(
        True,
        help="v1: reuse cached full KV blocks across requests (a trace's hash_ids say which "
        "prompts share a prefix)",
    )
    scheduling_policy: Policy = option(
        "fcfs",
        help="v1: fcfs (arrival order) or priority (the trace's priority, lower first)",
    )
    rate: float | None = option(
        None,
        help="Rescale arrivals to this mean rate",
        unit="REQ/S",
        default_text="the trace's",
        sweep="axis",
        sweep_help="Request rates to sweep (requests/s), e.g. 1,2,4,8",
    )
    time_scale: float | None = option(
        None, help="Multiply arrival times by this factor", unit="FACTOR", default_text="1"
    )
    concurrency: int | None = option(
        None,
        help="Closed loop: this many users, one request each in flight",
        unit="USERS",
        default_text="open loop",
    )
    think_time_s: float = option(
        0.0,
        help="Closed loop: mean think time between a user's requests",
        unit="SECONDS",
        flag="--think-time",
    )
    seed: int = option(0, help="Seed for every random choice", unit="INT")
    until: float | None = option(
        None, help="Stop at this simulated time", unit="SECONDS", default_text="the end"
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
    device: str = option("cpu", help="Engine mode: cpu or cuda", unit="DEVICE", sweep="no")
    dtype: str = option(
        "float32", help="Engine mode: float32, bfloat16 or float16", unit="DTYPE", sweep="no"
    )
    threads: int | None = option(
        None,
        help="Engine mode: torch CPU threads",
        unit="THREADS",
        default_text="torch's choice",
        sweep="param",
    )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("tp", "block_size"):
            _positive_int(name, getattr(self, name))
        for name in (
            "num_blocks", "max_model_len", "concurrency", "threads", "max_num_seqs",
            "max_num_batched_tokens",
        ):  # fmt: skip
            _positive_int(name, getattr(self, name), allow_none=True)
        for name in ("rate", "time_scale", "until"):
            _positive_float(name, getattr(self, name), allow_none=True)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if self.watermark is not None and not 0 <= self.watermark < 1:
            raise ConfigError(f"watermark must be in [0, 1), got {self.watermark!r}")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(
                f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}"
            )
        if self.scheduling_policy not in POLICIES:
            raise ConfigError(
                f"scheduling_policy must be one of {', '.join(POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )
        threshold = self.long_prefill_token_threshold
        if type(threshold) is not int or threshold < 0:
            raise ConfigError(
                f"long_prefill_token_threshold must be an integer >= 0, got {threshold!r}"
            )
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "fast_decode"):
            if type(getattr(self, name)) is not bool:
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.step_time is not None:
            parse_step_time(self.step_time)
        if not (self.think_time_s >= 0 and math.isfinite(self.think_time_s)):
            raise ConfigError(
                f"think_time_s must be a finite number >= 0, got {self.think_time_s!r}"
            )
        if self.rate is not None and self.time_scale is not None:
            raise ConfigError("give --rate or --time-scale, not both")
        if self.allocator not in ALLOCATORS:
            raise ConfigError(
                f"allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}"
            )
        if self.allocator != "paged" and self.scheduler != "classic":
            raise ConfigError(
                f"allocator {self.allocator!r} runs with scheduler classic (the contiguous "
                "baselines reproduce the vLLM paper's comparison): add --scheduler classic"
            )
        if self.allocator != "paged" and self.mode != "cost":
            raise ConfigError(
                f"allocator {self.allocator!r} runs in cost mode only (the torch engine is paged)"
            )
        if type(self.seed) is not int:
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"{source}: unknown field {unknown[0]!r}")
        if "trace" not in data:
            raise ConfigError(f"{source}: missing field 'trace'")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except TypeError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        """Read a run's config.json; the ``resolved`` section, if present, is ignored."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
            raise ConfigError(f"{path}: expected an object with an 'options' object")
        return cls.from_dict(data["options"], source=str(path))


@dataclass(frozen=True, slots=True)
class SchedulingLimits:
    """The batch limits a run uses once its defaults are resolved (tokens, sequences, share
    of blocks)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    watermark: float


CLASSIC_LIMITS = SchedulingLimits(max_num_seqs=256, max_num_batched_tokens=8192, watermark=0.01)


def scheduling_limits(config: RunConfig, gpu: GPUSpec) -> SchedulingLimits:
    """``config``'s limits, with vLLM 0.33's serving defaults for ``gpu`` under v1 (watermark
    0) and today's (256 sequences, 8,192 tokens, watermark 0.01) under classic."""
    if config.scheduler == "v1":
        tokens, seqs = serving_batch_defaults(gpu)
        defaults = SchedulingLimits(max_num_seqs=seqs, max_num_batched_tokens=tokens, watermark=0.0)
    else:
        defaults = CLASSIC_LIMITS
    return SchedulingLimits(
        max_num_seqs=config.max_num_seqs or defaults.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens or defaults.max_num_batched_tokens,
        watermark=defaults.watermark if config.watermark is None else config.watermark,
    )


def option_specs() -> dict[str, OptionSpec]:
    """Every RunConfig field's OptionSpec, in field order (the order of config.json)."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(RunConfig)}


def parse_step_time(spec: str) -> tuple[float, float]:
    """``linear:BASE_S:PER_TOKEN_S`` as (base seconds, seconds per scheduled token)."""
    kind, _, rest = spec.partition(":")
    parts = rest.split(":")
    if kind != "linear" or len(parts) != 2:
        raise ConfigError(f"step_time must be linear:BASE_S:PER_TOKEN_S, got {spec!r}")
    try:
        base, per_token = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(f"step_time {spec!r}: BASE_S and PER_TOKEN_S must be numbers") from None
    if not (math.isfinite(base) and math.isfinite(per_token) and base >= 0 and per_token >= 0):
        raise ConfigError(f"step_time {spec!r}: BASE_S and PER_TOKEN_S must be finite and >= 0")
    if base == 0 and per_token == 0:
        raise ConfigError(f"step_time {spec!r}: a step must take some time")
    return base, per_token
