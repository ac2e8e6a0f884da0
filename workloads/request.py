"""The request record and the trace that holds them.

A :class:`Request` is what a user sends: when it arrives, how long its prompt is and how many
tokens it wants back. It knows nothing of blocks or the engine; the simulator turns it into an
engine sequence. Validation lives here, once: the file loaders build Requests and only add the
file name and line to the :class:`~workloads.errors.TraceFormatError` raised here. Bounds come
from :mod:`workloads.limits`.

The checks are hand-written rather than a pydantic model: every Request built in code (importers,
generators, ``dataclasses.replace`` in rescaling and closed loops) passes through them, the fast
path is a few type and range tests, and the messages keep the documented wording. A pydantic
``validate_json`` per JSON line measured faster for loading (19k records: 46 ms against 130 ms),
but it takes another JSON parser with its own refusals (a lone surrogate or a 5,000-digit number
is "invalid JSON at column N", naming no field), so the stdlib path would still be needed for
messages, and Request's types (``request_id: str`` from an integer) would change for every user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workloads.errors import OversizedInteger, TraceFormatError, show_value
from workloads.limits import (
    MAX_ID_CHARS,
    MAX_INT64,
    MAX_TIME_S,
    MAX_TOKENS,
    MAX_UINT64,
    MIN_INT64,
)

REQUIRED_FIELDS = ("request_id", "arrival_time_s", "prompt_tokens", "output_tokens")
OPTIONAL_FIELDS = ("hash_ids", "session_id", "cancel_after_s", "priority")
ALL_FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS


_TOKENS_RULE = f"must be at most {MAX_TOKENS} (2^30 tokens: the engine counts tokens in 32 bits)"
_TIME_RULE = (
    f"must be at most {MAX_TIME_S:.0f} s (2^32 s, about 136 years: beyond it the simulator's "
    "float clock cannot resolve a microsecond)"
)


def _bad(field: str, rule: str, value: object) -> TraceFormatError:
    return TraceFormatError(f"{field} {rule}, got {show_value(value)}", field=field)


def _above(value: object, limit: float) -> bool:
    """Whether ``value`` is a number above ``limit`` (an OversizedInteger above any limit)."""
    if isinstance(value, OversizedInteger):
        return not value.negative
    if type(value) is float:
        return limit < value < math.inf
    return type(value) is int and value > limit


def check_text(field: str, value: str) -> None:
    """Raise unless ``value`` holds at most MAX_ID_CHARS characters of valid Unicode (JSON's
    ``\\ud800`` escapes give lone surrogates that no file format, UTF-8 or Parquet, can store)."""
    if len(value) > MAX_ID_CHARS:
        raise TraceFormatError(
            f"{field} may hold at most {MAX_ID_CHARS} characters, got {len(value):,}", field=field
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise TraceFormatError(
                f"{field} holds a lone surrogate {show_value(value[err.start])} at character "
                f"{err.start + 1}, which is not valid Unicode text",
                field=field,
            ) from None


def _as_id(field: str, value: object) -> str:
    # Integers are accepted (many traces number their requests) and kept as decimal strings.
    if type(value) is str and value:
        check_text(field, value)
        return value
    if type(value) is int and MIN_INT64 <= value <= MAX_UINT64:
        return str(value)
    if type(value) is int or isinstance(value, OversizedInteger):
        raise _bad(field, "must be a string or a 64-bit integer (-2^63 to 2^64-1)", value)
    raise _bad(field, "must be a non-empty string or an integer", value)


def _as_seconds(field: str, value: object) -> float:
    if _above(value, MAX_TIME_S):
        raise _bad(field, _TIME_RULE, value)
    if type(value) is not float and type(value) is not int:
        raise _bad(field, "must be a finite number >= 0", value)
    seconds = float(value)  # an int here is at most MAX_TIME_S: no OverflowError
    if not 0.0 <= seconds < math.inf:  # also rejects NaN, which fails every comparison
        raise _bad(field, "must be a finite number >= 0", value)
    return seconds


def _check_tokens(field: str, value: object) -> None:
    if type(value) is int and 1 <= value <= MAX_TOKENS:
        return
    if type(value) is not float and _above(value, MAX_TOKENS):
        raise _bad(field, _TOKENS_RULE, value)
    raise _bad(field, "must be a positive integer", value)


_INT_TYPE = frozenset((int,))


def _is_hash_id(value: object) -> bool:
    return type(value) is int and MIN_INT64 <= value <= MAX_UINT64


def _as_hash_ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise _bad("hash_ids", "must be a list of integers", value)
    # set(map(type, ...)) and min/max loop in C: hash_ids are the bulk of a Mooncake record
    if not set(map(type, value)) <= _INT_TYPE or (
        value and (min(value) < MIN_INT64 or max(value) > MAX_UINT64)
    ):
        index, bad = next((i, h) for i, h in enumerate(value) if not _is_hash_id(h))
        if type(bad) is not int and not isinstance(bad, OversizedInteger):
            raise _bad("hash_ids", "must be a list of integers", value)
        raise TraceFormatError(
            f"hash_ids entries must be 64-bit integers (-2^63 to 2^64-1), got {show_value(bad)} "
            f"at position {index}",
            field="hash_ids",
        )
    return tuple(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One inference request of a trace.

    Attributes:
        request_id: unique within a trace; integers given in files are kept as decimal strings.
        arrival_time_s: seconds from the trace's start (>= 0) at which the request arrives.
        prompt_tokens: prompt length in tokens (>= 1).
        output_tokens: tokens to generate (>= 1); the simulator stops the request after this many.
        hash_ids: optional prefix-block hashes, one per ``hash_block_size`` tokens of the prompt
            (the last block may be partial); equal ids mean an identical prefix up to that block.
        session_id: optional conversation/user id (requests of one session may share prefixes).
        cancel_after_s: optional patience: the client aborts this many seconds after arrival
            if the request has not finished by then.
        priority: scheduling priority; lower values are served first (vLLM convention).
    """

    request_id: str
    arrival_time_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    session_id: str | None = None
    cancel_after_s: float | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        # Fast path first: a well-typed value is stored as is, so 1M requests load quickly.
        request_id = self.request_id
        if (
            type(request_id) is not str
            or not request_id
            or len(request_id) > MAX_ID_CHARS
            or not request_id.isascii()
        ):
            object.__setattr__(self, "request_id", _as_id("request_id", request_id))
        arrival = self.arrival_time_s
        if type(arrival) is not float or not 0.0 <= arrival <= MAX_TIME_S:
            object.__setattr__(self, "arrival_time_s", _as_seconds("arrival_time_s", arrival))
        prompt, output = self.prompt_tokens, self.output_tokens
        if type(prompt) is not int or not 1 <= prompt <= MAX_TOKENS:
            _check_tokens("prompt_tokens", prompt)
        if type(output) is not int or not 1 <= output <= MAX_TOKENS:
            _check_tokens("output_tokens", output)
        if self.hash_ids is not None:
            object.__setattr__(self, "hash_ids", _as_hash_ids(self.hash_ids))
        if self.session_id is not None:
            object.__setattr__(self, "session_id", _as_id("session_id", self.session_id))
        if self.cancel_after_s is not None:
            object.__setattr__(
                self, "cancel_after_s", _as_seconds("cancel_after_s", self.cancel_after_s)
            )
        priority = self.priority
        if type(priority) is not int or not MIN_INT64 <= priority <= MAX_INT64:
            if type(priority) is int or isinstance(priority, OversizedInteger):
                raise _bad(
                    "priority", "must be a signed 64-bit integer (-2^63 to 2^63-1)", priority
                )
            raise _bad("priority", "must be an integer", priority)


