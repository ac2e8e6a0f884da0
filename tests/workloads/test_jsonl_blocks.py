"""JSON Lines traces read in blocks, with plain records checked a block at a time
(workloads/formats/jsonl.py's _load_in_blocks, workloads/formats/plain_records.py), give what
the line-by-line reader gives, and refuse what it refuses with its message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads import TraceFormatError
from workloads.formats import jsonl
from workloads.formats.plain_records import plain_batch
from workloads.request_columns import RequestColumns

HEADER = '{"kvsim_trace": 1, "name": "t", "hash_block_size": 16}'


def record(i: int, extra: str = "", arrival: str | None = None) -> str:
    return (
        f'{{"request_id": "r{i}", "arrival_time_s": {arrival or 0.5 * i}, '
        f'"prompt_tokens": {40 + i}, "output_tokens": 5{extra}}}'
    )


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of more than 200 bytes are read in blocks of about 300."""
    monkeypatch.setattr(jsonl, "_AT_ONCE_MAX_BYTES", 200)
    monkeypatch.setattr(jsonl, "_BLOCK_BYTES", 300)


def same_as_by_line(path: Path) -> None:
    """load_jsonl gives what the line-by-line reader gives, or the same error."""
    try:
        expected = jsonl._load_by_line(path)
    except TraceFormatError as err:
        with pytest.raises(TraceFormatError) as raised:
            jsonl.load_jsonl(path)
        assert str(raised.value) == str(err)
        return
    got = jsonl.load_jsonl(path)
    assert got == expected
    assert (got.name, got.hash_block_size) == (expected.name, expected.hash_block_size)
    assert type(got.requests) is type(expected.requests) or len(got) <= 65536


def test_many_blocks_read_as_line_by_line(tmp_path: Path, small_blocks: None) -> None:
    path = tmp_path / "t.jsonl"
    lines = [HEADER, *(record(i) for i in range(30))]
    lines[7] = record(6, ', "hash_ids": [1, 2, 3]')  # a block not plain: record by record
    lines[12] = ""  # a blank line
    path.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode())
    assert jsonl._load_at_once(path) is None  # larger than one block
    trace = jsonl._load_in_blocks(path)
    assert trace is not None and isinstance(trace.requests, RequestColumns)
    assert trace == jsonl._load_by_line(path) and len(trace) == 29
    assert trace.requests[6].hash_ids == (1, 2, 3)


def test_out_of_order_arrivals_in_blocks_are_sorted(tmp_path: Path, small_blocks: None) -> None:
    path = tmp_path / "t.jsonl"
    lines = [HEADER, *(record(i, arrival=str(30 - i)) for i in range(30))]
    path.write_text("\n".join(lines))  # no newline at the end
    trace = jsonl.load_jsonl(path)
    assert [r.request_id for r in trace.requests][:2] == ["r29", "r28"]
    same_as_by_line(path)


@pytest.mark.parametrize(
    "bad",
    [
        record(3),  # a duplicate id in a later block
        record(40, ', "ouput_tokens": 3'),
        '{"request_id": "x", "request_id": "y", "arrival_time_s": 1, "prompt_tokens": 1}',
        record(41).replace("5}", "0}"),
        record(42).replace("0.5", "-0.5").replace("21.0", "-21.0"),
        record(43, ', "priority": true'),
        "[1, 2]",
        HEADER,
    ],
)
def test_what_line_by_line_refuses_in_a_later_block(
    bad: str, tmp_path: Path, small_blocks: None
) -> None:
    path = tmp_path / "bad.jsonl"
    lines = [HEADER, *(record(i) for i in range(30)), bad, record(99)]
    path.write_text("\n".join(lines) + "\n")
    assert jsonl._load_in_blocks(path) is None
    same_as_by_line(path)


def test_a_line_longer_than_the_limit_in_blocks(
    tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 500)
    path = tmp_path / "long.jsonl"
    long_id = "x" * 1000
    lines = [HEADER, *(record(i) for i in range(10)), record(11).replace("r11", long_id)]
    path.write_text("\n".join(lines) + "\n")
    assert jsonl._load_in_blocks(path) is None


_ids = st.one_of(
    st.text(min_size=0, max_size=3),
    st.integers(-(2**64), 2**65),
    st.sampled_from(["a:b", "é", "\ud800", "x" * 1025]),
)
_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 2**33),
    st.sampled_from([2**32, 2**32 + 1, 4294967296.0, 1e308, -0.0]),
    st.booleans(),
    st.none(),
    st.just("1"),
)
_tokens = st.one_of(
    st.integers(-2, 2**31),
    st.sampled_from([2**30, 2**30 + 1, 1.0, True, None, 2**70]),
)
_records = st.fixed_dictionaries(
    {
        "request_id": _ids,
        "arrival_time_s": _numbers,
        "prompt_tokens": _tokens,
        "output_tokens": _tokens,
    },
    optional={"priority": st.integers(-3, 3), "session_id": st.just("s")},
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=st.lists(_records, min_size=1, max_size=12), header=st.booleans())
def test_any_records_load_as_line_by_line(
    records: list[dict[str, object]], header: bool, tmp_path: Path, small_blocks: None
) -> None:
    path = tmp_path / "h.jsonl"
    lines = [HEADER] if header else []
    lines += [json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    same_as_by_line(path)


def test_plain_batches() -> None:
    plain = {"request_id": "a", "arrival_time_s": 1, "prompt_tokens": 2, "output_tokens": 3}
    batch = plain_batch([plain, {**plain, "request_id": "b", "arrival_time_s": 0.5}])
    assert batch is not None and batch.request_ids == ["a", "b"]
    assert batch.arrival_time_s.tolist() == [1.0, 0.5] and batch.prompt_tokens == [2, 2]
    for other in (
        {**plain, "priority": 0},
        {**plain, "request_id": 7},
        {**plain, "request_id": ""},
        {**plain, "arrival_time_s": float("nan")},
        {**plain, "arrival_time_s": 2**32 + 1},
        {**plain, "arrival_time_s": 10**400},
        {**plain, "prompt_tokens": True},
        {**plain, "output_tokens": 2**30 + 1},
        {k: v for k, v in plain.items() if k != "output_tokens"} | {"output": 1},
        [1],
    ):
        assert plain_batch([plain, other]) is None


@pytest.mark.parametrize("blank_lines", [0, 1, 300])  # 300: a first block of them
def test_a_bom_counts_on_line_1_only(blank_lines: int, tmp_path: Path, small_blocks: None) -> None:
    """As iter_lines: a BOM at the file's start goes; after blank lines (a first block of
    them) it is a character of its line, which JSON refuses."""
    path = tmp_path / "bom.jsonl"
    lines = [*([""] * blank_lines), "\ufeff" + HEADER, *(record(i) for i in range(30))]
    path.write_bytes("\n".join(lines).encode())
    if blank_lines:
        with pytest.raises(TraceFormatError, match=f":{blank_lines + 1}: malformed JSON"):
            jsonl.load_jsonl(path)
    else:
        assert len(jsonl.load_jsonl(path)) == 30
    same_as_by_line(path)
