"""A sweep's service-level objectives: the latency bounds a point must meet to be recommended,
their defaults, and ``--slo ttft_p99=2s,tpot_p99=100ms`` (docs/sweeps.md, "Recommendation").

A sweep without an SLO of its own is judged against the defaults: p99 TTFT at most 2 s (an
interactive first answer) and p99 TPOT at most 200 ms (5 tokens/s, about reading speed, for
the slowest requests). ``--slo`` (or ``--slo-ttft`` / ``--slo-tpot`` / ``--slo-percentile``)
replaces them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvsim.analysis.load import PERCENTILES
from kvsim.sweep.spec import SweepError, SweepSpec

DEFAULT_TTFT_S = 2.0
DEFAULT_TPOT_S = 0.2
DEFAULT_PERCENTILE = 99
# --slo's metrics: name -> (sweep.csv column stem, words)
METRICS = {"ttft": ("ttft_s", "TTFT"), "tpot": ("tpot_s", "TPOT")}
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(s|ms|us)?\s*$", re.I)


@dataclass(frozen=True, slots=True)
class Bound:
    """One objective: the ``percentile`` of ``metric`` (``ttft`` or ``tpot``) at most
    ``bound_s`` seconds."""

    metric: str
    percentile: int
    bound_s: float

    @property
    def column(self) -> str:
        """The sweep.csv column it bounds, e.g. ``ttft_s_p99``."""
        return f"{METRICS[self.metric][0]}_p{self.percentile}"

    @property
    def name(self) -> str:
        return f"p{self.percentile} {METRICS[self.metric][1]}"

    @property
    def text(self) -> str:
        """``p99 TTFT ≤ 2 s``."""
        return f"{self.name} ≤ {seconds_text(self.bound_s)}"


def seconds_text(value: float) -> str:
    """A duration as typed: ``2 s``, ``200 ms``, ``1.5 s``."""
    if value < 1:
        return f"{value * 1000:.4g} ms"
    return f"{value:.4g} s"


def bounds(spec: SweepSpec) -> tuple[Bound, ...]:
    """The SLO a sweep's points are judged by: its own, or the defaults."""
    if not spec.has_slo:
        return (
            Bound("ttft", DEFAULT_PERCENTILE, DEFAULT_TTFT_S),
            Bound("tpot", DEFAULT_PERCENTILE, DEFAULT_TPOT_S),
        )
    p = spec.slo_percentile
    given = (("ttft", spec.slo_ttft_s), ("tpot", spec.slo_tpot_s))
    return tuple(Bound(m, p, v) for m, v in given if v is not None)


def slo_text(spec: SweepSpec) -> str:
    """``p99 TTFT ≤ 2 s and p99 TPOT ≤ 200 ms`` (``(default)`` appended when not given)."""
    text = " and ".join(b.text for b in bounds(spec))
    return text if spec.has_slo else f"{text} (default; --slo to change)"


def misses(row: pd.Series, slo: tuple[Bound, ...]) -> list[str]:
    """Why ``row`` misses ``slo``, one phrase per bound it misses (``p99 TTFT 3.10 s > 2 s``;
    a bound with no value, e.g. no TPOT, is missed): empty when it meets them all."""
    out = []
    for b in slo:
        value = row.get(b.column)
        if value is None or pd.isna(value):
            out.append(f"no {b.name} measured")
        elif float(value) > b.bound_s:
            out.append(f"{b.name} {seconds_text(float(value))} > {seconds_text(b.bound_s)}")
    return out


def met(frame: pd.DataFrame, spec: SweepSpec) -> pd.Series:
    """Whether each point met the SLO: status ok and every bound met."""
    ok = frame["status"] == "ok"
    for b in bounds(spec):
        if b.column not in frame:
            return pd.Series(False, index=frame.index)
        ok &= frame[b.column].astype(float).le(b.bound_s).fillna(False)
    return ok.astype(bool)


def parse_duration(text: str) -> float:
    """``2s``, ``100ms``, ``2`` (seconds) as seconds."""
    m = _DURATION.match(text)
    if not m:
        raise SweepError(f"--slo: {text.strip()!r} is not a duration (e.g. 2s, 100ms)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()]
    if not 0 < value < math.inf:
        raise SweepError(f"--slo: {text.strip()!r} must be a duration > 0")
    return value


def parse_slo(text: str) -> dict[str, Any]:
    """``ttft_p99=2s,tpot_p99=100ms`` as SweepSpec's ``slo_ttft_s``, ``slo_tpot_s`` and
    ``slo_percentile`` (one percentile for every bound)."""
    out: dict[str, Any] = {}
    percentiles = set()
    for part in text.split(","):
        key, sep, value = part.partition("=")
        m = re.fullmatch(r"\s*(ttft|tpot)_p(\d+)\s*", key, re.I)
        if not sep or not m:
            raise SweepError(
                f"--slo wants metric_pN=duration,... (metrics: ttft, tpot; e.g. "
                f"ttft_p99=2s,tpot_p99=100ms); got {part.strip()!r}"
            )
        metric, p = m.group(1).lower(), int(m.group(2))
        if p not in PERCENTILES:
            raise SweepError(
                f"--slo {key.strip()}: the percentile must be one of "
                f"{', '.join(map(str, PERCENTILES))}"
            )
        name = f"slo_{metric}_s"
        if name in out:
            raise SweepError(f"--slo: {metric} given twice")
        out[name] = parse_duration(value)
        percentiles.add(p)
    if len(percentiles) > 1:
        given = ", ".join(f"p{p}" for p in sorted(percentiles))
        raise SweepError(f"--slo: one percentile for every bound, got {given}")
    out["slo_percentile"] = percentiles.pop()
    return out
