"""RunConfig: every option of one simulation, resolved and serialisable.

A run folder's config.json is ``RunConfig.to_dict()``; ``kvsim run --config config.json``
rebuilds the same config, so a run can be repeated exactly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvsim.errors import KvsimError

Mode = Literal["cost", "engine"]
MODES = ("cost", "engine")
ALLOCATORS = ("paged", "max", "pow2", "oracle")  # kvsim.sim.allocators builds them


class ConfigError(KvsimError):
    """An option or a config.json field is invalid."""


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
    """One simulation. Units: tokens, blocks, seconds, requests per second.

    ``num_blocks`` None means: plan it from GPU memory like vLLM
    (``gpu_memory_utilization`` of the GPU, minus weights and activations).
    ``max_model_len`` None means the model's own maximum length.
    """

    trace: str
    mode: Mode = "cost"
    model: str = "llama-2-7b"
    gpu: str = "a100-80gb"
    tp: int = 1
    coefficients: str | None = None  # path of a cost-coefficient JSON override
    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    watermark: float = 0.01
    rate: float | None = None
    time_scale: float | None = None
    concurrency: int | None = None
    think_time_s: float = 0.0
    seed: int = 0
    until: float | None = None
    allocator: str = "paged"  # paged, or a contiguous baseline: max, pow2, oracle
    fast_decode: bool = True  # FastDecodeScheduler in cost mode; results identical either way
    # engine mode only
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None  # torch CPU threads (None: torch's default)

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
