"""RunConfig: every option of one simulation, resolved and serialisable.

A run folder's config.json is ``RunConfig.to_dict()``; ``kvsim run --config config.json``
rebuilds the same config, so a cost-mode run can be repeated exactly (an engine-mode run
measures wall time: it repeats the requests and options, not the times, nor so the exact steps).

Each field's type is checked (JSON's types: no string for a number, no number for a flag) and
then its bounds (``option(check=...)``); contradicting options are refused by the rules of
kvsim/config/rules.py.

Each field is defined once, in its group (kvsim/config/run_options.py joins them): its type,
default, help text and unit (``option(...)`` metadata). The ``kvsim run`` and ``kvsim sweep``
options (kvsim/commands/options.py), the sweep's reproduce command and docs/options.md are all
derived from these definitions, so adding an option means adding a field to its group, and its
behaviour where it acts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.config.rules import RULES, pd_pool_tps
from kvsim.config.run_options import RunOptions
from kvsim.config.types import MAX_CONFIG_BYTES
from kvsim.costmodel.modelspec import ModelSpec
from kvsim.costmodel.offload import (
    OffloadPlan,
    plan_offload,
    resolve_link,
)
from kvsim.option_spec import ConfigError, OptionSpec, check_type, shown


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig(RunOptions):
    """One simulation, its options checked (kvsim/config/run_options.py has them). Units:
    tokens, blocks, seconds, requests per second."""

    def __post_init__(self) -> None:
        hints = _field_types()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            check_type(field.name, value, hints[field.name])
            check = field.metadata["option"].check
            if check is not None and value is not None:
                check(field.name, value)
        for rule in RULES:
            problem = rule(self)
            if problem is not None:
                raise ConfigError(problem)

    def to_dict(self) -> dict[str, Any]:
        """config.json's options: every field, less those marked ``omit_default`` at their
        default (a run without KV offload writes what it wrote before offload existed)."""
        data = dataclasses.asdict(self)
        for name, default in _OMITTED_AT_DEFAULT.items():
            if data[name] == default and type(data[name]) is type(default):
                del data[name]
        return data

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


__all__ = ["RunConfig", "offload_plan", "option_specs", "pd_pool_tps"]
