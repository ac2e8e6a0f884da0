"""How a RunConfig field is offered to users and checked: OptionSpec (help, unit, flag, how
`kvsim sweep` offers it) and the declarative bounds checks its ``check`` names.

kvsim/config/ defines the fields with ``option(...)``; the CLI options, the sweep's axes and
docs/options.md are derived from these specs.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kvsim.errors import KvsimError

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
    check: Check | None = None  # the value's bounds, after its type is checked
    # config.json leaves the field out while it holds its default: a run without the feature
    # keeps the config.json (and report) it had before the field existed
    omit_default: bool = False

    def cli_flag(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")


def option(default: Any, **spec: Any) -> Any:
    """A RunConfig field with its user-facing definition (see OptionSpec)."""
    return dataclasses.field(default=default, metadata={"option": OptionSpec(**spec)})


# --- declarative checks: each takes the field's name and its value (of the right type) ------

Check = Callable[[str, Any], None]
# FastDecodeScheduler keeps one list per token of a block (engine/fast/decode.py): a block size
# of 1e8 would take gigabytes before the first step. No model has contexts this long.
MAX_BLOCK_SIZE = 65_536
MAX_SEED = 2**63 - 1  # numpy and torch take seeds below 2**64
MAX_TOKENS = 2**31 - 1  # token counts are int32 in the event stream (engine/core/events.py)
# The BlockManager keeps a few Python objects per block (free list, owners, ref counts): 2^24
# blocks already take about a GiB; planned pools of real GPUs are far smaller.
MAX_NUM_BLOCKS = 2**24
# A closed-loop user is a simpy process; a million would take about a GiB before any request.
MAX_CONCURRENCY = 100_000


def at_least(low: float, *, maximum: float | None = None, why: str = "") -> Check:
    """A number >= ``low`` (and <= ``maximum``), finite."""

    def check(name: str, value: Any) -> None:
        if not (low <= value < math.inf) or (maximum is not None and value > maximum):
            bound = f">= {low:,}" if maximum is None else f"in [{low:,}, {maximum:,}]"
            raise ConfigError(f"{name} must be {bound}{why}, got {shown(value)}")

    return check


def above(low: float, *, maximum: float | None = None, why: str = "") -> Check:
    """A finite number > ``low`` (and <= ``maximum``)."""

    def check(name: str, value: Any) -> None:
        if not (low < value < math.inf):
            raise ConfigError(f"{name} must be a finite number > {low}, got {shown(value)}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{name} must be at most {maximum:,g}{why}, got {shown(value)}")

    return check


def fraction(*, low_open: bool, high_open: bool) -> Check:
    """A share between 0 and 1, ends open or closed as given."""
    interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"

    def check(name: str, value: Any) -> None:
        low_ok = value > 0 if low_open else value >= 0
        high_ok = value < 1 if high_open else value <= 1
        if not (low_ok and high_ok):
            raise ConfigError(f"{name} must be in {interval}, got {shown(value)}")

    return check


def one_of(*values: str, pattern: str | None = None) -> Check:
    """One of ``values`` (or a full match of ``pattern``)."""

    def check(name: str, value: Any) -> None:
        if value in values or (pattern is not None and re.fullmatch(pattern, value)):
            return
        raise ConfigError(f"{name} must be one of {', '.join(values)}, got {shown(value)}")

    return check


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error line stays a line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}... ({len(text):,} chars)"


def not_empty(name: str, value: Any) -> None:
    """A name or path: not empty, no NUL (which no file name can hold)."""
    if not value.strip():
        raise ConfigError(f"{name} must not be empty")
    if "\x00" in value:
        raise ConfigError(f"{name} must not contain a NUL character, got {shown(value)}")


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def check_type(name: str, value: Any, hint: Any) -> None:
    """``value`` is of the field's declared type (JSON's types: an int is a float, a bool is
    not a number), or None where the field is optional."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union) and type(None) in args:
        if value is None:
            return
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is Literal:
        if value not in typing.get_args(hint):
            choices = ", ".join(typing.get_args(hint))
            raise ConfigError(f"{name} must be one of {choices}, got {shown(value)}")
        return
    ok = {
        int: type(value) is int,
        # an integer for a float field must have a float (2^53: exact; 10^400: none)
        float: type(value) is float or (type(value) is int and abs(value) <= 2**53),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[hint]
    if not ok:
        raise ConfigError(f"{name} must be {_TYPE_WORDS[hint]}, got {shown(value)}")


_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def check_step_time(spec: str) -> None:
    parse_step_time(spec)


def parse_step_time(spec: str) -> tuple[float, float]:
    """``linear:BASE_S:PER_TOKEN_S`` as (base seconds, seconds per scheduled token)."""
    kind, _, rest = spec.partition(":")
    parts = rest.split(":")
    if kind != "linear" or len(parts) != 2:
        raise ConfigError(f"step_time must be linear:BASE_S:PER_TOKEN_S, got {shown(spec)}")
    # float() also takes 1_0, " 1" and "infinity": only plain decimal numbers are seconds
    if not all(_DECIMAL.fullmatch(part) for part in parts):
        raise ConfigError(
            f"step_time {shown(spec)}: BASE_S and PER_TOKEN_S must be decimal numbers "
            "(e.g. 0.005, 2e-5)"
        )
    base, per_token = float(parts[0]), float(parts[1])
    if not (0 <= base < math.inf and 0 <= per_token < math.inf) or base + per_token == 0:
        raise ConfigError(
            f"step_time {shown(spec)}: BASE_S and PER_TOKEN_S must be finite, >= 0 and not both 0"
        )
    return base, per_token


def parse_router_weights(spec: str) -> tuple[float, float, float]:
    """``PREFIX:QUEUE:KV``, the `prefix` router's scorer weights, as three numbers >= 0, not
    all 0."""
    parts = spec.split(":")
    if len(parts) != 3 or not all(_DECIMAL.fullmatch(part) for part in parts):
        raise ConfigError(
            f"router_weights must be PREFIX:QUEUE:KV (three numbers), got {shown(spec)}"
        )
    weights = (float(parts[0]), float(parts[1]), float(parts[2]))
    if not all(0 <= w < math.inf for w in weights) or sum(weights) == 0:
        raise ConfigError(
            f"router_weights {shown(spec)}: each weight must be finite and >= 0, not all 0"
        )
    return weights


_PD = re.compile(r"(\d+):(\d+)")


def parse_pd(spec: str | None) -> tuple[int, int]:
    """``P:D``, a P/D fleet's prefill and decode replicas (P >= 1, D >= 1)."""
    match = _PD.fullmatch(spec or "")
    if match is None:
        raise ConfigError(f"pd must be P:D (prefill and decode replicas), got {shown(spec)}")
    num_prefill, num_decode = int(match[1]), int(match[2])
    if num_prefill < 1 or num_decode < 1:
        raise ConfigError(f"pd {shown(spec)}: P and D must each be at least 1")
    return num_prefill, num_decode
