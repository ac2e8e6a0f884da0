"""The request record and the trace that holds them.

A :class:`Request` is what a user sends: when it arrives, how long its prompt is and how many
tokens it wants back. It knows nothing of blocks or the engine; the simulator turns it into an
engine sequence. Validation lives here, once: the file loaders build Requests and only add the
file name and line to the :class:`~workloads.errors.TraceFormatError` raised here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workloads.errors import TraceFormatError, show_value

REQUIRED_FIELDS = ("request_id", "arrival_time_s", "prompt_tokens", "output_tokens")
OPTIONAL_FIELDS = ("hash_ids", "session_id", "cancel_after_s", "priority")
ALL_FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS


def _bad(field: str, rule: str, value: object) -> TraceFormatError:
    return TraceFormatError(f"{field} {rule}, got {show_value(value)}", field=field)


def _as_id(field: str, value: object) -> str:
    # Integers are accepted (many traces number their requests) and kept as decimal strings.
    if type(value) is str and value:
        return value
    if type(value) is int:
        return str(value)
    raise _bad(field, "must be a non-empty string or an integer", value)


def _as_seconds(field: str, value: object) -> float:
    if type(value) is not float and type(value) is not int:
        raise _bad(field, "must be a finite number >= 0", value)
    seconds = float(value)
    if not 0.0 <= seconds < math.inf:  # also rejects NaN, which fails every comparison
        raise _bad(field, "must be a finite number >= 0", value)
    return seconds


def _as_hash_ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or any(type(h) is not int for h in value):
        raise _bad("hash_ids", "must be a list of integers", value)
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
        if type(self.request_id) is not str or not self.request_id:
            object.__setattr__(self, "request_id", _as_id("request_id", self.request_id))
        if type(self.arrival_time_s) is not float or not 0.0 <= self.arrival_time_s < math.inf:
            object.__setattr__(
                self, "arrival_time_s", _as_seconds("arrival_time_s", self.arrival_time_s)
            )
        for field in ("prompt_tokens", "output_tokens"):
            value = getattr(self, field)
            if type(value) is not int or value < 1:
                raise _bad(field, "must be a positive integer", value)
        if self.hash_ids is not None and type(self.hash_ids) is not tuple:
            object.__setattr__(self, "hash_ids", _as_hash_ids(self.hash_ids))
        elif self.hash_ids is not None:
            _as_hash_ids(self.hash_ids)
        if self.session_id is not None and type(self.session_id) is not str:
            object.__setattr__(self, "session_id", _as_id("session_id", self.session_id))
        elif self.session_id == "":
            raise _bad("session_id", "must be a non-empty string or an integer", "")
        if self.cancel_after_s is not None:
            object.__setattr__(
                self, "cancel_after_s", _as_seconds("cancel_after_s", self.cancel_after_s)
            )
        if type(self.priority) is not int:
            raise _bad("priority", "must be an integer", self.priority)


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


def _check_trace_header(name: object, hash_block_size: object) -> None:
    if type(name) is not str or not name:
        raise _bad("name", "must be a non-empty string", name)
    if hash_block_size is not None and (type(hash_block_size) is not int or hash_block_size < 1):
        raise _bad("hash_block_size", "must be a positive integer or null", hash_block_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A named list of requests, sorted by arrival time.

    Construction copies ``requests``, sorts them stably by ``arrival_time_s`` (ties keep their
    given order) and checks that ids are unique and hash_ids fit ``hash_block_size``.

    Attributes:
        name: a short name saying what the trace is (e.g. ``azure_llm_2023_conv``).
        hash_block_size: tokens per hash_ids entry (512 for Mooncake), or None without hash_ids.
        requests: the requests, sorted by arrival (stable).
    """

    name: str
    hash_block_size: int | None
    requests: list[Request]

    def __post_init__(self) -> None:
        _check_trace_header(self.name, self.hash_block_size)
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
