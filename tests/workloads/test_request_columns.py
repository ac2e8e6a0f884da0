"""A long trace's requests held as columns (workloads/request_columns.py) read back as the
Requests they were built from, are checked and sorted as a list is, and the JSON Lines reader
gives them for long traces (and for any trace read line by line)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads import Request, Trace, TraceFormatError, load_trace, resolve_trace, save_trace
from workloads.formats import jsonl
from workloads.request_columns import (
    RequestColumns,
    plain_requests,
    request_column,
    request_ids,
    requests_with_extras,
)


def some_requests() -> list[Request]:
    return [
        Request(request_id="a", arrival_time_s=0.5, prompt_tokens=40, output_tokens=3),
        Request(
            request_id="b",
            arrival_time_s=0.25,
            prompt_tokens=33,
            output_tokens=9,
            hash_ids=(7, 2**64 - 1, -5),
            priority=-3,
        ),
        Request(
            request_id="c",
            arrival_time_s=0.25,
            prompt_tokens=1,
            output_tokens=1,
            session_id="s",
            cancel_after_s=2.0,
        ),
        Request(
            request_id="d",
            arrival_time_s=3.0,
            prompt_tokens=2**30,
            output_tokens=8,
            priority=2**63 - 1,
        ),
    ]


def test_columns_read_back_as_the_requests() -> None:
    requests = some_requests()
    columns = RequestColumns.of(requests)
    assert len(columns) == len(requests)
    assert list(columns) == requests
    assert [columns[i] for i in range(-4, 4)] == requests + requests
    assert columns[1:3] == requests[1:3] and columns[::-2] == requests[::-2]
    assert columns == requests and requests == columns
    with pytest.raises(IndexError):
        columns[4]
    assert request_ids(columns) == ["a", "b", "c", "d"]
    assert request_column(columns, "priority").tolist() == [0, -3, 0, 2**63 - 1]
    assert [i for i, _ in requests_with_extras(columns)] == [1, 2]
    assert not plain_requests(columns) and plain_requests(columns[::3])
    for name in ("arrival_time_s", "prompt_tokens", "output_tokens", "priority"):
        assert np.array_equal(request_column(columns, name), request_column(requests, name))


def test_a_trace_of_columns_is_sorted_and_checked_as_a_list() -> None:
    requests = some_requests()
    as_list = Trace(name="t", hash_block_size=16, requests=requests)
    columns = RequestColumns.of(requests)
    as_columns = Trace(name="t", hash_block_size=16, requests=columns)  # type: ignore[arg-type]
    assert isinstance(as_columns.requests, RequestColumns)
    assert [r.request_id for r in as_columns.requests] == ["b", "c", "a", "d"]  # stable
    assert as_columns == as_list
    with pytest.raises(TraceFormatError, match='duplicate request_id "a"'):
        twice = RequestColumns.of(requests + requests[:1])
        Trace(name="t", hash_block_size=16, requests=twice)  # type: ignore[arg-type]
    with pytest.raises(TraceFormatError, match="hash_ids has 3 entries"):
        Trace(name="t", hash_block_size=1, requests=columns)  # type: ignore[arg-type]


def test_long_traces_load_as_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl"
    save_trace(Trace(name="t", hash_block_size=16, requests=some_requests()), path)
    as_list = load_trace(path)
    assert isinstance(as_list.requests, list)
    monkeypatch.setattr(jsonl, "COLUMNS_FROM_REQUESTS", 2)
    at_once = load_trace(path)
    assert isinstance(at_once.requests, RequestColumns) and at_once == as_list
    by_line = jsonl._load_by_line(path)  # what a file too large to read at once takes
    assert isinstance(by_line.requests, RequestColumns) and by_line == as_list


@pytest.mark.parametrize(
    "name", ["azure_llm_2023_conv_first_2min", "mooncake_fast25_conversation_first_1000"]
)
def test_shipped_traces_as_columns(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    as_list = load_trace(resolve_trace(name))
    monkeypatch.setattr(jsonl, "COLUMNS_FROM_REQUESTS", 0)
    as_columns = load_trace(resolve_trace(name))
    assert isinstance(as_columns.requests, RequestColumns)
    assert as_columns == as_list


def test_load_trace_as_columns_on_request() -> None:
    """load_trace(columns=True), as a run loads its trace (kvsim.runner.resolve): the same
    requests, never built one by one (a JSON Lines trace; other formats give a list)."""
    path = resolve_trace("azure_llm_2023_conv_first_2min")
    as_list = load_trace(path)
    as_columns = load_trace(path, columns=True)
    assert isinstance(as_list.requests, list)
    assert isinstance(as_columns.requests, RequestColumns) and as_columns == as_list
