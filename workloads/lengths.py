"""Token-length SPECs for synthetic traces, e.g. ``fixed:512`` or ``lognormal:1000:1.0``.

SPEC syntax (lengths in tokens, every result at least 1):

- ``fixed:N`` (or just ``N``): always N.
- ``uniform:LO:HI``: integers uniform on [LO, HI], both included.
- ``lognormal:MEAN:CV[:MAX]``: lognormal with that mean and coefficient of variation, rounded,
  clipped to [1, MAX].
- ``trace:NAME``: resampled with replacement from a shipped trace (e.g. ``azure_llm_2023_conv``)
  or a kvsim trace file; the prompt SPEC draws prompt lengths, the output SPEC output lengths.
  When both SPECs name the same trace, whole requests are resampled so the two stay paired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from workloads.errors import SpecError
from workloads.formats import load_trace
from workloads.shipped import resolve_trace

SPEC_HELP = (
    "fixed:N | uniform:LO:HI | lognormal:MEAN:CV[:MAX] | trace:NAME "
    "(tokens; NAME a shipped trace or a kvsim trace file)"
)


class LengthKind(str, Enum):
    """The distribution a SPEC names."""

    FIXED = "fixed"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"
    TRACE = "trace"


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthSpec:
    """A parsed SPEC; build it with :func:`parse_length_spec`."""

    kind: LengthKind
    params: tuple[float, ...] = ()
    source: str | None = None  # trace name or path, for kind TRACE


def _int(text: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SpecError(f"bad length SPEC {spec!r}: {text!r} is not an integer") from None
    if value < 1:
        raise SpecError(f"bad length SPEC {spec!r}: lengths must be >= 1, got {value}")
    return value


def _positive(text: str, spec: str, allow_zero: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"bad length SPEC {spec!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise SpecError(f"bad length SPEC {spec!r}: {text!r} is out of range")
    return value


def parse_length_spec(spec: str) -> LengthSpec:
    """Parse a SPEC string (see the module docstring); raises SpecError naming the problem."""
    kind, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    if not rest and kind.strip().isdigit():
        return LengthSpec(kind=LengthKind.FIXED, params=(_int(kind, spec),))
    if kind == "fixed" and len(args) == 1:
        return LengthSpec(kind=LengthKind.FIXED, params=(_int(args[0], spec),))
    if kind == "uniform" and len(args) == 2:
        low, high = _int(args[0], spec), _int(args[1], spec)
        if low > high:
            raise SpecError(f"bad length SPEC {spec!r}: LO must be <= HI")
        return LengthSpec(kind=LengthKind.UNIFORM, params=(low, high))
    if kind == "lognormal" and len(args) in (2, 3):
        mean = _positive(args[0], spec)
        cv = _positive(args[1], spec, allow_zero=True)
        cap = float(_int(args[2], spec)) if len(args) == 3 else math.inf
        return LengthSpec(kind=LengthKind.LOGNORMAL, params=(mean, cv, cap))
    if kind == "trace" and rest:
        return LengthSpec(kind=LengthKind.TRACE, source=rest)
    raise SpecError(f"bad length SPEC {spec!r}; expected {SPEC_HELP}")


def trace_lengths(source: str) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of a shipped trace name or a trace file, as int64 arrays."""
    trace = load_trace(resolve_trace(source))
    prompt = np.fromiter((r.prompt_tokens for r in trace.requests), np.int64, len(trace))
    output = np.fromiter((r.output_tokens for r in trace.requests), np.int64, len(trace))
    return prompt, output


def sample_lengths(
    spec: LengthSpec, count: int, rng: np.random.Generator, *, column: str = "prompt"
) -> np.ndarray:
    """Draw ``count`` lengths (int64, each >= 1); for TRACE, ``column`` is "prompt" or "output"."""
    if spec.kind is LengthKind.FIXED:
        return np.full(count, int(spec.params[0]), dtype=np.int64)
    if spec.kind is LengthKind.UNIFORM:
        low, high = int(spec.params[0]), int(spec.params[1])
        return rng.integers(low, high + 1, count, dtype=np.int64)
    if spec.kind is LengthKind.LOGNORMAL:
        mean, cv, cap = spec.params
        sigma2 = math.log1p(cv * cv)  # the lognormal with this mean and CV
        draws = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), count)
        return np.clip(np.rint(draws), 1, cap).astype(np.int64)
    assert spec.source is not None
    prompt, output = trace_lengths(spec.source)
    values = prompt if column == "prompt" else output
    return values[rng.integers(0, len(values), count)]
