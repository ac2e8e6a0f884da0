"""Shared plumbing for the cost model's specs: its error type, strict JSON reading, field checks.

Every spec (model, GPU, coefficients) can come from a user's file, so every check names the
source (file path or "preset NAME") and the field with its bad value. Nothing here knows about
models or GPUs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeGuard

from kvsim.errors import KvsimError


class CostModelError(KvsimError):
    """A model, GPU, coefficient or memory-planning input the cost model cannot use."""


def _reject_constant(name: str) -> float:
    # json.loads accepts NaN/Infinity by default; a spec with them is always a mistake.
    raise ValueError(f"non-finite number {name} is not allowed")


# A spec file larger than this is not a spec (a HF config.json is a few KB); nor is a FIFO.
MAX_SPEC_BYTES = 1 << 24


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error line stays a line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'" + f" ({len(text):,} chars)"


def path_exists(path: str | Path) -> bool:
    """Whether ``path`` exists; False for a name no file can have (too long, NUL inside)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def read_json_object(path: str | Path) -> dict[str, object]:
    """Read a JSON file that must hold one object; every failure names the file."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise CostModelError(f"{path}: not a regular file, expected a JSON file")
        if path.is_file() and path.stat().st_size > MAX_SPEC_BYTES:
            raise CostModelError(f"{path}: over {MAX_SPEC_BYTES:,} bytes, not a spec file")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CostModelError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise CostModelError(f"{path}: is a directory, expected a JSON file") from None
    except UnicodeDecodeError as exc:
        raise CostModelError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise CostModelError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise CostModelError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    except ValueError as exc:
        raise CostModelError(f"{path}: invalid JSON ({exc})") from None
    except RecursionError:
        raise CostModelError(f"{path}: invalid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise CostModelError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def check_keys(
    data: Mapping[str, object], *, allowed: Iterable[str], required: Iterable[str], source: str
) -> None:
    """Reject unknown keys (typos must not be silently ignored) and missing required ones."""
    allowed_set = set(allowed)
    for key in data:
        if key not in allowed_set:
            known = ", ".join(sorted(allowed_set))
            raise CostModelError(f"{source}: unknown key {shown(key)} (known keys: {known})")
    for key in required:
        if key not in data:
            raise CostModelError(f"{source}: missing key {key!r}")


# Integers past 2^53 lose precision as floats, and the cost model computes in floats.
MAX_SPEC_INT = 2**53


def positive_int(value: object, field: str, source: str) -> int:
    """``value`` as an int in [1, 2^53]; bools and floats are rejected (2.5 layers is a
    typo)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CostModelError(f"{source}: {field} must be a positive integer, got {shown(value)}")
    if value > MAX_SPEC_INT:
        raise CostModelError(f"{source}: {field} must be at most 2^53, got {shown(value)}")
    return value


def _finite(value: object) -> TypeGuard[int | float]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_SPEC_INT  # a huge int has no float (and is never meant)
    return math.isfinite(value)


def positive_float(value: object, field: str, source: str) -> float:
    """``value`` as a finite float > 0 (ints accepted)."""
    if not _finite(value) or value <= 0:
        raise CostModelError(
            f"{source}: {field} must be a positive finite number, got {shown(value)}"
        )
    return float(value)


def nonnegative_float(value: object, field: str, source: str) -> float:
    """``value`` as a finite float >= 0 (ints accepted)."""
    if not _finite(value) or value < 0:
        raise CostModelError(
            f"{source}: {field} must be a non-negative finite number, got {shown(value)}"
        )
    return float(value)


def fraction(value: object, field: str, source: str) -> float:
    """``value`` as a float in (0, 1] — efficiencies and memory utilization."""
    number = positive_float(value, field, source)
    if number > 1.0:
        raise CostModelError(f"{source}: {field} must be in (0, 1], got {shown(value)}")
    return number


def nonempty_str(value: object, field: str, source: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CostModelError(f"{source}: {field} must be a non-empty string, got {shown(value)}")
    return value
