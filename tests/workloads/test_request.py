"""Request and Trace validate their fields and keep requests sorted by arrival."""

from __future__ import annotations

import math

import pytest

from workloads import Request, Trace, TraceFormatError


def req(request_id: str = "a", t: float = 0.0, **kw: object) -> Request:
    fields: dict[str, object] = {"prompt_tokens": 10, "output_tokens": 5, **kw}
    return Request(request_id=request_id, arrival_time_s=t, **fields)  # type: ignore[arg-type]


def test_integer_ids_and_times_are_normalised() -> None:
    r = Request(request_id=7, arrival_time_s=3, prompt_tokens=1, output_tokens=1, session_id=9)  # type: ignore[arg-type]
    assert (r.request_id, r.arrival_time_s, r.session_id) == ("7", 3.0, "9")
    assert type(r.arrival_time_s) is float


def test_hash_ids_list_becomes_tuple() -> None:
    assert req(hash_ids=[1, 2]).hash_ids == (1, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"output_tokens": -3}, "output_tokens must be a positive integer, got -3"),
        ({"output_tokens": 0}, "output_tokens must be a positive integer, got 0"),
        ({"prompt_tokens": 3.5}, "prompt_tokens must be a positive integer, got 3.5"),
        ({"prompt_tokens": "7"}, 'prompt_tokens must be a positive integer, got "7"'),
        ({"prompt_tokens": True}, "prompt_tokens must be a positive integer, got true"),
        ({"t": math.nan}, "arrival_time_s must be a finite number >= 0, got nan"),
        ({"t": math.inf}, "arrival_time_s must be a finite number >= 0, got inf"),
        ({"t": -1.0}, "arrival_time_s must be a finite number >= 0, got -1.0"),
        ({"t": "1"}, 'arrival_time_s must be a finite number >= 0, got "1"'),
        ({"request_id": ""}, 'request_id must be a non-empty string or an integer, got ""'),
        ({"request_id": 1.0}, "request_id must be a non-empty string or an integer, got 1.0"),
        ({"hash_ids": [1, "x"]}, 'hash_ids must be a list of integers, got [1, "x"]'),
        ({"cancel_after_s": -2}, "cancel_after_s must be a finite number >= 0, got -2"),
        ({"priority": 1.5}, "priority must be an integer, got 1.5"),
    ],
)
def test_bad_fields_name_field_and_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        req(**kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message
    assert info.value.field in message.split()[0]


def test_trace_sorts_stably_by_arrival_without_touching_input() -> None:
    given = [req("c", 2.0), req("a", 1.0), req("b", 1.0), req("d", 0.5)]
    trace = Trace(name="t", hash_block_size=None, requests=given)
    assert [r.request_id for r in trace.requests] == ["d", "a", "b", "c"]
    assert [r.request_id for r in given] == ["c", "a", "b", "d"]


def test_trace_rejects_duplicate_ids() -> None:
    with pytest.raises(TraceFormatError, match='duplicate request_id "a"'):
        Trace(name="t", hash_block_size=None, requests=[req("a"), req("a", 1.0)])


def test_trace_checks_hash_ids_against_block_size() -> None:
    good = req(prompt_tokens=1025, hash_ids=[1, 2, 3])
    assert len(Trace(name="t", hash_block_size=512, requests=[good])) == 1
    with pytest.raises(TraceFormatError, match=r"hash_ids has 3 entries.*needs 2"):
        Trace(name="t", hash_block_size=512, requests=[req(prompt_tokens=1024, hash_ids=[1, 2, 3])])
    with pytest.raises(TraceFormatError, match="no hash_block_size"):
        Trace(name="t", hash_block_size=None, requests=[good])


def test_requests_are_frozen_and_slotted() -> None:
    r = req()
    with pytest.raises(AttributeError):
        r.prompt_tokens = 3  # type: ignore[misc]
    assert not hasattr(r, "__dict__")
