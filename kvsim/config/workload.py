"""RunConfig's workload options: how the trace's requests arrive (rate, closed loop, seed,
window)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.option_spec import (
    MAX_CONCURRENCY,
    MAX_SEED,
    above,
    at_least,
    option,
)


@dataclass(frozen=True, kw_only=True)
class WorkloadOptions:
    """RunConfig's workload options (kvsim/config/run_config.py puts the groups together in this
    order; each field is defined once, here)."""

    rate: float | None = option(
        None,
        help="Rescale arrivals to this mean rate",
        unit="REQ/S",
        default_text="the trace's",
        sweep="axis",
        sweep_help="Request rates to sweep (requests/s), e.g. 1,2,4,8",
        # faster, two arrivals fall within a microsecond, the resolution kvsim keeps times at
        check=above(0, maximum=1e6, why=" requests/s (arrivals a microsecond apart)"),
    )
    time_scale: float | None = option(
        None,
        help="Multiply arrival times by this factor",
        unit="FACTOR",
        default_text="1",
        check=above(0),
    )
    concurrency: int | None = option(
        None,
        help="Closed loop: this many users, one request each in flight",
        unit="USERS",
        default_text="open loop",
        check=at_least(1, maximum=MAX_CONCURRENCY),
    )
    think_time_s: float = option(
        0.0,
        help="Closed loop: mean think time between a user's requests",
        unit="SECONDS",
        flag="--think-time",
        check=at_least(0, maximum=2.0**32),
    )
    seed: int = option(
        0, help="Seed for every random choice", unit="INT", check=at_least(0, maximum=MAX_SEED)
    )
    until: float | None = option(
        None,
        help="Stop at this simulated time",
        unit="SECONDS",
        default_text="the end",
        check=above(0),
    )
