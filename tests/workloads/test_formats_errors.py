"""Each bad input gives exactly one line naming file, line (or record) and field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from workloads import TraceFormatError, load_trace

META = '{"kvsim_trace": 1, "name": "t", "hash_block_size": null}\n'


def ok(i: int, t: float = 0.0) -> str:
    return (
        f'{{"request_id": "r{i}", "arrival_time_s": {t}, "prompt_tokens": 5, "output_tokens": 2}}\n'
    )


def line(body: str) -> str:
    return "{" + body + "}\n"


REQ = '"request_id": "x", "arrival_time_s": 1, "prompt_tokens": 5'
AT = '"request_id": "x", "prompt_tokens": 5, "output_tokens": 1, "arrival_time_s": '
CSV_HEAD = "request_id,arrival_time_s,prompt_tokens,output_tokens\n"

CASES = [
    # (file name, content, expected message, field)
    ("t.jsonl", META + ok(1) + line(REQ + ', "output_tokens": -3'),
     "t.jsonl:3: output_tokens must be a positive integer, got -3", "output_tokens"),
    ("t.jsonl", ok(1) + ok(2) + ok(1), 't.jsonl:3: duplicate request_id "r1" (first at line 1)',
     "request_id"),
    ("t.jsonl", line(REQ + ', "output_tokens": 3.5'),
     "t.jsonl:1: output_tokens must be a positive integer, got 3.5", "output_tokens"),
    ("t.jsonl", line(REQ + ', "output_tokens": "7"'),
     't.jsonl:1: output_tokens must be a positive integer, got "7"', "output_tokens"),
    ("t.jsonl", line(REQ + ', "output_tokens": true'),
     "t.jsonl:1: output_tokens must be a positive integer, got true", "output_tokens"),
    ("t.jsonl", line(AT + "NaN"),
     "t.jsonl:1: arrival_time_s must be a finite number >= 0, got nan", "arrival_time_s"),
    ("t.jsonl", line(AT + "Infinity"),
     "t.jsonl:1: arrival_time_s must be a finite number >= 0, got inf", "arrival_time_s"),
    ("t.jsonl", ok(1) + line(REQ), "t.jsonl:2: missing field output_tokens", "output_tokens"),
    ("t.jsonl", line(REQ + ', "output_tokens": null'), "t.jsonl:1: missing field output_tokens",
     "output_tokens"),
    ("t.jsonl", line(REQ + ', "output_tokens": 1, "ouput_tokens": 1'),
     't.jsonl:1: unknown field "ouput_tokens"', "ouput_tokens"),
    ("t.jsonl", ok(1) + META, "t.jsonl:2: the metadata line must be the first line", "kvsim_trace"),
    ("t.jsonl", "", "t.jsonl: file is empty", None),
    ("t.jsonl", "\n  \n", "t.jsonl: file is empty", None),
    ("t.jsonl", META, "t.jsonl: file has no requests", None),
    ("t.jsonl", ok(1) + '{"request_id": "a", \n',
     "t.jsonl:2: malformed JSON: Expecting property name enclosed in double quotes at column 21",
     None),
    ("t.jsonl", ok(1) + "[1, 2]\n", "t.jsonl:2: expected a JSON object, got array", None),
    ("t.jsonl", '{"kvsim_trace": 2}\n' + ok(1),
     "t.jsonl:1: unsupported kvsim_trace version 2 (this kvsim reads version 1)", "kvsim_trace"),
    ("t.jsonl", '{"kvsim_trace": 1, "hash_block_size": 0}\n' + ok(1),
     "t.jsonl:1: hash_block_size must be a positive integer or null, got 0", "hash_block_size"),
    ("t.jsonl", '{"kvsim_trace": 1, "colour": "red"}\n' + ok(1),
     't.jsonl:1: unknown metadata field "colour"', "colour"),
    ("t.jsonl", line(REQ + ', "output_tokens": 1, "hash_ids": [1]'),
     "t.jsonl:1: hash_ids given but the trace has no hash_block_size", "hash_ids"),
    ("t.json", '{"kvsim_trace": 1, "requests": [' + ok(1) + "," + line(REQ) + "]}",
     "t.json: requests[1]: missing field output_tokens", "output_tokens"),
    ("t.json", '{"kvsim_trace": 1, "requests": [' + ok(1) + "," + ok(1) + "]}",
     't.json: requests[1]: duplicate request_id "r1" (first at record 0)', "request_id"),
    ("t.json", '{"requests": []}', "t.json: missing field kvsim_trace (expected 1)", "kvsim_trace"),
    ("t.json", '{"kvsim_trace": 1, "requests": []}', "t.json: file has no requests", None),
    ("t.json", '{"kvsim_trace": 1, "requests": {}}',
     "t.json: requests must be an array, got object", "requests"),
    ("t.json", "[]", 't.json: expected a JSON object with "kvsim_trace": 1, got array', None),
    ("t.json", '{"kvsim_trace": 1,\n "requests": [}',
     "t.json:2: malformed JSON: Expecting value at column 15", None),
    ("t.json", "   ", "t.json: file is empty", None),
    ("t.csv", CSV_HEAD + "a,0,5,2\nb,1,5,-3\n",
     "t.csv:3: output_tokens must be a positive integer, got -3", "output_tokens"),
    ("t.csv", CSV_HEAD + "a,0,5,2\nb,1,5.5,3\n",
     "t.csv:3: prompt_tokens must be a positive integer, got 5.5", "prompt_tokens"),
    ("t.csv", CSV_HEAD + "a,0,true,3\n",
     't.csv:2: prompt_tokens must be a positive integer, got "true"', "prompt_tokens"),
    ("t.csv", CSV_HEAD + "a,nan,5,3\n",
     "t.csv:2: arrival_time_s must be a finite number >= 0, got nan", "arrival_time_s"),
    ("t.csv", CSV_HEAD + "a,0,5,3\na,1,5,3\n",
     't.csv:3: duplicate request_id "a" (first at line 2)', "request_id"),
    ("t.csv", CSV_HEAD + "a,0,,3\n", "t.csv:2: missing field prompt_tokens", "prompt_tokens"),
    ("t.csv", CSV_HEAD + "a,0,5\n", "t.csv:2: expected 4 columns, got 3", None),
    ("t.csv", "request_id,arrival_time_s,prompt_tokens\n", "t.csv:1: missing column output_tokens",
     "output_tokens"),
    ("t.csv", CSV_HEAD.strip() + ",colour\na,0,1,1,red\n", 't.csv:1: unknown column "colour"',
     "colour"),
    ("t.csv", '# {"kvsim_trace": 1}\n' + CSV_HEAD.strip() + ",hash_ids\na,0,1,1,1 x\n",
     't.csv:3: hash_ids must be integers separated by spaces or semicolons, got "1 x"', "hash_ids"),
    ("t.csv", '# {"kvsim_trace": 3}\n' + CSV_HEAD,
     "t.csv:1: unsupported kvsim_trace version 3 (this kvsim reads version 1)", "kvsim_trace"),
    ("t.csv", "", "t.csv: file is empty", None),
    ("t.csv", CSV_HEAD, "t.csv: file has no requests", None),
    ("t.txt", "x", "t.txt: unsupported file extension .txt; use .json, .jsonl or .csv", None),
]  # fmt: skip


@pytest.mark.parametrize(("name", "content", "message", "field"), CASES)
def test_bad_input_message(
    write: Callable[[str, str], Path], name: str, content: str, message: str, field: str | None
) -> None:
    path = write(name, content)
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    error = info.value
    assert str(error).replace(str(path.parent) + "/", "") == message
    assert "\n" not in str(error)
    assert error.field == field
    assert error.path == str(path)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize("name", ["t.jsonl", "t.csv", "t.json"])
def test_non_utf8_bytes_name_the_line(write: Callable[[str, bytes], Path], name: str) -> None:
    good = CSV_HEAD if name.endswith(".csv") else ok(1)
    bad = b'{"request_id": "\xff"}\n' if name.endswith("l") else b"b\xff,0,1,1\n"
    path = write(name, good.encode() + bad)
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert info.value.line == 2
    assert "not valid UTF-8 text (byte 0xff at column" in str(info.value)


def test_json_record_errors_carry_the_record_index(write: Callable[[str, str], Path]) -> None:
    path = write("t.json", '{"kvsim_trace": 1, "requests": [' + ok(1) + ", 5]}")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert (info.value.record, info.value.line) == (1, None)
    assert info.value.reason == "expected a JSON object, got number"
