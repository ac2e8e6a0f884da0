"""Synthetic arrival processes: Poisson, or Gamma renewal with a chosen burstiness (CV).

Arrival times are points of a renewal process started at t = 0 (the first request arrives one
gap after 0), rounded to whole microseconds so written files stay short and exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from workloads.errors import SpecError

_TIME_DECIMALS = 6  # 1 microsecond


class ArrivalKind(str, Enum):
    """Inter-arrival distribution: exponential (Poisson, CV 1) or Gamma (any CV)."""

    POISSON = "poisson"
    GAMMA = "gamma"


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrivalProcess:
    """A renewal arrival process.

    Attributes:
        rate_per_s: mean arrival rate in requests per second (> 0).
        kind: poisson (exponential gaps) or gamma.
        cv: coefficient of variation of the gaps (std / mean); 1 is Poisson-like, > 1 bursty,
            < 1 more regular than Poisson. Only gamma may use a CV other than 1.
    """

    rate_per_s: float
    kind: ArrivalKind = ArrivalKind.POISSON
    cv: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ArrivalKind(self.kind))
        if not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise SpecError(f"rate must be a positive number of requests/s, got {self.rate_per_s}")
        if not (self.cv > 0 and math.isfinite(self.cv)):
            raise SpecError(f"cv must be a positive number, got {self.cv}")
        if self.kind is ArrivalKind.POISSON and self.cv != 1.0:
            raise SpecError(f"poisson arrivals have cv 1 (got {self.cv}); use gamma for another cv")

    def gaps(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Draw ``count`` inter-arrival gaps in seconds."""
        mean = 1.0 / self.rate_per_s
        if self.kind is ArrivalKind.POISSON:
            return rng.exponential(mean, count)
        shape = 1.0 / self.cv**2  # Gamma(k, theta): mean k*theta, CV 1/sqrt(k)
        return rng.gamma(shape, mean / shape, count)

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> np.ndarray:
        """Arrival times in seconds: the first ``num_requests``, or all before ``duration_s``.

        Exactly one of the two must be given.
        """
        if (num_requests is None) == (duration_s is None):
            raise SpecError("give exactly one of num_requests and duration_s")
        if num_requests is not None:
            if num_requests < 1:
                raise SpecError(f"num_requests must be >= 1, got {num_requests}")
            times = np.cumsum(self.gaps(rng, num_requests))
        else:
            times = self._times_until(rng, float(duration_s))  # type: ignore[arg-type]
        return np.round(times, _TIME_DECIMALS)

    def _times_until(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        if not (duration_s > 0 and math.isfinite(duration_s)):
            raise SpecError(f"duration must be a positive number of seconds, got {duration_s}")
        # Draw in chunks sized from the expected count; the chunk sizes depend only on the
        # inputs, so the same seed always consumes the same random numbers.
        chunk = int(self.rate_per_s * duration_s * 1.1) + 64
        chunks: list[np.ndarray] = []
        start = 0.0
        while start < duration_s:
            times = start + np.cumsum(self.gaps(rng, chunk))
            chunks.append(times)
            start = float(times[-1])
        times = np.concatenate(chunks)
        return times[times < duration_s]
