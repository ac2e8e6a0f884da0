"""A long trace's requests held as columns instead of one Request object each.

A Request costs about 230 bytes of Python objects (the object, its float and its ints besides
the id text); a million-request trace held as a list is ~280 MB of the simulator's memory for
the whole run. ``RequestColumns`` is a read-only ``Sequence[Request]`` over numpy columns
(arrival_time_s, prompt_tokens, output_tokens, priority) and the id texts; the rare request
with hash_ids, a session_id or cancel_after_s is kept whole (``extras``). Indexing or
iterating gives Requests equal to the ones it was built from; code that reads a whole column
takes it as an array (``request_column``). The JSON Lines reader builds one for a file it reads
line by line (a long trace, workloads/formats/jsonl.py), each Request dropped once checked.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any, overload

import numpy as np

from workloads.errors import TraceFormatError, show_value
from workloads.request import Request, check_hash_ids

# The columns held as arrays, and their dtypes.
ARRAY_COLUMNS = {
    "arrival_time_s": np.float64,
    "prompt_tokens": np.int64,
    "output_tokens": np.int64,
    "priority": np.int64,
}


def _has_extras(request: Request) -> bool:
    return (
        request.hash_ids is not None
        or request.session_id is not None
        or request.cancel_after_s is not None
    )


# Request's slots' own setters: a frozen dataclass refuses setattr, and these skip
# object.__setattr__'s lookup by name; bound as default arguments, they are locals (19,366
# requests, best of 9, two runs: object.__setattr__ 14.2 / 15.4 ms, these 9.0 / 11.8 ms;
# Request(...) with its checks 28.4 / 19.6 ms).
_SET_ID, _SET_ARRIVAL, _SET_PROMPT, _SET_OUTPUT, _SET_HASH, _SET_SESSION, _SET_CANCEL, _SET_PRIO = (
    getattr(Request, name).__set__
    for name in (
        "request_id",
        "arrival_time_s",
        "prompt_tokens",
        "output_tokens",
        "hash_ids",
        "session_id",
        "cancel_after_s",
        "priority",
    )
)


def _unchecked_request(
    request_id: str,
    arrival_time_s: float,
    prompt_tokens: int,
    output_tokens: int,
    priority: int,
    _new: Any = object.__new__,
    _set_id: Any = _SET_ID,
    _set_arrival: Any = _SET_ARRIVAL,
    _set_prompt: Any = _SET_PROMPT,
    _set_output: Any = _SET_OUTPUT,
    _set_hash: Any = _SET_HASH,
    _set_session: Any = _SET_SESSION,
    _set_cancel: Any = _SET_CANCEL,
    _set_priority: Any = _SET_PRIO,
) -> Request:
    """A Request of values taken from a checked one (its checks would pass again)."""
    request: Request = _new(Request)
    _set_id(request, request_id)
    _set_arrival(request, arrival_time_s)
    _set_prompt(request, prompt_tokens)
    _set_output(request, output_tokens)
    _set_hash(request, None)
    _set_session(request, None)
    _set_cancel(request, None)
    _set_priority(request, priority)
    return request


def unchecked_requests(
    request_ids: list[str],
    arrival_time_s: list[float],
    prompt_tokens: list[int],
    output_tokens: list[int],
) -> list[Request]:
    """Requests of priority 0 and no optional field, of values that passed Request's checks
    (workloads/formats/plain_records.py checks a batch of them at once)."""
    return list(
        map(
            _unchecked_request, request_ids, arrival_time_s, prompt_tokens, output_tokens, repeat(0)
        )
    )


class RequestColumns(Sequence[Request]):
    """Requests as columns (see the module docstring); build with ``RequestColumnsBuilder``
    or ``of``."""

    __slots__ = ("columns", "extras", "request_ids")

    def __init__(
        self, request_ids: list[str], columns: dict[str, np.ndarray], extras: dict[int, Request]
    ) -> None:
        """``request_ids`` and ``columns`` (``ARRAY_COLUMNS``) of equal length; ``extras``:
        the whole Request of every index that has hash_ids, a session_id or
        cancel_after_s."""
        if set(columns) != set(ARRAY_COLUMNS) or any(
            len(c) != len(request_ids) for c in columns.values()
        ):
            raise ValueError(f"need the columns {sorted(ARRAY_COLUMNS)}, one entry per id")
        self.request_ids = request_ids
        self.columns = columns
        self.extras = extras

    @classmethod
    def of(cls, requests: Sequence[Request]) -> RequestColumns:
        builder = RequestColumnsBuilder()
        for request in requests:
            builder.append(request)
        return builder.build()

    def __len__(self) -> int:
        return len(self.request_ids)

    @overload
    def __getitem__(self, index: int) -> Request: ...
    @overload
    def __getitem__(self, index: slice) -> list[Request]: ...
    def __getitem__(self, index: int | slice) -> Request | list[Request]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError("request index out of range")
        index %= n
        whole = self.extras.get(index)
        if whole is not None:
            return whole
        c = self.columns
        return _unchecked_request(
            self.request_ids[index],
            float(c["arrival_time_s"][index]),
            int(c["prompt_tokens"][index]),
            int(c["output_tokens"][index]),
            int(c["priority"][index]),
        )

    def __iter__(self) -> Iterator[Request]:
        c = self.columns
        extras = self.extras
        rows = zip(
            self.request_ids,
            c["arrival_time_s"].tolist(),
            c["prompt_tokens"].tolist(),
            c["output_tokens"].tolist(),
            c["priority"].tolist(),
            strict=True,
        )
        for index, row in enumerate(rows):
            whole = extras.get(index) if extras else None
            yield whole if whole is not None else _unchecked_request(*row)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, as a list

    def __repr__(self) -> str:
        return f"RequestColumns({len(self):,} requests)"

    def checked_in_order(self, hash_block_size: int | None) -> RequestColumns:
        """Trace's checks (unique ids, hash_ids that fit ``hash_block_size``) and its stable
        sort by arrival, column by column: these requests, or a sorted copy."""
        if len(set(self.request_ids)) != len(self):
            seen: set[str] = set()
            for request_id in self.request_ids:
                if request_id in seen:
                    raise TraceFormatError(
                        f"duplicate request_id {show_value(request_id)}", field="request_id"
                    )
                seen.add(request_id)
        for request in self.extras.values():
            check_hash_ids(request, hash_block_size)
        arrival = self.columns["arrival_time_s"]
        if len(arrival) > 1 and not bool((arrival[1:] >= arrival[:-1]).all()):
            return self.take(np.argsort(arrival, kind="stable"))
        return self

    def take(self, order: np.ndarray) -> RequestColumns:
        """The requests in ``order`` (indices)."""
        position = {int(old): new for new, old in enumerate(order)} if self.extras else {}
        return RequestColumns(
            [self.request_ids[i] for i in order],
            {n: c[order] for n, c in self.columns.items()},
            {position[i]: r for i, r in self.extras.items()},
        )


class RequestColumnsBuilder:
    """Appends checked Requests to growing columns: each Request can be dropped once
    appended (unless it has hash_ids, a session_id or cancel_after_s)."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._arrays: dict[str, array[Any]] = {
            "arrival_time_s": array("d"),
            "prompt_tokens": array("q"),
            "output_tokens": array("q"),
            "priority": array("q"),
        }
        self._extras: dict[int, Request] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def append(self, request: Request) -> None:
        if _has_extras(request):
            self._extras[len(self._ids)] = request
        self._ids.append(request.request_id)
        a = self._arrays
        a["arrival_time_s"].append(request.arrival_time_s)
        a["prompt_tokens"].append(request.prompt_tokens)
        a["output_tokens"].append(request.output_tokens)
        a["priority"].append(request.priority)

    def extend_plain(
        self,
        request_ids: list[str],
        arrival_time_s: np.ndarray,
        prompt_tokens: list[int],
        output_tokens: list[int],
    ) -> None:
        """Append checked requests of priority 0 without an optional field, as columns:
        ``arrival_time_s`` float64, the token counts within int64."""
        self._ids.extend(request_ids)
        a = self._arrays
        a["arrival_time_s"].frombytes(np.ascontiguousarray(arrival_time_s, np.float64).tobytes())
        a["prompt_tokens"].extend(prompt_tokens)
        a["output_tokens"].extend(output_tokens)
        a["priority"].frombytes(bytes(8 * len(request_ids)))

    def build(self) -> RequestColumns:
        columns = {
            name: np.frombuffer(self._arrays[name], dtype=dtype).copy()
            for name, dtype in ARRAY_COLUMNS.items()
        }
        return RequestColumns(self._ids, columns, self._extras)


