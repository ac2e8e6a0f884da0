"""Token-length SPECs for synthetic traces, e.g. ``fixed:512`` or ``lognormal:1000:1.0``.

SPEC syntax (lengths in tokens, every result at least 1 and at most 2^30; numbers in ASCII
digits; MEAN from 1 to 2^30 and CV from 0 to 100):

- ``fixed:N`` (or just ``N``): always N.
- ``uniform:LO:HI``: integers uniform on [LO, HI], both included.
- ``lognormal:MEAN:CV[:MAX]``: lognormal with that mean and coefficient of variation, rounded,
  clipped to [1, MAX] (MAX defaults to MAX_TOKENS, 2^30).
- ``trace:NAME``: resampled with replacement from a shipped trace (e.g. ``azure_llm_2023_conv``)
  or a kvsim trace file; the prompt SPEC draws prompt lengths, the output SPEC output lengths.
  When both SPECs name the same trace, whole requests are resampled so the two stay paired.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from workloads.errors import (
    OversizedInteger,
    SpecError,
    int_or_oversized,
    shorten,
    show_value,
)
from workloads.limits import MAX_CV, MAX_TOKENS
from workloads.shipped import resolve_trace

if TYPE_CHECKING:
    import numpy as np

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


# ASCII digits only: int() and float() would also take "1_5" and full-width digits.
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
_DECIMAL = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")


def _bad_spec(spec: str, problem: str) -> SpecError:
    return SpecError(f"bad length SPEC {shorten(spec)!r}: {problem}")


def _int(text: str, spec: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise _bad_spec(spec, f"{shorten(text)!r} is not an integer")
    value = int_or_oversized(text)
    if isinstance(value, OversizedInteger) or not 1 <= value <= MAX_TOKENS:
        raise _bad_spec(
            spec, f"lengths must be >= 1 and <= {MAX_TOKENS} (2^30 tokens), got {show_value(value)}"
        )
    return value


def _number(text: str, spec: str, low: float, high: float, what: str) -> float:
    if not _DECIMAL.fullmatch(text):
        raise _bad_spec(spec, f"{shorten(text)!r} is not a number")
    value = float(text)
    if not low <= value <= high:
        raise _bad_spec(
            spec, f"{shorten(text)!r} is out of range ({what} must be from {low:g} to {high:.10g})"
        )
    return value


def parse_length_spec(spec: str) -> LengthSpec:
    """Parse a SPEC string (see the module docstring); raises SpecError naming the problem.

    Lengths (N, LO, HI, MAX, MEAN) are 1 to MAX_TOKENS (2^30) tokens and CV is 0 to MAX_CV;
    numbers use ASCII digits.
    """
    if type(spec) is not str:
        raise SpecError(f"a length SPEC must be a string, got {shorten(repr(spec))}")
    kind, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    if not rest and _INTEGER.fullmatch(kind):
        return LengthSpec(kind=LengthKind.FIXED, params=(_int(kind, spec),))
    if kind == "fixed" and len(args) == 1:
        return LengthSpec(kind=LengthKind.FIXED, params=(_int(args[0], spec),))
    if kind == "uniform" and len(args) == 2:
        low, high = _int(args[0], spec), _int(args[1], spec)
        if low > high:
            raise _bad_spec(spec, "LO must be <= HI")
        return LengthSpec(kind=LengthKind.UNIFORM, params=(low, high))
    if kind == "lognormal" and len(args) in (2, 3):
        mean = _number(args[0], spec, 1, MAX_TOKENS, "MEAN")
        cv = _number(args[1], spec, 0, MAX_CV, "CV")
        cap = float(_int(args[2], spec)) if len(args) == 3 else math.inf
        return LengthSpec(kind=LengthKind.LOGNORMAL, params=(mean, cv, cap))
    if kind == "trace" and rest:
        return LengthSpec(kind=LengthKind.TRACE, source=rest)
    raise SpecError(f"bad length SPEC {shorten(spec)!r}; expected {SPEC_HELP}")


def trace_lengths(source: str) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of a shipped trace name or a trace file, as int64 arrays."""
    import numpy as np  # here, not at the top: `kvsim --help` needs SPEC_HELP, not numpy

    from workloads.formats import load_trace

    trace = load_trace(resolve_trace(source))
    prompt = np.fromiter((r.prompt_tokens for r in trace.requests), np.int64, len(trace))
    output = np.fromiter((r.output_tokens for r in trace.requests), np.int64, len(trace))
    return prompt, output


def sample_lengths(
    spec: LengthSpec, count: int, rng: np.random.Generator, *, column: str = "prompt"
) -> np.ndarray:
    """Draw ``count`` lengths (int64, each >= 1); for TRACE, ``column`` is "prompt" or "output"."""
    import numpy as np

    if spec.kind is LengthKind.FIXED:
        return np.full(count, int(spec.params[0]), dtype=np.int64)
    if spec.kind is LengthKind.UNIFORM:
        low, high = int(spec.params[0]), int(spec.params[1])
        return rng.integers(low, high + 1, count, dtype=np.int64)
    if spec.kind is LengthKind.LOGNORMAL:
        mean, cv, cap = spec.params
        sigma2 = math.log1p(cv * cv)  # the lognormal with this mean and CV
        draws = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), count)
        return np.clip(np.rint(draws), 1, min(cap, MAX_TOKENS)).astype(np.int64)
    assert spec.source is not None
    prompt, output = trace_lengths(spec.source)
    values = prompt if column == "prompt" else output
    return values[rng.integers(0, len(values), count)]
