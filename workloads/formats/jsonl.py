"""JSON Lines traces: an optional metadata line, then one request object per line (streamed)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workloads.errors import TraceFormatError, int_or_oversized
from workloads.formats.plain_records import plain_batch
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
from workloads.formats.textio import _BOM, atomic_text_writer, iter_lines, open_regular
from workloads.limits import MAX_LINE_BYTES
from workloads.request import Request, Trace
from workloads.request_columns import RequestColumns, RequestColumnsBuilder, unchecked_requests

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


class _Records:
    """The records of one JSON Lines trace as they are read: the metadata line, if first,
    then requests (each line's rules, shared by both readers below)."""

    def __init__(self, columns: bool = False) -> None:
        """``columns``: keep the requests as columns (RequestColumnsBuilder), not a list."""
        self.metadata = Metadata()
        self.requests: list[Request] | RequestColumnsBuilder = (
            RequestColumnsBuilder() if columns else []
        )
        self.duplicates = DuplicateTracker()
        self.seen_content = False

    def take(self, text: str, obj: Any, where: int) -> None:
        """Line ``where``'s decoded ``obj`` (its ``text``); raises an unlocated
        TraceFormatError."""
        if not isinstance(obj, dict):
            raise TraceFormatError(f"expected a JSON object, got {json_type_name(obj)}")
        if text.count(":") != len(obj):  # else no key can be given twice (a flat record)
            _check_duplicates(text, obj)
        if not self.seen_content and VERSION_KEY in obj:
            self.seen_content = True
            self.metadata = parse_metadata(obj)
            return
        self.seen_content = True
        request = request_from_record(obj, self.metadata.hash_block_size)
        self.duplicates.check(request.request_id, where, "line")
        self.requests.append(request)

    def take_block(self, text: str, lines: list[str], objs: list[Any], first: int) -> None:
        """The decoded ``objs`` of ``lines`` (all of ``text``'s non-blank lines, the first
        numbered ``first``): a plain batch at once where it is one (no key given twice: as
        many ``:`` in ``text`` as keys), else record by record. Raises an unlocated
        TraceFormatError."""
        start = 0
        if objs and not self.seen_content:  # the metadata line, if any, is the first
            self.take(lines[0], objs[0], first)
            start = 1
        batch = None
        if len(objs) > start and text.count(":") == sum(map(len, objs)):
            batch = plain_batch(objs[start:] if start else objs)
        if batch is None:
            for index in range(start, len(objs)):
                self.take(lines[index], objs[index], first + index)
                objs[index] = None  # its Request holds what is kept of it
            return
        objs.clear()  # the batch holds what is kept of them
        if isinstance(self.requests, RequestColumnsBuilder):
            self.requests.extend_plain(
                batch.request_ids, batch.arrival_time_s, batch.prompt_tokens, batch.output_tokens
            )
        else:
            self.requests.extend(
                unchecked_requests(
                    batch.request_ids,
                    batch.arrival_time_s.tolist(),
                    batch.prompt_tokens,
                    batch.output_tokens,
                )
            )


def load_jsonl(path: str | Path, columns: bool = False) -> Trace:
    """Read a JSON Lines trace; blank lines are skipped. The file is first read in blocks
    (``_load_in_blocks``: one block up to ``_AT_ONCE_MAX_BYTES``); where that finds anything
    wrong, line by line (which names the line and column of what is wrong). ``columns``:
    hold the requests as columns however few they are (else past COLUMNS_FROM_REQUESTS)."""
    trace = _load_in_blocks(path, columns=columns)
    return trace if trace is not None else _load_by_line(path)


def _load_by_line(path: str | Path) -> Trace:
    # A file read line by line is a long trace (or a faulty one): its requests are kept as
    # columns, each Request dropped once checked (a million requests' Request objects were
    # ~280 MB of the run's memory).
    records = _Records(columns=True)
    for line, text in iter_lines(path):
        if not text.strip():
            continue
        obj = parse_json_text(text, path, line)
        try:
            records.take(text, obj, line)
        except TraceFormatError as err:
            raise err.located(path, line=line) from None
    if not records.seen_content:
        raise TraceFormatError("file is empty", path=path)
    return build_trace(path, records.metadata, _built(records.requests))


# Traces of more requests than this are held as columns (workloads/request_columns.py), as is
# any trace read in more than one block: the whole Azure conversation trace (19,366) stays a
# list.
COLUMNS_FROM_REQUESTS = 1 << 16

# Read at once up to this size (the whole Azure conversation trace is 1.9 MB); a larger file
# in blocks of about _BLOCK_BYTES, so that a 1 M-request trace's text and decoded lines are
# never all in memory.
_AT_ONCE_MAX_BYTES = 64 << 20
_BLOCK_BYTES = 4 << 20


def _load_at_once(path: str | Path) -> Trace | None:
    """The trace read in one block, or None where the file is larger than
    ``_AT_ONCE_MAX_BYTES`` or anything is off (see ``_load_in_blocks``)."""
    return _load_in_blocks(path, at_once_only=True)


def _load_in_blocks(
    path: str | Path, at_once_only: bool = False, columns: bool = False
) -> Trace | None:
    """The trace, read in blocks of whole lines (the whole file if at most
    ``_AT_ONCE_MAX_BYTES``, else about ``_BLOCK_BYTES`` each), each block's lines decoded by
    one call of the JSON decoder (``_decoded_lines``) and its records checked a block at a
    time where they are plain (``_Records.take_block``), record by record where not. None
    wherever anything is off, for the line-by-line reader to find and name; with
    ``at_once_only``, None for a file read in more than one block; ``columns`` as
    ``load_jsonl``'s."""
    try:
        with open_regular(path) as file:
            records = _Records()
            if os.fstat(file.fileno()).st_size <= _AT_ONCE_MAX_BYTES:
                data = file.read(_AT_ONCE_MAX_BYTES + 1)
                if len(data) <= _AT_ONCE_MAX_BYTES:  # (the file may have grown since)
                    columns_from = 0 if columns else COLUMNS_FROM_REQUESTS
                    if _take_block(records, data, 0, True, columns_from) is None:
                        return None
                    return _finished(path, records)
                file.seek(0)
            if at_once_only:
                return None
            records = _Records(columns=True)
            taken, rest, at_start = 0, b"", True
            while True:
                more = file.read(_BLOCK_BYTES)
                data = rest + more
                cut = data.rfind(b"\n") + 1 if more else len(data)
                if cut == 0 and len(data) > MAX_LINE_BYTES:
                    return None  # a line too long: the line-by-line reader says so
                block, rest = data[:cut], data[cut:]
                taken_now = _take_block(records, block, taken, at_start)
                if taken_now is None:
                    return None
                taken += taken_now
                at_start = at_start and not block
                if not more:
                    return _finished(path, records)
    except (TraceFormatError, UnicodeDecodeError):
        return None


def _take_block(
    records: _Records,
    block: bytes,
    taken: int,
    at_start: bool,
    columns_from: int | None = None,
) -> int | None:
    """Give ``records`` the lines of ``block`` (whole lines, after ``taken`` non-blank ones;
    ``at_start``: the file's first bytes, where a BOM may be): how many non-blank lines it
    held, or None where ``_decoded_lines`` cannot decode it; ``columns_from``: keep the
    requests as columns if the block holds more lines. Raises an unlocated
    TraceFormatError or UnicodeDecodeError."""
    text = block.decode("utf-8")
    if at_start and text.startswith(_BOM):  # line 1's only, as iter_lines strips it
        text = text[1:]
    decoded = _decoded_lines(text)
    if decoded is None:
        return None
    lines, objs = decoded
    if columns_from is not None and len(lines) > columns_from:
        records.requests = RequestColumnsBuilder()
    records.take_block(text, lines, objs, taken)
    return len(lines)


def _finished(path: str | Path, records: _Records) -> Trace | None:
    if not records.seen_content:
        return None  # an empty file: the line-by-line reader says so
    try:
        return build_trace(path, records.metadata, _built(records.requests))
    except TraceFormatError:
        return None


def _decoded_lines(text: str) -> tuple[list[str], list[Any]] | None:
    """The non-blank lines of ``text`` and their values, decoded by one call of the JSON
    decoder (as the elements of one array, joined by ",\n") instead of one call per line;
    None where that cannot be sure each line is one value.

    The lines are one record each, as the line-by-line reader requires, because every line
    begins with ``{`` and ends with ``}``, strings cannot span lines (the joined lines
    keep a newline between them, which a JSON string may not hold), there are as many
    values as lines, and no valid record holds an object (a value split across lines
    would): the records' own checks refuse anything else."""
    lines = list(filter(str.strip, text.split("\n")))
    if not lines:
        return lines, []
    if max(map(len, lines)) > MAX_LINE_BYTES // 4:  # 4 bytes a character at most
        return None
    for line in lines:
        stripped = line.strip(_JSON_SPACE)
        if stripped[:1] != "{" or stripped[-1:] != "}":
            return None
    try:
        objs = _DECODER.decode("[" + ",\n".join(lines) + "]")
    except (ValueError, RecursionError):
        return None
    if len(objs) != len(lines):
        return None
    return lines, objs


def _built(requests: list[Request] | RequestColumnsBuilder) -> list[Request] | RequestColumns:
    if isinstance(requests, RequestColumnsBuilder):
        return requests.build() if len(requests) else []
    return requests


_JSON_SPACE = " \t\r"  # JSON's whitespace within a line


def build_trace(
    path: str | Path, metadata: Metadata, requests: list[Request] | RequestColumns
) -> Trace:
    """Wrap loaded requests in a Trace named by the metadata (or the file's stem)."""
    if not requests:
        raise TraceFormatError("file has no requests", path=path)
    try:
        return Trace(
            name=metadata.name or Path(path).stem,
            hash_block_size=metadata.hash_block_size,
            requests=requests,  # type: ignore[arg-type]  # columns read as a list
        )
    except TraceFormatError as err:
        raise err.located(path) from None


def save_jsonl(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as JSON Lines (metadata line first), atomically."""
    with atomic_text_writer(path) as file:
        file.write(json.dumps(metadata_record(trace.name, trace.hash_block_size)) + "\n")
        for request in trace.requests:
            file.write(json.dumps(record_from_request(request), allow_nan=False) + "\n")
