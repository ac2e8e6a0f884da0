"""Length-only CSVs (num_prefill_tokens, num_decode_tokens), e.g. ShareGPT statistics from
microsoft/sarathi-serve, paired with a synthetic arrival process.

Rows keep their file order; the i-th kept row arrives at the i-th arrival time, shifted so the
first arrives at 0 like every imported trace. Rows with 0 prefill or 0 decode tokens are dropped
and counted. Extra columns are ignored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.arrivals import ARRIVAL_DECIMALS, ArrivalProcess, as_rng, check_num_requests
from workloads.errors import TraceFormatError, WorkloadError
from workloads.importers.common import ImportResult, iter_csv_rows, located, parse_count
from workloads.request import Request, Trace

COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
_EMPTY_PROMPT = "0 prefill tokens"
_EMPTY_OUTPUT = "0 decode tokens"


def import_lengths(
    path: str | Path,
    *,
    arrivals: ArrivalProcess,
    seed: int | np.random.Generator = 0,
    num_requests: int | None = None,
    name: str | None = None,
) -> ImportResult:
    """Convert a length-only CSV, drawing arrival times from ``arrivals`` with ``seed``.

    ``num_requests`` keeps the first N usable rows (default: all); asking for more rows than
    the file has raises WorkloadError. Request ids are 0-based data-row numbers. The first
    request arrives at 0 and each later one a drawn gap after the one before.
    """
    rng = as_rng(seed)  # bad options fail before the file is read
    if num_requests is not None:
        check_num_requests(num_requests)
    rows: list[tuple[str, int, int]] = []
    dropped = {_EMPTY_PROMPT: 0, _EMPTY_OUTPUT: 0}
    num_rows = 0
    for line, (prefill, decode) in iter_csv_rows(path, COLUMNS):
        try:
            prompt = parse_count(prefill, "num_prefill_tokens")
            output = parse_count(decode, "num_decode_tokens")
        except TraceFormatError as err:
            raise located(err, path, line) from None
        num_rows += 1
        if prompt == 0 or output == 0:
            dropped[_EMPTY_PROMPT if prompt == 0 else _EMPTY_OUTPUT] += 1
            continue
        rows.append((str(num_rows - 1), prompt, output))
    if num_requests is not None:
        if num_requests > len(rows):
            raise WorkloadError(
                f"{path}: asked for {num_requests} requests "
                f"but the file has {len(rows)} usable rows"
            )
        rows = rows[:num_requests]
    if not rows:
        raise TraceFormatError("no usable rows", path=path)
    times = arrivals.times(rng, num_requests=len(rows))
    # A renewal process's first point is one gap after 0; an imported trace starts at 0.
    shifted = np.round(times - times[0], ARRIVAL_DECIMALS).tolist()
    requests = [
        Request(request_id=rid, arrival_time_s=t, prompt_tokens=p, output_tokens=o)
        for (rid, p, o), t in zip(rows, shifted, strict=True)
    ]
    trace = Trace(name=name or Path(path).stem, hash_block_size=None, requests=requests)
    return ImportResult(
        trace=trace, num_rows=num_rows, dropped={k: v for k, v in dropped.items() if v}
    )
