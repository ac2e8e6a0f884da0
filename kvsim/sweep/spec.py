"""Sweeps: one run per point of a grid over run options, and the table of their results.

A ``SweepSpec`` is a base RunConfig plus ordered axes (``block_size``, ``allocator``,
``rate`` or any other RunConfig field, and ``kv_slots``: the KV capacity in tokens); its points
are the axes' cartesian product, the first axis varying slowest. GPU memory is held fixed
across block sizes: with ``num_blocks`` unset every point plans its pool from GPU memory (so
num_blocks follows the block size); with ``num_blocks`` set, the total slots ``num_blocks x
block_size`` of the base config are held and each point gets ``slots // block_size`` blocks;
``kv_slots`` (one value or an axis) says the capacity in tokens directly, the same bytes at
every block size. Execution: kvsim/sweep/execute.py; the
report: kvsim/sweep/report.py; definitions: docs/sweeps.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from kvsim.analysis.load import PERCENTILES
from kvsim.config import RunConfig, option_specs
from kvsim.errors import KvsimError
from kvsim.option_spec import ConfigError

# From RunConfig's option definitions: the fields with their own comma-list axis option, and
# those a sweep cannot vary (one trace; cost mode: an engine run is one measurement).
AXIS_OPTIONS = tuple(n for n, spec in option_specs().items() if spec.sweep == "axis")
NOT_SWEEPABLE = tuple(n for n, spec in option_specs().items() if spec.sweep == "no")
MAX_POINTS = 10_000
# The one axis that is no RunConfig field: KV capacity in token slots (vLLM's "GPU KV cache
# size: N tokens"), the same bytes at every block size: num_blocks = kv_slots // block_size.
KV_SLOTS = "kv_slots"
# What a recommendation can optimise (kvsim/sweep/recommend.py defines each); the first is
# the default.
OBJECTIVE_NAMES = ("normalized_latency", "throughput")


class SweepError(KvsimError):
    """A sweep option is invalid."""


Axis = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSpec:
    """What to run: ``base`` with each combination of the ``axes`` values.

    A rate sweep's SLO: a point meets it when its ``slo_percentile`` TTFT is at most
    ``slo_ttft_s`` and its TPOT at most ``slo_tpot_s`` (those given).
    """

    base: RunConfig
    axes: tuple[Axis, ...] = ()
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    slo_percentile: int = 99
    kv_slots: int | None = None  # hold these KV slots: num_blocks = kv_slots // block_size
    events: bool = False  # write each point's events.parquet (big at small block sizes)
    # what the recommendation optimises among the points meeting the SLOs (kvsim/sweep/
    # recommend.py): normalized_latency (lowest) or throughput (highest output tokens/s)
    objective: str = "normalized_latency"

    def __post_init__(self) -> None:
        names = [name for name, _ in self.axes]
        if len(set(names)) != len(names):
            raise SweepError(f"an option is swept twice: {names}")
        fields = {f.name for f in dataclasses.fields(RunConfig)} | {KV_SLOTS}
        for name, values in self.axes:
            if name not in fields or name in NOT_SWEEPABLE:
                raise SweepError(f"cannot sweep {name!r}: not a sweepable run option")
            if not values:
                raise SweepError(f"{name}: no values")
            if len(set(map(repr, values))) != len(values):
                raise SweepError(f"{name}: a value is repeated in {list(values)}")
            if name == KV_SLOTS:
                for value in values:
                    _check_kv_slots(value)
        if self.slo_percentile not in PERCENTILES:
            raise SweepError(
                f"slo_percentile must be one of {', '.join(map(str, PERCENTILES))}, "
                f"got {self.slo_percentile!r}"
            )
        for name in ("slo_ttft_s", "slo_tpot_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise SweepError(f"{name} must be a finite number > 0, got {value!r}")
        if self.objective not in OBJECTIVE_NAMES:
            raise SweepError(
                f"objective must be one of {', '.join(OBJECTIVE_NAMES)}, got {self.objective!r}"
            )
        if self.kv_slots is not None:
            _check_kv_slots(self.kv_slots)
            if KV_SLOTS in names:
                raise SweepError("kv_slots is swept: give it as the axis only")
        holds_slots = self.kv_slots is not None or KV_SLOTS in names
        if holds_slots and (self.base.num_blocks is not None or "num_blocks" in names):
            raise SweepError("give kv_slots or num_blocks, not both")
        if self.base.mode != "cost":
            raise SweepError("sweeps run in cost mode (--mode engine is one run at a time)")
        if self.num_points > MAX_POINTS:
            raise SweepError(f"{self.num_points} points; at most {MAX_POINTS}")

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def num_points(self) -> int:
        n = 1
        for _, values in self.axes:
            n *= len(values)
        return n

    @property
    def has_slo(self) -> bool:
        return self.slo_ttft_s is not None or self.slo_tpot_s is not None

    def points(self) -> list[SweepPoint]:
        """Every point, in order; a value the run options reject raises ``SweepError``."""
        out = []
        names = self.axis_names
        combos = itertools.product(*(values for _, values in self.axes))
        for index, combo in enumerate(combos):
            values = dict(zip(names, combo))
            out.append(SweepPoint(index=index, values=values, config=self.config_of(values)))
        return out

    def config_of(self, values: dict[str, Any]) -> RunConfig:
        changes = dict(values)
        slots = changes.pop(KV_SLOTS, self.kv_slots)
        if slots is not None:  # hold the total slots (GPU memory) fixed
            block_size = values.get("block_size", self.base.block_size)
            changes["num_blocks"] = max(1, slots // block_size)
        try:
            return self.base.replace(**changes)
        except (ConfigError, TypeError) as exc:
            label = ", ".join(f"{k}={v}" for k, v in values.items())
            raise SweepError(f"point {label}: {exc}") from None


@dataclass(frozen=True, slots=True)
class SweepPoint:
    index: int
    values: dict[str, Any]
    config: RunConfig

    @property
    def label(self) -> str:
        """``block_size=16 allocator=paged`` (``base`` for a sweep without axes)."""
        return " ".join(f"{k}={format_value(v)}" for k, v in self.values.items()) or "base"

    @property
    def folder(self) -> str:
        """The point's run folder name under ``points/``: index, then the values."""
        parts = [f"{self.index:03d}"] + [f"{k}={format_value(v)}" for k, v in self.values.items()]
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", "_".join(parts))


