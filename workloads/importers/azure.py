"""Azure LLM inference traces 2023/2024 (Azure/AzurePublicDataset): TIMESTAMP,ContextTokens,
GeneratedTokens.

TIMESTAMP looks like ``2023-11-16 18:15:46.6805900`` (7-digit fraction, no zone; a zone, if
present, is honoured). It is parsed exactly to integer nanoseconds and the earliest is
subtracted, so arrival times start at 0 with no float rounding from the 2023 epoch.
Rows with 0 context or 0 generated tokens cannot be simulated; they are dropped and counted.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from workloads.errors import TraceFormatError, show_value
from workloads.importers.common import (
    ImportResult,
    iter_csv_rows,
    located,
    located_request,
    parse_count,
)
from workloads.request import Trace

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_NS_PER_S = 1_000_000_000
# [0-9], not \d: \d also matches other scripts' digits, which int() would then accept.
_TIMESTAMP = re.compile(
    r"\s*([0-9]{4}-[0-9]{2}-[0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"\s*(Z|[+-][0-9]{2}:?[0-9]{2})?\s*"
)


def parse_timestamp_ns(text: str) -> int:
    """Nanoseconds since 0001-01-01 (UTC if a zone is given) of an ISO-like timestamp."""
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        raise TraceFormatError(
            f"TIMESTAMP must look like 2023-11-16 18:15:46.6805900, got {show_value(text)}",
            field="TIMESTAMP",
        )
    date, hours, minutes, seconds, fraction, zone = match.groups()
    try:
        days = dt.date.fromisoformat(date).toordinal()
    except ValueError:
        raise TraceFormatError(f"TIMESTAMP has an invalid date {date}", field="TIMESTAMP") from None
    if int(hours) > 23 or int(minutes) > 59 or int(seconds) > 59:
        raise TraceFormatError(
            f"TIMESTAMP has an invalid time of day {hours}:{minutes}:{seconds}", field="TIMESTAMP"
        )
    total_s = days * 86_400 + int(hours) * 3_600 + int(minutes) * 60 + int(seconds)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        if int(digits[:2]) > 23 or int(digits[2:]) > 59:
            raise TraceFormatError(f"TIMESTAMP has an invalid zone {zone}", field="TIMESTAMP")
        total_s -= sign * (int(digits[:2]) * 3_600 + int(digits[2:]) * 60)
    return total_s * _NS_PER_S + int((fraction or "").ljust(9, "0"))


def import_azure(path: str | Path, *, name: str | None = None) -> ImportResult:
    """Convert an Azure LLM inference CSV; request ids are 0-based data-row numbers."""
    rows: list[tuple[int, str, int, int, int]] = []  # (line, request id, ns, prompt, output)
    dropped = {"0 context tokens": 0, "0 generated tokens": 0}
    num_rows = 0
    for line, (stamp, context, generated) in iter_csv_rows(path, COLUMNS):
        try:
            ns = parse_timestamp_ns(stamp)
            prompt = parse_count(context, "ContextTokens")
            output = parse_count(generated, "GeneratedTokens")
        except TraceFormatError as err:
            raise located(err, path, line) from None
        num_rows += 1
        if prompt == 0 or output == 0:
            dropped["0 context tokens" if prompt == 0 else "0 generated tokens"] += 1
            continue
        rows.append((line, str(num_rows - 1), ns, prompt, output))
    if not rows:
        raise TraceFormatError("no usable rows", path=path)
    start_ns = min(row[2] for row in rows)
    requests = [
        located_request(
            path,
            line,
            request_id=rid,
            arrival_time_s=(ns - start_ns) / _NS_PER_S,  # int / int: correctly rounded
            prompt_tokens=prompt,
            output_tokens=output,
        )
        for line, rid, ns, prompt, output in rows
    ]
    trace = Trace(name=name or Path(path).stem, hash_block_size=None, requests=requests)
    return ImportResult(
        trace=trace, num_rows=num_rows, dropped={k: v for k, v in dropped.items() if v}
    )
