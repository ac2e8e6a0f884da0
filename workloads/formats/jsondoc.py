"""JSON document traces: ``{"kvsim_trace": 1, "name", "hash_block_size", "requests": [...]}``.

The whole document is parsed at once; use JSON Lines for traces too large for memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workloads.errors import TraceFormatError
from workloads.formats.jsonl import (
    build_trace,
    decoded_with_duplicates,
    duplicate_key,
    keys_in,
    parse_json_text,
)
from workloads.formats.records import (
    DuplicateTracker,
    json_type_name,
    metadata_record,
    parse_metadata,
    record_from_request,
    request_from_record,
)
from workloads.formats.textio import atomic_text_writer, decode_document, read_document
from workloads.request import Request, Trace


def load_json(path: str | Path) -> Trace:
    """Read a JSON document trace; errors in a request name its index as ``requests[i]``."""
    data = read_document(path)
    if not data.strip():
        raise TraceFormatError("file is empty", path=path)
    text = decode_document(data, path)
    document = parse_json_text(text, path)
    _refuse_duplicates(text, document, path)
    try:
        if not isinstance(document, dict):
            raise TraceFormatError(
                f'expected a JSON object with "kvsim_trace": 1, got {json_type_name(document)}'
            )
        metadata = parse_metadata(document, extra_keys=("requests",))
        records = document.get("requests")
        if not isinstance(records, list):
            raise TraceFormatError(
                f"requests must be an array, got {json_type_name(records)}", field="requests"
            )
    except TraceFormatError as err:
        raise err.located(path) from None
    requests: list[Request] = []
    duplicates = DuplicateTracker()
    for index, record in enumerate(records):
        try:
            if not isinstance(record, dict):
                raise TraceFormatError(f"expected a JSON object, got {json_type_name(record)}")
            request = request_from_record(record, metadata.hash_block_size)
            duplicates.check(request.request_id, index, "record")
        except TraceFormatError as err:
            raise err.located(path, record=index) from None
        requests.append(request)
    return build_trace(path, metadata, requests)


def _refuse_duplicates(text: str, document: Any, path: str | Path) -> None:
    """A key given twice in the document or in a request: one line naming it (and the record),
    never the last value silently."""
    again = decoded_with_duplicates(text, keys_in(document))
    if again is None:
        return
    if isinstance(again, dict) and getattr(again, "duplicate", None) is not None:
        key = again.duplicate  # type: ignore[attr-defined]
        raise TraceFormatError(f"field {key!r} is given twice", field=key).located(path)
    records = again.get("requests") if isinstance(again, dict) else None
    for index, record in enumerate(records if isinstance(records, list) else []):
        if (key := duplicate_key(record)) is not None:
            raise TraceFormatError(f"field {key!r} is given twice", field=key).located(
                path, record=index
            )
    if (key := duplicate_key(again)) is not None:
        raise TraceFormatError(f"field {key!r} is given twice", field=key).located(path)


def save_json(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as a JSON document, one request per line for readable diffs, atomically."""
    header = json.dumps(metadata_record(trace.name, trace.hash_block_size))
    with atomic_text_writer(path) as file:
        file.write(header[:-1] + ', "requests": [\n')
        last = len(trace.requests) - 1
        for index, request in enumerate(trace.requests):
            file.write(json.dumps(record_from_request(request), allow_nan=False))
            file.write(",\n" if index < last else "\n")
        file.write("]}\n")
