"""kvsim trace files round-trip exactly and sort unsorted arrivals stably."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from workloads import Request, Trace, load_trace, save_trace

SUFFIXES = [".json", ".jsonl", ".csv"]


def rich_trace() -> Trace:
    requests = [
        Request(request_id="b,1", arrival_time_s=0.25, prompt_tokens=1025, output_tokens=3,
                hash_ids=(7, 8, 9), session_id="s 1", cancel_after_s=2.5, priority=-1),
        Request(request_id="2", arrival_time_s=0.1 + 0.2, prompt_tokens=1, output_tokens=1),
        Request(request_id="é", arrival_time_s=1e-7, prompt_tokens=512, output_tokens=9,
                hash_ids=(-4,), priority=3),
    ]  # fmt: skip
    return Trace(name="rich trace", hash_block_size=512, requests=requests)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip_is_exact(tmp_path: Path, suffix: str) -> None:
    trace = rich_trace()
    path = tmp_path / f"t{suffix}"
    save_trace(trace, path)
    assert load_trace(path) == trace
    save_trace(load_trace(path), tmp_path / f"again{suffix}")
    assert (tmp_path / f"again{suffix}").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    path.write_text("old")
    save_trace(rich_trace(), path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_failed_save_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("old")

    def boom(*_args: object) -> dict[str, object]:
        raise RuntimeError("disk full")

    monkeypatch.setattr("workloads.formats.jsonl.record_from_request", boom)
    with pytest.raises(RuntimeError):
        save_trace(rich_trace(), path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]


def test_unsorted_jsonl_is_sorted_stably(write: Callable[[str, str], Path]) -> None:
    lines = [
        '{"request_id": "late", "arrival_time_s": 5, "prompt_tokens": 1, "output_tokens": 1}',
        '{"request_id": "tie-1", "arrival_time_s": 1, "prompt_tokens": 1, "output_tokens": 1}',
        '{"request_id": "tie-2", "arrival_time_s": 1.0, "prompt_tokens": 1, "output_tokens": 1}',
        '{"request_id": 0, "arrival_time_s": 0, "prompt_tokens": 1, "output_tokens": 1}',
    ]
    trace = load_trace(write("plain.jsonl", "\n".join(lines) + "\n\n"))
    assert [r.request_id for r in trace.requests] == ["0", "tie-1", "tie-2", "late"]
    assert trace.name == "plain"  # no metadata line: the file's stem
    assert trace.hash_block_size is None


def test_csv_without_metadata_and_with_semicolon_hash_ids(
    write: Callable[[str, str], Path],
) -> None:
    text = (
        '# {"kvsim_trace": 1, "hash_block_size": 4}\n'
        "output_tokens,prompt_tokens,request_id,arrival_time_s,hash_ids,priority\n"
        "3,5,x,0.5,1;2,\n"
        "4,8, y ,0,3 4,2\n"
    )
    trace = load_trace(write("t.csv", text))
    assert trace.name == "t"
    assert [(r.request_id, r.hash_ids, r.priority) for r in trace.requests] == [
        (" y ", (3, 4), 2),
        ("x", (1, 2), 0),
    ]


def test_utf8_bom_is_accepted(write: Callable[[str, bytes], Path]) -> None:
    data = "\ufeffrequest_id,arrival_time_s,prompt_tokens,output_tokens\na,0,1,1\n".encode()
    assert load_trace(write("bom.csv", data)).requests[0].request_id == "a"
