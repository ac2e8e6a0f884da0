"""Mooncake traces (kvcache-ai/Mooncake, FAST'25): JSON Lines with timestamp (ms),
input_length, output_length and hash_ids.

hash_ids hold one id per 512-token prompt block, each covering its block and every block before
it (a prefix chain), so the trace keeps them with ``hash_block_size = 512``. Extra keys are
ignored. Rows with 0 input or 0 output tokens are dropped and counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.errors import TraceFormatError, show_value
from workloads.formats.jsonl import parse_json_text
from workloads.formats.records import json_type_name
from workloads.formats.textio import iter_lines
from workloads.importers.common import ImportResult, parse_count
from workloads.limits import MAX_TIME_S
from workloads.request import Request, Trace, check_hash_block_size, check_hash_ids

MOONCAKE_BLOCK_TOKENS = 512
# A timestamp past 2^32 s (MAX_TIME_S) cannot resolve a microsecond, however small the shift
# to 0 that follows (ints are compared exactly, then converted).
_MAX_TIMESTAMP_MS = MAX_TIME_S * 1000
_EMPTY_PROMPT = "0 input tokens"
_EMPTY_OUTPUT = "0 output tokens"


def _timestamp_ms(value: object) -> float:
    # An int past float range would make the later shift to 0 raise OverflowError.
    if type(value) is int and 0 <= value <= _MAX_TIMESTAMP_MS:
        return float(value)
    if type(value) is float and 0 <= value <= _MAX_TIMESTAMP_MS:
        return value
    raise TraceFormatError(
        f"timestamp must be a number of milliseconds from 0 to {_MAX_TIMESTAMP_MS:.0f} "
        f"(2^32 s), got {show_value(value)}",
        field="timestamp",
    )


def _parse_row(obj: Any) -> tuple[float, int, int, object]:
    if not isinstance(obj, dict):
        raise TraceFormatError(f"expected a JSON object, got {json_type_name(obj)}")
    for key in ("timestamp", "input_length", "output_length"):
        if key not in obj:
            raise TraceFormatError(f"missing field {key}", field=key)
    return (
        _timestamp_ms(obj["timestamp"]),
        parse_count(obj["input_length"], "input_length"),
        parse_count(obj["output_length"], "output_length"),
        obj.get("hash_ids"),
    )


def _request(
    row_id: int, arrival_time_s: float, row: tuple[float, int, int, object], hash_block_size: int
) -> Request:
    _, prompt, output, hash_ids = row
    request = Request(
        request_id=str(row_id),
        arrival_time_s=arrival_time_s,
        prompt_tokens=prompt,
        output_tokens=output,
        hash_ids=hash_ids,  # type: ignore[arg-type]  # Request checks the type
    )
    check_hash_ids(request, hash_block_size)
    return request


def import_mooncake(
    path: str | Path, *, name: str | None = None, hash_block_size: int = MOONCAKE_BLOCK_TOKENS
) -> ImportResult:
    """Convert a Mooncake JSONL trace; request ids are 0-based data-row numbers."""
    if hash_block_size is None:
        raise TraceFormatError("hash_block_size must be a positive integer, got null")
    check_hash_block_size(hash_block_size)
    rows: list[tuple[int, int, tuple[float, int, int, object]]] = []  # (line, row id, row)
    dropped = {_EMPTY_PROMPT: 0, _EMPTY_OUTPUT: 0}
    num_rows = 0
    for line, text in iter_lines(path):
        if not text.strip():
            continue
        try:
            row = _parse_row(parse_json_text(text, path, line))
        except TraceFormatError as err:
            raise (err if err.path else err.located(path, line=line)) from None
        num_rows += 1
        if row[1] == 0 or row[2] == 0:
            dropped[_EMPTY_PROMPT if row[1] == 0 else _EMPTY_OUTPUT] += 1
            continue
        rows.append((line, num_rows - 1, row))
    if not rows:
        raise TraceFormatError("no usable rows" if num_rows else "file is empty", path=path)
    start = min(row[0] for _, _, row in rows)
    requests = []
    for line, row_id, row in rows:
        try:
            requests.append(_request(row_id, (row[0] - start) / 1000, row, hash_block_size))
        except TraceFormatError as err:
            raise err.located(path, line=line) from None
    trace = Trace(name=name or Path(path).stem, hash_block_size=hash_block_size, requests=requests)
    return ImportResult(
        trace=trace, num_rows=num_rows, dropped={k: v for k, v in dropped.items() if v}
    )
