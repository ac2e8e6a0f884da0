"""Hostile kvsim trace files: every field of every format given every awkward value, files that
are not files, endless lines, and fuzzed lines. Each load succeeds with a usable trace or raises
one TraceFormatError line naming file, line (or record) and field; nothing else escapes."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile import check_located, check_message, check_trace, each_case, outcome
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads import Trace, TraceFormatError, load_trace
from workloads.formats import textio
from workloads.limits import MAX_LINE_BYTES

Write = Callable[[str, str | bytes], Path]


@pytest.fixture(scope="module")
def _base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


_CASES = itertools.count()


@pytest.fixture
def case_dir(_base: Path) -> Path:
    """A fresh folder per case; cheaper than tmp_path over hundreds of cases."""
    folder = _base / f"case{next(_CASES)}"
    folder.mkdir()
    return folder


@pytest.fixture
def put(case_dir: Path) -> Write:
    def _put(name: str, content: str | bytes) -> Path:
        path = case_dir / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path

    return _put


BIG = "1" * 5000  # past Python's 4,300-digit int-string limit
# JSON texts for one field's value: each must be accepted correctly or refused naming the field.
JSON_VALUES = [
    BIG, "-" + BIG, "0" * 40 + "7", str(2**31), str(2**30), str(2**30 + 1), str(2**63), str(2**64),
    str(-(2**63) - 1), str(2**64 - 1), "1e15", str(2**32), "4294967296.5", "1e400", "-1e400",
    "-0.0", "NaN", "Infinity", "-1", "0", "5.5", "7.0", "1" + "0" * 400, '""', '"7"',
    '"\\ud800"', '"a\\udfffb"', '"\\u0000"', '"\\uff11\\uff12"', '"1_5"', '"\\u001b[31m"',
    '"[bold]x[/bold]"', '"' + "x" * 200_000 + '"', "true", "null", "[]", "{}", "[1, 2]",
    '[1, "2"]', "[" + BIG + "]", "[" * 500 + "]" * 500, "[" * 100_000 + "]" * 100_000,
    '{"a": ' * 2000 + "1" + "}" * 2000,
]  # fmt: skip
FIELDS = [
    "request_id", "arrival_time_s", "prompt_tokens", "output_tokens", "hash_ids", "session_id",
    "cancel_after_s", "priority",
]  # fmt: skip
BASE = {"request_id": '"r1"', "arrival_time_s": "0.5", "prompt_tokens": "8", "output_tokens": "4"}
META = '{"kvsim_trace": 1, "name": "t", "hash_block_size": 4}'


def _record(field: str, value: str) -> str:
    items = {**BASE, field: value}
    return "{" + ", ".join(f'"{key}": {text}' for key, text in items.items()) + "}"


OK0 = _record("request_id", '"r0"')


def _record_fields(field: str) -> tuple[str | None, ...]:
    # A wrong value may also be reported as malformed JSON (no field), or, for a good value
    # of the wrong size, as hash_ids not fitting the prompt.
    return (field, None, "hash_ids")


@pytest.mark.parametrize("field", FIELDS)
def test_jsonl_field_values(put: Write, case_dir: Path, field: str) -> None:
    def check(value: str) -> None:
        path = put("t.jsonl", f"{META}\n{OK0}\n\n{_record(field, value)}\n")
        result = outcome(lambda: load_trace(path))
        if isinstance(result, Trace):
            check_trace(result, case_dir)
        else:
            check_located(result, path, line=4, fields=_record_fields(field))

    assert each_case(JSON_VALUES, check) == len(JSON_VALUES)


@pytest.mark.parametrize("field", FIELDS)
def test_json_document_field_values(put: Write, case_dir: Path, field: str) -> None:
    def check(value: str) -> None:
        document = f'{META[:-1]}, "requests": [\n{OK0},\n{_record(field, value)}]}}'
        path = put("t.json", document)
        result = outcome(lambda: load_trace(path))
        if isinstance(result, Trace):
            check_trace(result, case_dir)
        elif isinstance(result, TraceFormatError) and result.record is None:
            check_located(result, path, line=3, fields=(None,))  # malformed JSON: no field
        else:
            check_located(result, path, record=1, fields=_record_fields(field))

    each_case(JSON_VALUES, check)


@pytest.mark.parametrize(
    "value",
    [BIG, "-" + BIG, str(2**64), "0", "true", '""', '"\\ud800"', "[" * 100_000, "1.5"],
    ids=lambda v: v[:24],
)
@pytest.mark.parametrize("key", ["kvsim_trace", "name", "hash_block_size", "colour"])
def test_metadata_values(put: Write, case_dir: Path, key: str, value: str) -> None:
    meta = {"kvsim_trace": "1", "name": '"t"', "hash_block_size": "null", key: value}
    header = "{" + ", ".join(f'"{k}": {v}' for k, v in meta.items()) + "}"
    path = put("t.jsonl", header + "\n" + OK0 + "\n")
    result = outcome(lambda: load_trace(path))
    if isinstance(result, Trace):
        check_trace(result, case_dir)
    else:
        check_located(result, path, line=1, fields=(key, None))


CSV_CELLS = [
    "1_5", "\uff11\uff12", "\u0661", BIG, "-" + BIG, "0" * 40 + "7", str(2**31), str(2**30 + 1),
    "1e15", str(2**32 + 1), "nan", "inf", "-inf", "-0", "  7 ", "7.0", "5.5", "0x10", "1e400",
    ".5", "5.", "+3", "", "1 2", "1;x", "\u00a07", '"a,b"', '"multi\nline"', "\U0001f600",
    "[bold]", "x" * 200_000, '"unclosed',
]  # fmt: skip
CSV_COLUMNS = [*FIELDS[:5], "session_id", "cancel_after_s", "priority"]


@pytest.mark.parametrize("column", CSV_COLUMNS)
def test_csv_cells(put: Write, case_dir: Path, column: str) -> None:
    header = ",".join(CSV_COLUMNS)
    good = {"request_id": "r0", "arrival_time_s": "0", "prompt_tokens": "8", "output_tokens": "4"}

    def check(cell: str) -> None:
        row = {**good, "request_id": "r1", column: cell}
        lines = [f"# {META}", header, ",".join(good.get(c, "") for c in CSV_COLUMNS)]
        lines.append(",".join(row.get(c, "") for c in CSV_COLUMNS))
        path = put("t.csv", "\n".join(lines) + "\n")
        result = outcome(lambda: load_trace(path))
        if isinstance(result, Trace):
            check_trace(result, case_dir)
        else:
            assert isinstance(result, TraceFormatError)
            # a quoted cell may run onto the next physical line; csv errors name no field
            assert result.line in (4, 5), str(result)
            check_located(result, path, fields=(column, None, "hash_ids"))

    each_case(CSV_CELLS, check)


def test_surrogate_ids_are_refused_naming_record_and_field(write: Write) -> None:
    path = write(
        "t.jsonl", _record("request_id", '"ok"') + "\n" + _record("session_id", '"\\udc80"')
    )
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (2, "session_id")
    assert "lone surrogate" in info.value.reason


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (_record("prompt_tokens", BIG), "prompt_tokens", "got an integer of 5,000 digits"),
        (_record("output_tokens", str(2**31)), "output_tokens", "at most 1073741824"),
        (_record("arrival_time_s", "1e15"), "arrival_time_s", "at most 4294967296 s"),
        (_record("hash_ids", f"[{BIG}]"), "hash_ids", "64-bit integers"),
        (_record("request_id", '"\\ud800"'), "request_id", "lone surrogate"),
        ("[" * 100_000, None, "nested too deeply"),
    ],
)
def test_issue_cases_name_the_field(write: Write, text: str, field: str | None, words: str) -> None:
    path = write("t.jsonl", text + "\n")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (1, field)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("cell", "shown"), [("1_5", '"1_5"'), ("\uff11\uff12", '"\\uff11\\uff12"')]
)
def test_csv_numbers_are_ascii(write: Write, cell: str, shown: str) -> None:
    path = write("t.csv", f"request_id,arrival_time_s,prompt_tokens,output_tokens\na,0,{cell},1\n")
    with pytest.raises(TraceFormatError, match="prompt_tokens must be a positive integer") as info:
        load_trace(path)
    assert str(info.value).endswith(f"got {shown}")


# --- files that are not trace files ---------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_non_regular_files_are_refused_without_blocking(tmp_path: Path, suffix: str) -> None:
    fifo = tmp_path / f"pipe{suffix}"
    os.mkfifo(fifo)  # nobody writes: reading it would block forever
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    device = tmp_path / f"zero{suffix}"
    device.symlink_to("/dev/zero")
    for path, kind in ((fifo, "named pipe"), (folder, "directory"), (device, "character device")):
        result = outcome(lambda path=path: load_trace(path))
        assert isinstance(result, TraceFormatError)
        assert kind in check_message(result, path)
        assert (result.line, result.field) == (None, None)


def test_missing_and_unnameable_files_are_trace_errors(tmp_path: Path) -> None:
    for path in (tmp_path / "gone.jsonl", tmp_path / ("x" * 300 + ".jsonl")):
        result = outcome(lambda path=path: load_trace(path))
        assert isinstance(result, TraceFormatError), result
        check_message(result, path)
    result = outcome(lambda: load_trace(str(tmp_path / "nul\0.jsonl")))
    assert isinstance(result, TraceFormatError) and "NUL" in str(result)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_line_without_end_is_refused_at_the_cap(write: Write, suffix: str) -> None:
    head = "request_id,arrival_time_s,prompt_tokens,output_tokens\n" if suffix == ".csv" else ""
    path = write("t" + suffix, head.encode() + b"\0" * (MAX_LINE_BYTES + 10))
    with pytest.raises(TraceFormatError, match=r"longer than 1,048,576 bytes \(1 MiB\)") as info:
        load_trace(path)
    assert info.value.line == (2 if head else 1)


def test_a_line_at_the_cap_is_read(write: Write, tmp_path: Path) -> None:
    record = OK0
    padding = MAX_LINE_BYTES - len(record) - 1  # the line end counts
    path = write("t.jsonl", record[:-1] + " " * padding + "}\n")
    check_trace(load_trace(path), tmp_path)
    path = write("t.jsonl", record[:-1] + " " * (padding + 1) + "}\n")
    with pytest.raises(TraceFormatError, match="longer than"):
        load_trace(path)


def test_json_document_size_is_capped(write: Write, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(textio, "MAX_DOCUMENT_BYTES", 100)  # a real 1 GiB file is too slow
    path = write("t.json", f'{META[:-1]}, "requests": [{OK0}]}}')
    with pytest.raises(TraceFormatError, match="at most 100 bytes") as info:
        load_trace(path)
    assert "JSON Lines" in str(info.value)


# --- fuzzed lines -----------------------------------------------------------------------------

KEYS = st.sampled_from([*FIELDS, "kvsim_trace", "name", "hash_block_size", "x"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=8,
)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fuzz_folder(factory: pytest.TempPathFactory) -> Path:
    folder = factory.getbasetemp() / "fuzz"  # one folder for all examples: mktemp is slow
    folder.mkdir(exist_ok=True)
    return folder


@FUZZ
@given(record=st.dictionaries(KEYS, JSON, max_size=9))
def test_fuzzed_jsonl_records(tmp_path_factory: pytest.TempPathFactory, record: dict) -> None:
    folder = _fuzz_folder(tmp_path_factory)
    path = folder / "t.jsonl"
    text = json.dumps(record, ensure_ascii=False)
    path.write_bytes(text.encode("utf-8", "surrogatepass") + b"\n")
    result = outcome(lambda: load_trace(path))
    if isinstance(result, Trace):
        check_trace(result, folder)
    else:
        check_located(result, path, line=None if result.line is None else 1)


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(lambda t: t.encode("utf-8")))
def test_fuzzed_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    folder = _fuzz_folder(tmp_path_factory)
    for suffix in (".jsonl", ".csv", ".json"):
        path = folder / f"t{suffix}"
        path.write_bytes(b"request_id,arrival_time_s,prompt_tokens,output_tokens\n" + data)
        result = outcome(lambda path=path: load_trace(path))
        if isinstance(result, Trace):
            check_trace(result, folder)
        else:
            check_message(result, path)