# --- parsing option values -----------------------------------------------------------------


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)


def _check_kv_slots(value: Any) -> None:
    if type(value) is not int or value < 1:
        raise SweepError(f"kv_slots must be a positive integer (tokens), got {value!r}")


def parse_kv_slots(text: str) -> int:
    """A KV capacity in tokens: ``200000``, ``2e5`` or ``200_000`` (a whole number)."""
    try:
        value = float(text.strip().replace("_", ""))
    except ValueError:
        raise SweepError(f"kv_slots: {text.strip()!r} is not a number of tokens") from None
    if not (value >= 1 and value < 2**63 and value.is_integer()):
        raise SweepError(f"kv_slots must be a whole number of tokens >= 1, got {text.strip()!r}")
    return int(value)


_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def parse_value(name: str, text: str) -> Any:
    """``text`` as a value of RunConfig field ``name`` (``none`` for an optional field), or
    of the ``kv_slots`` axis (tokens)."""
    if name == KV_SLOTS:
        return parse_kv_slots(text)
    hints = _field_types()
    if name not in hints or name in NOT_SWEEPABLE:
        known = ", ".join(sorted(n for n in hints if n not in NOT_SWEEPABLE))
        raise SweepError(f"unknown run option {name!r} (known: {known})")
    kind = hints[name]
    args = typing.get_args(kind)
    optional = typing.get_origin(kind) in (types.UnionType, typing.Union) and type(None) in args
    if optional:
        kind = next(a for a in args if a is not type(None))
    text = text.strip()
    if optional and text.lower() in ("none", "null"):
        return None
    try:
        # as RunConfig's JSON has them: true/false, not yes/1; no 1_000, nan or infinity
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if kind is int:
            if not _INTEGER.fullmatch(text):
                raise ValueError(text)
            return int(text)
        if kind is float:
            if not _DECIMAL.fullmatch(text):
                raise ValueError(text)
            return float(text)
    except ValueError:
        wanted = {bool: "true or false", int: "an integer", float: "a number"}[kind]
        raise SweepError(f"{name}: {text!r} is not {wanted}") from None
    return text


def parse_values(name: str, text: str) -> tuple[Any, ...]:
    """``"1,2,4"`` as a tuple of RunConfig field ``name``'s values."""
    parts = [p for p in text.split(",")]
    if any(not p.strip() for p in parts):
        raise SweepError(f"{name}: empty value in {text!r}")
    return tuple(parse_value(name, p) for p in parts)


