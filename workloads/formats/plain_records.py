"""Plain request records checked a batch at a time.

Almost every record of a long trace is *plain*: exactly the four required fields, an ASCII
string id, a float arrival time and two integer token counts. Such a batch is checked with
a few calls that loop in C (the types of a whole column at once, its minimum and maximum)
and kept as columns, never as one Request each: the JSON Lines reader's fast path
(workloads/formats/jsonl.py). A batch holding anything else (an optional field, an integer
id, a value out of range, a key given twice) is not plain: the reader takes it record by
record, whose checks and messages are the rules (workloads/request.py). Plain means the
record-by-record rules would accept the record and keep these values as they are, so both
ways give the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from workloads.limits import MAX_ID_CHARS, MAX_TIME_S, MAX_TOKENS
from workloads.request import REQUIRED_FIELDS

_FIELDS = tuple(map(itemgetter, REQUIRED_FIELDS))
_DICT, _STR, _INT = {dict}, {str}, {int}
_NUMBER = frozenset((float, int))


@dataclass(frozen=True, slots=True)
class PlainBatch:
    """Checked plain records as columns (``priority`` is 0 in every one).

    Attributes:
        request_ids: the ids, as given.
        arrival_time_s: seconds, float64.
        prompt_tokens: tokens, each 1 to MAX_TOKENS.
        output_tokens: tokens, each 1 to MAX_TOKENS.
    """

    request_ids: list[str]
    arrival_time_s: np.ndarray
    prompt_tokens: list[int]
    output_tokens: list[int]

    def __len__(self) -> int:
        return len(self.request_ids)


def plain_batch(records: list[Any]) -> PlainBatch | None:
    """``records`` (decoded JSON values, at least one) as a PlainBatch if every one is a plain
    request record that the record-by-record checks accept; None if any is not.

    Keys given twice are not seen here (the decoder kept the last value): the caller rules
    them out first (a record's ``:`` count equal to its keys, as jsonl.py's ``_Records``).
    """
    if set(map(type, records)) != _DICT or set(map(len, records)) != {len(REQUIRED_FIELDS)}:
        return None
    try:  # four keys and all four required: exactly them
        # a column at a time (rows and zip(*rows): 15 -> 3.8 ms a 4 MiB block)
        ids, arrivals, prompts, outputs = (list(map(field, records)) for field in _FIELDS)
    except KeyError:
        return None
    # Request's own fast path keeps a non-empty ASCII string of at most MAX_ID_CHARS as is
    if (
        set(map(type, ids)) != _STR
        or not all(ids)
        or max(map(len, ids)) > MAX_ID_CHARS
        or not all(map(str.isascii, ids))
    ):
        return None
    if not set(map(type, arrivals)) <= _NUMBER:
        return None
    try:
        # float(int) as Request's check converts it, correctly rounded; NaN fails both tests
        arrival = np.array(arrivals, dtype=np.float64)
    except OverflowError:  # an integer beyond any float: out of range anyway
        return None
    if not bool(((arrival >= 0.0) & (arrival <= MAX_TIME_S)).all()):
        return None
    for tokens in (prompts, outputs):  # bool is not int here, as in Request's check
        if set(map(type, tokens)) != _INT or min(tokens) < 1 or max(tokens) > MAX_TOKENS:
            return None
    return PlainBatch(ids, arrival, prompts, outputs)
