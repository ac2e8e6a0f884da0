"""JSON Lines traces read at once (workloads/formats/jsonl.py's _load_at_once) give what the
line-by-line reader gives, and whatever that reader refuses is still refused with its
message (line and column)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads import TraceFormatError, resolve_trace
from workloads.formats import jsonl

HEADER = '{"kvsim_trace": 1, "name": "t", "hash_block_size": 16}'


def record(i: int, extra: str = "") -> str:
    return (
        f'{{"request_id": "{i}", "arrival_time_s": {0.5 * i}, "prompt_tokens": 40, '
        f'"output_tokens": 5{extra}}}'
    )


@pytest.mark.parametrize(
    "name", ["azure_llm_2023_conv_first_2min", "mooncake_fast25_conversation_first_1000"]
)
def test_shipped_traces_read_at_once_as_line_by_line(name: str) -> None:
    path = resolve_trace(name)
    at_once = jsonl._load_at_once(path)
    assert at_once is not None
    assert at_once == jsonl._load_by_line(path)


def test_blank_lines_crlf_and_a_bom_read_at_once(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [HEADER, "", record(0, ', "hash_ids": [1, 2, 3]'), "   ", record(1)]
    path.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode())
    at_once = jsonl._load_at_once(path)
    assert at_once is not None and len(at_once) == 2
    assert at_once == jsonl._load_by_line(path)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        # a string that only closes on the next line, two records on a third line: as
        # many values as lines when joined without a newline
        (
            [
                HEADER,
                '{"request_id": "a}',
                '{b", "arrival_time_s": 0, "prompt_tokens": 1, "output_tokens": 1}',
                f"{record(2)}, {record(3)}",
            ],
            r"\.jsonl:2: ",
        ),
        # an object split across lines at a nested object
        ([HEADER, '{"request_id": "0", "x": {}', "{}}", record(1)], r"\.jsonl:2: "),
        ([HEADER, record(0), record(0)], "duplicate request_id"),
        ([HEADER, record(0), record(1, ', "ouput_tokens": 3')], r"\.jsonl:3: unknown field"),
        ([HEADER, record(0), '{"request_id": "1", "request_id": "2"}'], "given twice"),
        ([HEADER, record(0), "[1, 2]"], "expected a JSON object"),
        ([HEADER], "no requests"),
        ([], "empty"),
    ],
)
def test_what_line_by_line_refuses_is_refused(
    lines: list[str], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert jsonl._load_at_once(path) is None
    with pytest.raises(TraceFormatError, match=message) as raised:
        jsonl.load_jsonl(path)
    with pytest.raises(TraceFormatError) as by_line:
        jsonl._load_by_line(path)
    assert str(raised.value) == str(by_line.value)


def test_a_large_file_is_read_line_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([HEADER, record(0), record(1)]) + "\n")
    assert jsonl._load_at_once(path) is not None
    monkeypatch.setattr(jsonl, "_AT_ONCE_MAX_BYTES", 64)
    assert jsonl._load_at_once(path) is None
    assert len(jsonl.load_jsonl(path)) == 2