_REQUEST_ID = attrgetter("request_id")


def request_column(requests: Sequence[Request], name: str) -> np.ndarray:
    """Column ``name`` of ``ARRAY_COLUMNS`` of ``requests`` (a RequestColumns' own array, or
    one read off the Request objects), in ``ARRAY_COLUMNS``' dtype."""
    dtype = ARRAY_COLUMNS[name]
    if isinstance(requests, RequestColumns):
        return requests.columns[name]
    # map(attrgetter) loops in C (19,366 requests, four columns: 2.5 -> 1.9 ms)
    return np.fromiter(map(attrgetter(name), requests), dtype, len(requests))


def request_ids(requests: Sequence[Request]) -> list[str]:
    """The requests' ids, in order."""
    if isinstance(requests, RequestColumns):
        return requests.request_ids
    return list(map(_REQUEST_ID, requests))


def plain_requests(requests: Sequence[Request]) -> bool:
    """Whether no request has hash_ids, a session_id or cancel_after_s (a RequestColumns
    knows without looking at every request)."""
    if isinstance(requests, RequestColumns):
        return not requests.extras
    return not any(_has_extras(r) for r in requests)


def requests_with_extras(requests: Sequence[Request]) -> Iterator[tuple[int, Request]]:
    """(index, request) of the requests with hash_ids, a session_id or cancel_after_s."""
    if isinstance(requests, RequestColumns):
        yield from sorted(requests.extras.items())
        return
    for i, r in enumerate(requests):
        if _has_extras(r):
            yield i, r
