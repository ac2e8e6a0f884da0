"""JSON Lines traces: an optional metadata line, then one request object per line (streamed)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workloads.errors import TraceFormatError, int_or_oversized
from workloads.formats.records import (
    VERSION_KEY,
    DuplicateTracker,
    Metadata,
    json_type_name,
    metadata_record,
    parse_metadata,
    record_from_request,
    request_from_record,
)
from workloads.formats.textio import atomic_text_writer, iter_lines
from workloads.request import Request, Trace

_DECODER = json.JSONDecoder()  # stateless; skips json.loads' per-call argument handling
# Only after _DECODER failed on an integer too long for int() (a rare error path, so the hot
# path keeps the C scanner's own int parsing): keeps such integers as OversizedInteger so the
# field that holds one is named in the error.
_OVERSIZED_DECODER = json.JSONDecoder(parse_int=int_or_oversized)


def parse_json_text(text: str, path: str | Path, line: int | None = None) -> Any:
    """``json.loads`` a line (``line`` given) or a whole document, locating syntax errors.

    Raises only TraceFormatError: an integer of more than 4,300 digits becomes an
    OversizedInteger for the field's check to refuse, nesting deeper than Python's recursion
    limit is malformed JSON.
    """
    try:
        try:
            return _DECODER.decode(text)
        except ValueError as err:
            if isinstance(err, json.JSONDecodeError):
                raise
            return _OVERSIZED_DECODER.decode(text)  # int() refused a literal's length
    except json.JSONDecodeError as err:
        if line is None:
            line, column = err.lineno, err.colno
        else:  # one line: a column past its end (the newline) reads better as its end
            column = min(err.pos, len(text.rstrip("\r\n"))) + 1
        raise TraceFormatError(
            f"malformed JSON: {err.msg} at column {column}", path=path, line=line
        ) from None
    except RecursionError:
        if line is None:  # a whole document: find the line, so the error can name it
            line, column = _deep_position(text)
        else:
            column = _deep_position(text)[1]
        raise TraceFormatError(
            f"malformed JSON: arrays or objects nested too deeply (more than {_DEEP} levels "
            f"at column {column})",
            path=path,
            line=line,
        ) from None


class _Pairs(dict):  # type: ignore[type-arg]
    """An object decoded by the duplicate-key check; ``duplicate`` names a repeated key."""

    duplicate: str | None = None


def _pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                obj.duplicate = key
                break
            seen.add(key)
    return obj


_PAIRS_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_int=int_or_oversized)


def _containers(value: Any) -> Iterator[Any]:
    """``value`` and every object or array inside it, without recursion (nesting may be as
    deep as the parser allows)."""
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        children = item.values() if isinstance(item, dict) else item
        stack.extend(v for v in children if isinstance(v, (dict, list)))


def keys_in(value: Any) -> int:
    """How many keys the decoded ``value``'s objects hold, all levels."""
    if not isinstance(value, (dict, list)):
        return 0
    return sum(len(c) for c in _containers(value) if isinstance(c, dict))


def decoded_with_duplicates(text: str, keys: int) -> Any:
    """``text`` decoded again, each object a ``_Pairs`` marking a repeated key, where it may
    hold one; None where it cannot: a key written twice leaves fewer keys than ``:``s, so
    ``keys`` (of the first decoding) equal to the colons proves there is none. Strings with a
    colon only cost this second decoding."""
    if text.count(":") == keys:
        return None
    return _PAIRS_DECODER.decode(text)


def duplicate_key(obj: Any) -> str | None:
    """A repeated key in a ``decoded_with_duplicates`` value (its top object's first)."""
    if not isinstance(obj, (dict, list)):
        return None
    for item in _containers(obj):
        if isinstance(item, _Pairs) and item.duplicate is not None:
            return item.duplicate
    return None


def _check_duplicates(text: str, obj: dict[str, Any]) -> None:
    """Refuse a record that gives a key twice (JSON would silently keep the last value)."""
    again = decoded_with_duplicates(text, keys_in(obj))
    if again is not None and (key := duplicate_key(again)) is not None:
        raise TraceFormatError(f"field {key!r} is given twice", field=key)


_DEEP = 100  # a kvsim record nests 3 levels; Python's parser gives up near 1,000
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _deep_position(text: str) -> tuple[int, int]:
    """1-based line and column where ``text`` first nests more than _DEEP levels (error path)."""
    depth = 0
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > _DEEP:
                start = match.start()
                return text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
        elif token in "]}":
            depth -= 1
    return 1, 1


def load_jsonl(path: str | Path) -> Trace:
    """Read a JSON Lines trace line by line; blank lines are skipped."""
    metadata = Metadata()
    requests: list[Request] = []
    duplicates = DuplicateTracker()
    seen_content = False
    for line, text in iter_lines(path):
        if not text.strip():
            continue
        obj = parse_json_text(text, path, line)
        try:
            if not isinstance(obj, dict):
                raise TraceFormatError(f"expected a JSON object, got {json_type_name(obj)}")
            if text.count(":") != len(obj):  # else no key can be given twice (a flat record)
                _check_duplicates(text, obj)
            if not seen_content and VERSION_KEY in obj:
                seen_content = True
                metadata = parse_metadata(obj)
                continue
            seen_content = True
            request = request_from_record(obj, metadata.hash_block_size)
            duplicates.check(request.request_id, line, "line")
        except TraceFormatError as err:
            raise err.located(path, line=line) from None
        requests.append(request)
    if not seen_content:
        raise TraceFormatError("file is empty", path=path)
    return build_trace(path, metadata, requests)


def build_trace(path: str | Path, metadata: Metadata, requests: list[Request]) -> Trace:
    """Wrap loaded requests in a Trace named by the metadata (or the file's stem)."""
    if not requests:
        raise TraceFormatError("file has no requests", path=path)
    try:
        return Trace(
            name=metadata.name or Path(path).stem,
            hash_block_size=metadata.hash_block_size,
            requests=requests,
        )
    except TraceFormatError as err:
        raise err.located(path) from None


def save_jsonl(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as JSON Lines (metadata line first), atomically."""
    with atomic_text_writer(path) as file:
        file.write(json.dumps(metadata_record(trace.name, trace.hash_block_size)) + "\n")
        for request in trace.requests:
            file.write(json.dumps(record_from_request(request), allow_nan=False) + "\n")