def _refuse_priority(value: object) -> None:
    if type(value) is int or isinstance(value, OversizedInteger):
        raise _bad("priority", "must be a signed 64-bit integer (-2^63 to 2^63-1)", value)
    raise _bad("priority", "must be an integer", value)


def check_hash_ids(request: Request, hash_block_size: int | None) -> None:
    """Raise TraceFormatError unless ``request.hash_ids`` fits the trace's ``hash_block_size``.

    A request with hash_ids needs exactly ceil(prompt_tokens / hash_block_size) of them.
    """
    if request.hash_ids is None:
        return
    if hash_block_size is None:
        raise TraceFormatError(
            "hash_ids given but the trace has no hash_block_size", field="hash_ids"
        )
    expected = -(-request.prompt_tokens // hash_block_size)
    if len(request.hash_ids) != expected:
        raise TraceFormatError(
            f"hash_ids has {len(request.hash_ids)} entries, but prompt_tokens="
            f"{request.prompt_tokens} with hash_block_size={hash_block_size} needs {expected}",
            field="hash_ids",
        )


def check_trace_name(name: object) -> None:
    """Raise TraceFormatError unless ``name`` is a non-empty string of valid Unicode."""
    if type(name) is not str or not name:
        raise _bad("name", "must be a non-empty string", name)
    check_text("name", name)


def check_hash_block_size(value: object) -> None:
    """Raise TraceFormatError unless ``value`` is None or a token count (1 to MAX_TOKENS)."""
    if value is None or (type(value) is int and 1 <= value <= MAX_TOKENS):
        return
    if _above(value, MAX_TOKENS) and type(value) is not float:
        raise _bad("hash_block_size", _TOKENS_RULE, value)
    raise _bad("hash_block_size", "must be a positive integer or null", value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A named list of requests, sorted by arrival time.

    Construction copies ``requests``, sorts them stably by ``arrival_time_s`` (ties keep their
    given order) and checks that ids are unique and hash_ids fit ``hash_block_size``. A
    ``RequestColumns`` (workloads/request_columns.py: a long trace read line by line) is
    checked and sorted column by column and kept as columns.

    Attributes:
        name: a short name saying what the trace is (e.g. ``azure_llm_2023_conv``).
        hash_block_size: tokens per hash_ids entry (512 for Mooncake), or None without hash_ids.
        requests: the requests, sorted by arrival (stable): a list, or a RequestColumns.
    """

    name: str
    hash_block_size: int | None
    requests: list[Request]  # or a RequestColumns, which reads as a list of Requests

    def __post_init__(self) -> None:
        check_trace_name(self.name)
        check_hash_block_size(self.hash_block_size)
        # a long trace's RequestColumns (workloads/request_columns.py) checks and sorts itself
        checked_in_order = getattr(self.requests, "checked_in_order", None)
        if checked_in_order is not None:
            object.__setattr__(self, "requests", checked_in_order(self.hash_block_size))
            return
        requests = list(self.requests)
        seen: set[str] = set()
        previous = -math.inf
        is_sorted = True
        for request in requests:
            if request.request_id in seen:
                raise TraceFormatError(
                    f"duplicate request_id {show_value(request.request_id)}", field="request_id"
                )
            seen.add(request.request_id)
            check_hash_ids(request, self.hash_block_size)
            is_sorted = is_sorted and request.arrival_time_s >= previous
            previous = request.arrival_time_s
        if not is_sorted:
            requests.sort(key=_arrival)  # list.sort is stable
        object.__setattr__(self, "requests", requests)

    def __len__(self) -> int:
        return len(self.requests)


def _arrival(request: Request) -> float:
    return request.arrival_time_s