def parse_param(text: str) -> Axis:
    """``"max_num_seqs=64,128"`` (also ``max-num-seqs=...``) as an axis."""
    name, sep, values = text.partition("=")
    if not sep or not name.strip():
        raise SweepError(f"--param wants name=v1,v2,...; got {text!r}")
    name = name.strip().replace("-", "_")
    return name, parse_values(name, values)


def make_spec(base: RunConfig, axes: list[Axis], **options: Any) -> SweepSpec:
    """A spec whose single-valued axes are folded into the base config (``--block-size 32
    --num-blocks 100`` means 100 blocks of 32). When block sizes are swept and the base config
    gives ``num_blocks``, its slots (num_blocks x its block_size, 16 unless set) become
    ``kv_slots``: GPU memory is held, not the block count."""
    fixed = {name: values[0] for name, values in axes if len(values) == 1}
    if KV_SLOTS in fixed:  # one capacity: held like --kv-slots
        if options.get("kv_slots") is not None:
            raise SweepError("kv_slots given twice")
        options["kv_slots"] = fixed.pop(KV_SLOTS)
    if fixed:
        try:
            base = base.replace(**fixed)
        except (ConfigError, TypeError) as exc:
            raise SweepError(str(exc)) from None
    swept = tuple((name, values) for name, values in axes if len(values) > 1)
    names = [name for name, _ in swept]
    allocators = dict(swept).get("allocator", ())
    if base.scheduler is None and any(a != "paged" for a in allocators):
        # Paging against contiguous baselines is the vLLM paper's comparison, under its
        # scheduler for every point: like with like (the reproduce command says so).
        base = base.replace(scheduler="classic")
    if (
        base.num_blocks is not None
        and "block_size" in names
        and "num_blocks" not in names
        and KV_SLOTS not in names
    ):
        if options.get("kv_slots") is not None:
            raise SweepError("give --kv-slots or --num-blocks, not both")
        options["kv_slots"] = base.num_blocks * base.block_size
        base = base.replace(num_blocks=None)
    return SweepSpec(base=base, axes=swept, **options)


# --- the command that reproduces a sweep ----------------------------------------------------

# RunConfig fields with their own `kvsim sweep` option (the rest are written as --param).
FIELD_OPTIONS = {
    name: spec.cli_flag(name)
    for name, spec in option_specs().items()
    if spec.sweep in ("option", "axis")
}


def format_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def command_line(spec: SweepSpec) -> list[str]:
    """``kvsim sweep ...`` arguments that rebuild ``spec`` exactly (the executor and the
    output folder do not change results and are left out)."""
    base = spec.base
    args = ["kvsim", "sweep", base.trace]
    swept = dict(spec.axes)
    defaults = RunConfig(trace=base.trace)
    for field in dataclasses.fields(RunConfig):
        name = field.name
        if name == "trace" or name in swept:
            continue
        value = getattr(base, name)
        if value == getattr(defaults, name):
            continue
        args += _option(name, (value,))
    if spec.kv_slots is not None:
        args += ["--kv-slots", str(spec.kv_slots)]
    for name, values in spec.axes:
        if name == KV_SLOTS:
            args += ["--kv-slots", ",".join(str(v) for v in values)]
        else:
            args += _option(name, values)
    if spec.slo_ttft_s is not None:
        args += ["--slo-ttft", format_value(spec.slo_ttft_s)]
    if spec.slo_tpot_s is not None:
        args += ["--slo-tpot", format_value(spec.slo_tpot_s)]
    if spec.has_slo and spec.slo_percentile != 99:
        args += ["--slo-percentile", str(spec.slo_percentile)]
    if spec.objective != OBJECTIVE_NAMES[0]:
        args += ["--objective", spec.objective]
    if spec.events:
        args.append("--events")
    return args


def _option(name: str, values: tuple[Any, ...]) -> list[str]:
    joined = ",".join(format_value(v) for v in values)
    flag = FIELD_OPTIONS.get(name)
    if flag is None or (len(values) > 1 and name not in AXIS_OPTIONS):
        return ["--param", f"{name}={joined}"]
    if isinstance(values[0], bool):  # a switch: --flag / --no-flag, never "--flag false"
        return [flag if values[0] else f"--no-{flag.removeprefix('--')}"]
    return [flag, joined]
