"""CSV traces: an optional ``# {metadata JSON}`` first line, a header row, one request per row.

Columns have the request field names. Empty cells mean "not given". ``hash_ids`` is one cell
holding integers separated by spaces or semicolons.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from workloads.errors import OversizedInteger, TraceFormatError, int_or_oversized, show_value
from workloads.formats.jsonl import build_trace, parse_json_text
from workloads.formats.records import (
    DuplicateTracker,
    Metadata,
    metadata_record,
    parse_metadata,
    record_from_request,
    request_from_record,
)
from workloads.formats.textio import atomic_text_writer, iter_lines
from workloads.request import ALL_FIELDS, REQUIRED_FIELDS, Request, Trace

# ASCII digits only: int() and float() would also take "1_5" and full-width digits, which a
# trace must not hold. nan/inf are matched so that Request names them as non-finite.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)",
    re.IGNORECASE,
)
_HASH_SEPARATORS = re.compile(r"[ ;]+")
_TEXT_FIELDS = frozenset(("request_id", "session_id"))


def _number(cell: str) -> int | float | OversizedInteger | str:
    # Return the cell unchanged when it is no number, so Request names the bad value.
    text = cell.strip()
    if _INTEGER.fullmatch(text):
        return int_or_oversized(text)
    if _DECIMAL.fullmatch(text):
        return float(text)
    return cell


def _hash_ids(cell: str) -> list[int | OversizedInteger]:
    parts = [part for part in _HASH_SEPARATORS.split(cell.strip()) if part]
    if not all(_INTEGER.fullmatch(part) for part in parts):
        raise TraceFormatError(
            f"hash_ids must be integers separated by spaces or semicolons, got {show_value(cell)}",
            field="hash_ids",
        )
    return [int_or_oversized(part) for part in parts]


def _convert(column: str, cell: str) -> Any:
    if cell == "":
        return None
    if column in _TEXT_FIELDS:
        return cell
    if column == "hash_ids":
        return _hash_ids(cell)
    return _number(cell)


def _check_header(header: list[str]) -> list[str]:
    names = [name.strip() for name in header]
    for name in names:
        if name not in ALL_FIELDS:
            raise TraceFormatError(f"unknown column {show_value(name)}", field=name)
        if names.count(name) > 1:
            raise TraceFormatError(f"duplicate column {show_value(name)}", field=name)
    for name in REQUIRED_FIELDS:
        if name not in names:
            raise TraceFormatError(f"missing column {name}", field=name)
    return names


def _read_preamble(path: str | Path) -> tuple[Metadata, int, Iterator[str]]:
    """Return the metadata, the number of lines it took, and the remaining text lines."""
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None:
        raise TraceFormatError("file is empty", path=path)
    texts = (text for _, text in lines)
    if not first[1].startswith("#"):
        return Metadata(), 0, chain([first[1]], texts)
    obj = parse_json_text(first[1][1:], path, line=1)
    try:
        if not isinstance(obj, dict):
            raise TraceFormatError("the # line must hold a JSON metadata object")
        return parse_metadata(obj), 1, texts
    except TraceFormatError as err:
        raise err.located(path, line=1) from None


def load_csv(path: str | Path) -> Trace:
    """Read a CSV trace row by row (streaming)."""
    metadata, offset, texts = _read_preamble(path)
    reader = csv.reader(texts, strict=True)
    requests: list[Request] = []
    duplicates = DuplicateTracker()
    header: list[str] | None = None
    try:
        for row in reader:
            if not row:
                continue
            if header is None:
                header = _check_header(row)
                continue
            if len(row) != len(header):
                raise TraceFormatError(f"expected {len(header)} columns, got {len(row)}")
            record = {name: _convert(name, cell) for name, cell in zip(header, row)}
            request = request_from_record(record, metadata.hash_block_size)
            duplicates.check(request.request_id, reader.line_num + offset, "line")
            requests.append(request)
    except (TraceFormatError, csv.Error) as err:
        if isinstance(err, TraceFormatError) and err.path is not None:
            raise  # already located (bad UTF-8 while reading)
        located = err if isinstance(err, TraceFormatError) else TraceFormatError(str(err))
        raise located.located(path, line=reader.line_num + offset) from None
    if header is None:
        raise TraceFormatError("file has no header row" if offset else "file is empty", path=path)
    return build_trace(path, metadata, requests)


def _columns(trace: Trace) -> list[str]:
    # Optional columns appear only when some request uses them, so simple traces stay simple.
    used = {key for request in trace.requests for key in record_from_request(request)}
    return [name for name in ALL_FIELDS if name in used]


def save_csv(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as CSV (metadata comment line, header, rows), atomically."""
    columns = _columns(trace)
    with atomic_text_writer(path) as file:
        file.write("# " + json.dumps(metadata_record(trace.name, trace.hash_block_size)) + "\n")
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(columns)
        for request in trace.requests:
            record = record_from_request(request)
            if "hash_ids" in record:
                record["hash_ids"] = " ".join(map(str, record["hash_ids"]))
            writer.writerow([record.get(name, "") for name in columns])
