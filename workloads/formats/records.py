"""Shared rules for kvsim trace files: metadata headers and request records as plain dicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.errors import TraceFormatError, show_value
from workloads.request import (
    ALL_FIELDS,
    REQUIRED_FIELDS,
    Request,
    check_hash_block_size,
    check_hash_ids,
    check_trace_name,
)

FORMAT_VERSION = 1
VERSION_KEY = "kvsim_trace"
METADATA_KEYS = (VERSION_KEY, "name", "hash_block_size")
_ALLOWED_FIELDS = frozenset(ALL_FIELDS)
_REQUIRED = frozenset(REQUIRED_FIELDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Metadata:
    """A trace file's header: name (None means "use the file's stem") and hash_block_size."""

    name: str | None = None
    hash_block_size: int | None = None


def parse_metadata(obj: dict[str, Any], extra_keys: tuple[str, ...] = ()) -> Metadata:
    """Validate a header object ``{"kvsim_trace": 1, "name": ..., "hash_block_size": ...}``.

    Raises an unlocated TraceFormatError; the caller adds file and line.
    """
    for key in obj:
        if key not in METADATA_KEYS and key not in extra_keys:
            raise TraceFormatError(f"unknown metadata field {show_value(key)}", field=key)
    if VERSION_KEY not in obj:
        raise TraceFormatError(
            f"missing field {VERSION_KEY} (expected {FORMAT_VERSION})", field=VERSION_KEY
        )
    version = obj[VERSION_KEY]
    if type(version) is not int or version != FORMAT_VERSION:
        raise TraceFormatError(
            f"unsupported {VERSION_KEY} version {show_value(version)} "
            f"(this kvsim reads version {FORMAT_VERSION})",
            field=VERSION_KEY,
        )
    name = obj.get("name")
    if name is not None:
        check_trace_name(name)
    block = obj.get("hash_block_size")
    check_hash_block_size(block)
    return Metadata(name=name, hash_block_size=block)


def metadata_record(name: str, hash_block_size: int | None) -> dict[str, Any]:
    """The header object written at the top of every kvsim trace file."""
    return {VERSION_KEY: FORMAT_VERSION, "name": name, "hash_block_size": hash_block_size}


def request_from_record(record: dict[str, Any], hash_block_size: int | None) -> Request:
    """Build a Request from a decoded record (JSON types); ``null`` means "not given".

    Unknown fields are rejected (a typo such as ``ouput_tokens`` must not pass silently).
    """
    keys = record.keys()
    if not keys <= _ALLOWED_FIELDS:
        unknown = next(key for key in record if key not in _ALLOWED_FIELDS)
        if unknown == VERSION_KEY:
            raise TraceFormatError("the metadata line must be the first line", field=unknown)
        raise TraceFormatError(f"unknown field {show_value(unknown)}", field=unknown)
    if not keys >= _REQUIRED or None in record.values():  # rare: check and drop nulls
        for field in REQUIRED_FIELDS:
            if record.get(field) is None:
                raise TraceFormatError(f"missing field {field}", field=field)
        record = {key: value for key, value in record.items() if value is not None}
    request = Request(**record)
    check_hash_ids(request, hash_block_size)
    return request


def record_from_request(request: Request) -> dict[str, Any]:
    """The dict written for a request: required fields, plus optional ones that are set."""
    record: dict[str, Any] = {
        "request_id": request.request_id,
        "arrival_time_s": request.arrival_time_s,
        "prompt_tokens": request.prompt_tokens,
        "output_tokens": request.output_tokens,
    }
    if request.hash_ids is not None:
        record["hash_ids"] = list(request.hash_ids)
    if request.session_id is not None:
        record["session_id"] = request.session_id
    if request.cancel_after_s is not None:
        record["cancel_after_s"] = request.cancel_after_s
    if request.priority != 0:
        record["priority"] = request.priority
    return record


def json_type_name(value: object) -> str:
    """The JSON name of a decoded value's type, for messages ("array", "string", ...)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


class DuplicateTracker:
    """Remembers where each request_id was first seen, to name both places on a duplicate."""

    def __init__(self) -> None:
        self._first_seen: dict[str, int] = {}

    def check(self, request_id: str, where: int, unit: str) -> None:
        """Raise TraceFormatError if ``request_id`` was seen before (``unit``: "line"/"record")."""
        first = self._first_seen.setdefault(request_id, where)
        if first != where:
            raise TraceFormatError(
                f"duplicate request_id {show_value(request_id)} (first at {unit} {first})",
                field="request_id",
            )
