"""BurstGPT traces (HPMLL/BurstGPT): Timestamp, Model, Request tokens, Response tokens, ...

Timestamp is seconds; the earliest kept one is subtracted so arrivals start at 0. Rows with
0 response tokens are failed requests in BurstGPT: dropped and counted, as are rows with
0 request tokens.
"""

from __future__ import annotations

from pathlib import Path

from workloads.errors import TraceFormatError
from workloads.importers.common import (
    ImportResult,
    iter_csv_rows,
    located,
    located_request,
    parse_count,
    parse_seconds,
)
from workloads.limits import MAX_TIME_S
from workloads.request import Trace

COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
FAILED = "failed (0 response tokens)"
EMPTY_PROMPT = "0 request tokens"


def import_burstgpt(path: str | Path, *, name: str | None = None) -> ImportResult:
    """Convert a BurstGPT CSV; request ids are 0-based data-row numbers."""
    rows: list[tuple[int, str, float, int, int]] = []  # (line, request id, s, prompt, output)
    dropped = {FAILED: 0, EMPTY_PROMPT: 0}
    num_rows = 0
    for line, (stamp, request_tokens, response_tokens) in iter_csv_rows(path, COLUMNS):
        try:
            seconds = parse_seconds(stamp, "Timestamp")
            if not 0 <= seconds <= MAX_TIME_S:  # seconds since the collection began
                raise TraceFormatError(
                    f"Timestamp must be from 0 to {MAX_TIME_S:.0f} s (2^32 s), got {stamp}",
                    field="Timestamp",
                )
            prompt = parse_count(request_tokens, "Request tokens")
            output = parse_count(response_tokens, "Response tokens")
        except TraceFormatError as err:
            raise located(err, path, line) from None
        num_rows += 1
        if output == 0 or prompt == 0:
            dropped[FAILED if output == 0 else EMPTY_PROMPT] += 1
            continue
        rows.append((line, str(num_rows - 1), seconds, prompt, output))
    if not rows:
        raise TraceFormatError("no usable rows", path=path)
    start = min(row[2] for row in rows)
    requests = [
        located_request(
            path, line, request_id=rid, arrival_time_s=t - start, prompt_tokens=p, output_tokens=o
        )
        for line, rid, t, p, o in rows
    ]
    trace = Trace(name=name or Path(path).stem, hash_block_size=None, requests=requests)
    return ImportResult(
        trace=trace, num_rows=num_rows, dropped={k: v for k, v in dropped.items() if v}
    )
