"""Issue 31: a key given twice in a trace (a request's field, or the document's requests) is
refused with one line naming the record and the key, never the last value silently; BurstGPT
and Mooncake timestamps outside 0 to 2^32 s are refused with the line that holds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads import load_trace
from workloads.errors import TraceFormatError
from workloads.importers.burstgpt import import_burstgpt
from workloads.importers.mooncake import import_mooncake

RECORD = '"request_id": "a", "arrival_time_s": 0, "prompt_tokens": 5, "output_tokens": 3'


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('{"request_id": "a", "arrival_time_s": 0, "arrival_time_s": 9, "prompt_tokens": 5, '
         '"output_tokens": 3}', "arrival_time_s"),
        ('{"request_id": "a", "arrival_time_s": 0, "prompt_tokens": 5, "output_tokens": 3, '
         '"prompt_tokens": 7}', "prompt_tokens"),
        ('{"request_id":"a","arrival_time_s":0,"prompt_tokens":5,"output_tokens":3,'
         '"output_tokens" : 4}', "output_tokens"),
    ],
)  # fmt: skip
def test_a_jsonl_record_with_a_key_twice_is_refused(line: str, key: str, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(f"{{{RECORD.replace('a', 'b', 1)}}}\n{line}\n")
    with pytest.raises(TraceFormatError) as err:
        load_trace(path)
    assert str(err.value).startswith(f"{path}:2: ")
    assert f"{key!r} is given twice" in str(err.value)


def test_colons_in_strings_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"request_id": "a:b:c", "arrival_time_s": 0, "prompt_tokens": 5, '
                    '"output_tokens": 3}\n')  # fmt: skip
    assert load_trace(path).requests[0].request_id == "a:b:c"


@pytest.mark.parametrize(
    ("document", "where"),
    [
        (f'{{"kvsim_trace": 1, "requests": [{{{RECORD}, "prompt_tokens": 9}}]}}',
         "requests[0]: field 'prompt_tokens'"),
        (f'{{"kvsim_trace": 1, "requests": [], "requests": [{{{RECORD}}}]}}',
         "field 'requests'"),
        (f'{{"kvsim_trace": 1, "kvsim_trace": 1, "requests": [{{{RECORD}}}]}}',
         "field 'kvsim_trace'"),
    ],
)  # fmt: skip
def test_a_json_document_with_a_key_twice_is_refused(
    document: str, where: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.json"
    path.write_text(document)
    with pytest.raises(TraceFormatError, match="given twice") as err:
        load_trace(path)
    assert where in str(err.value)


@pytest.mark.parametrize("stamp", ["-5", "-0.5", "4294967297", "1e300"])
def test_burstgpt_timestamps_out_of_range_are_refused(stamp: str, tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text(f"Timestamp,Model,Request tokens,Response tokens\n1,a,10,5\n{stamp},a,10,5\n")
    with pytest.raises(TraceFormatError, match="Timestamp must be from 0") as err:
        import_burstgpt(path)
    assert str(err.value).startswith(f"{path}:3: ")


@pytest.mark.parametrize("stamp", ["-5", "-0.5", "4294967296001", "1e300"])
def test_mooncake_timestamps_out_of_range_are_refused(stamp: str, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    row = '{{"timestamp": {}, "input_length": 10, "output_length": 5, "hash_ids": [1]}}\n'
    path.write_text(row.format(0) + row.format(stamp))
    with pytest.raises(TraceFormatError, match="timestamp must be a number of milliseconds"):
        import_mooncake(path)
