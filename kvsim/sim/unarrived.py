"""What ``--until`` left out: the requests of the trace that had not arrived when the run
stopped. They are in no table or figure, so the run says how many there were and when they
would have come. Under ``--rate`` every gap of the trace, the first included, is scaled by the
same factor (docs/formats.md, "Rescaling"): a trace whose second request comes 4.3 s after its
first, replayed at a seventh of its rate, has it at 33 s."""

from __future__ import annotations

from workloads import Trace


def unarrived_warning(
    trace: Trace, arrived: int, until_s: float | None, rate: float | None = None
) -> str | None:
    """One line when the run stopped at ``until_s`` (s) with only the first ``arrived`` of
    ``trace``'s requests (the trace as replayed, rescaled) submitted; None when all came.
    ``rate``: the ``--rate`` asked, named with the span it gave the trace."""
    total = len(trace.requests)
    if until_s is None or arrived >= total:
        return None
    left = trace.requests[arrived:]
    first, last = left[0].arrival_time_s, left[-1].arrival_time_s
    when = f"at {first:,.4g} s" if len(left) == 1 else f"from {first:,.4g} s to {last:,.4g} s"
    scaled = ""
    if rate is not None:
        scaled = (
            f"; at --rate {rate:g} req/s the trace spans {last:,.4g} s (every gap scaled alike, "
            "the first one too)"
        )
    return (
        f"--until {until_s:g} s: {arrived:,} of the trace's {total:,} requests arrived; the "
        f"other {total - arrived:,} would arrive {when} and are not simulated{scaled}"
    )
