"""Synthetic arrival processes: Poisson, or Gamma renewal with a chosen burstiness (CV).

Arrival times are points of a renewal process started at t = 0 (the first request arrives one
gap after 0), rounded to whole microseconds so written files stay short and exact.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from workloads.errors import SpecError
from workloads.limits import (
    MAX_CV,
    MAX_GENERATED_REQUESTS,
    MAX_TIME_S,
    MIN_GAMMA_CV,
    is_integer,
    is_number,
)

if TYPE_CHECKING:
    import numpy as np

ARRIVAL_DECIMALS = 6  # arrival times are rounded to 1 microsecond


class ArrivalKind(str, Enum):
    """Inter-arrival distribution: exponential (Poisson, CV 1) or Gamma (any CV)."""

    POISSON = "poisson"
    GAMMA = "gamma"


def as_rng(seed: int | np.random.Generator) -> np.random.Generator:
    """A Generator from a seed (an integer >= 0), or the Generator itself to share one stream.

    Raises SpecError for a negative or non-integer seed (numpy's own error names no option).
    """
    import numpy as np  # here, not at the top: `kvsim --help` needs ArrivalKind, not numpy

    if isinstance(seed, np.random.Generator):
        return seed
    if not is_integer(seed) or seed < 0:
        raise SpecError(f"seed must be an integer >= 0, got {seed!r}")
    return np.random.default_rng(operator.index(seed))


def check_num_requests(num_requests: object) -> int:
    """``num_requests`` as an int, or SpecError unless it is 1 to MAX_GENERATED_REQUESTS."""
    if not is_integer(num_requests) or not 1 <= num_requests <= MAX_GENERATED_REQUESTS:
        raise SpecError(
            f"num_requests must be an integer from 1 to {MAX_GENERATED_REQUESTS:,}, "
            f"got {num_requests!r}"
        )
    return operator.index(num_requests)


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrivalProcess:
    """A renewal arrival process.

    Attributes:
        rate_per_s: mean arrival rate in requests per second (> 0, finite).
        kind: poisson (exponential gaps) or gamma.
        cv: coefficient of variation of the gaps (std / mean); 1 is Poisson-like, > 1 bursty,
            < 1 more regular than Poisson. Only gamma may use a CV other than 1; gamma's CV is
            MIN_GAMMA_CV to MAX_CV (0.001 to 100).
    """

    rate_per_s: float
    kind: ArrivalKind = ArrivalKind.POISSON
    cv: float = 1.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", ArrivalKind(self.kind))
        except ValueError:
            names = ", ".join(kind.value for kind in ArrivalKind)
            raise SpecError(f"arrival kind must be one of {names}, got {self.kind!r}") from None
        if not (is_number(self.rate_per_s) and 0 < self.rate_per_s < math.inf):
            raise SpecError(f"rate must be a positive number of requests/s, got {self.rate_per_s}")
        if not (is_number(self.cv) and self.cv > 0 and math.isfinite(self.cv)):
            raise SpecError(f"cv must be a positive number, got {self.cv}")
        if self.kind is ArrivalKind.POISSON and self.cv != 1.0:
            raise SpecError(f"poisson arrivals have cv 1 (got {self.cv}); use gamma for another cv")
        if not MIN_GAMMA_CV <= self.cv <= MAX_CV:
            raise SpecError(
                f"cv must be from {MIN_GAMMA_CV} to {MAX_CV:g}, got {self.cv} (beyond 100 nearly "
                "every Gamma gap underflows to 0 and the drawn rate no longer matches --rate)"
            )

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

        Exactly one of the two must be given. Raises SpecError when the times would pass
        MAX_TIME_S (2^32 s) or more than MAX_GENERATED_REQUESTS would be drawn.
        """
        import numpy as np

        if (num_requests is None) == (duration_s is None):
            raise SpecError("give exactly one of num_requests and duration_s")
        if num_requests is not None:
            times = np.cumsum(self.gaps(rng, check_num_requests(num_requests)))
        else:
            times = self._times_until(rng, duration_s)
        if len(times) and times[-1] > MAX_TIME_S:
            raise SpecError(
                f"at {self.rate_per_s:g} requests/s, {len(times):,} arrivals reach "
                f"{times[-1]:.3g} s, past the {MAX_TIME_S:.0f} s (2^32 s) a trace may span; "
                "raise the rate or ask for fewer requests"
            )
        return np.round(times, ARRIVAL_DECIMALS)

    def _times_until(self, rng: np.random.Generator, duration_s: object) -> np.ndarray:
        import numpy as np

        if not (is_number(duration_s) and 0 < duration_s <= MAX_TIME_S):
            raise SpecError(
                f"duration must be a positive number of seconds up to {MAX_TIME_S:.0f} (2^32), "
                f"got {duration_s}"
            )
        duration = float(duration_s)
        expected = self.rate_per_s * duration
        if expected > MAX_GENERATED_REQUESTS:
            raise SpecError(
                f"{self.rate_per_s:g} requests/s for {duration:g} s is about {expected:.3g} "
                f"requests, more than the {MAX_GENERATED_REQUESTS:,} one trace may hold"
            )
        # Draw in chunks sized from the expected count; the chunk sizes depend only on the
        # inputs, so the same seed always consumes the same random numbers.
        chunk = int(expected * 1.1) + 64
        chunks: list[np.ndarray] = []
        drawn = 0
        start = 0.0
        while start < duration:
            if drawn > 2 * MAX_GENERATED_REQUESTS:  # a burst far beyond the expected count
                raise SpecError(
                    f"more than {MAX_GENERATED_REQUESTS:,} arrivals fall within {duration:g} s"
                )
            times = start + np.cumsum(self.gaps(rng, chunk))
            chunks.append(times)
            drawn += chunk
            start = float(times[-1])
        times = np.concatenate(chunks)
        kept = times[times < duration]
        if len(kept) > MAX_GENERATED_REQUESTS:
            raise SpecError(
                f"{len(kept):,} arrivals fall within {duration:g} s, more than the "
                f"{MAX_GENERATED_REQUESTS:,} one trace may hold"
            )
        return kept
