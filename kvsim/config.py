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

from kvsim.costmodel.gpuspec import GPU_PRESETS
from kvsim.errors import KvsimError

Mode = Literal["cost", "engine"]
Allocator = Literal["paged", "max", "pow2", "oracle"]  # kvsim.sim.allocators builds them
MODES: tuple[str, ...] = typing.get_args(Mode)
ALLOCATORS: tuple[str, ...] = typing.get_args(Allocator)

# How `kvsim sweep` offers a field: given once like `kvsim run` ("option"), as its own
# comma-separated axis ("axis"), only through --param ("param"), or not at all ("no").
SweepUse = Literal["option", "axis", "param", "no"]


# Engine mode's pinned torch threads: one thread is the setting other processes disturb least,
# and whose timings (and calibrated "cpu" coefficients) mean the same on any machine.
DEFAULT_THREADS = 1


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
    max_num_seqs: int = option(256, help="Most sequences in one batch", unit="SEQS")
    max_num_batched_tokens: int = option(
        8192, help="Most tokens in one prefill step", unit="TOKENS"
    )
    max_model_len: int | None = option(
        None,
        help="Longest sequence, prompt + output",
        unit="TOKENS",
        default_text="the model's",
    )
    watermark: float = option(
        0.01, help="Share of blocks kept free when admitting", unit="FRACTION"
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
        DEFAULT_THREADS,
        help="Engine mode: torch CPU threads, pinned (one inter-op thread); 1 keeps measured step "
        "times stable on a shared machine, raise it on a dedicated one; null in config.json: "
        "torch's choice (one per core: runs can differ 300x under contention)",
        unit="THREADS",
        sweep="param",
    )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("tp", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            _positive_int(name, getattr(self, name))
        for name in ("num_blocks", "max_model_len", "concurrency", "threads"):
            _positive_int(name, getattr(self, name), allow_none=True)
        for name in ("rate", "time_scale", "until"):
            _positive_float(name, getattr(self, name), allow_none=True)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if not 0 <= self.watermark < 1:
            raise ConfigError(f"watermark must be in [0, 1), got {self.watermark!r}")
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


def option_specs() -> dict[str, OptionSpec]:
    """Every RunConfig field's OptionSpec, in field order (the order of config.json)."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(RunConfig)}
