"""Hostile importer sources and generator options. Each import or gen either gives a usable
trace or raises one WorkloadError line (naming file, line and column for a source file, the
option for a generator); nothing else escapes, and a failed gen/import leaves no file behind."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile import check_located, check_message, check_trace, each_case, files_in, outcome

from workloads import (
    ArrivalProcess,
    ImportResult,
    SpecError,
    Trace,
    TraceFormatError,
    WorkloadError,
    generate_trace,
    rescale_to_rate,
    save_trace,
    scale_time,
    truncate,
)
from workloads.importers import import_azure, import_burstgpt, import_lengths, import_mooncake
from workloads.limits import MAX_GENERATED_REQUESTS

BIG = "1" * 5000
COUNT_CELLS = [
    "1_5", "\uff11\uff12", "\u0661", BIG, "-" + BIG, BIG + ".0", "0" * 40 + "7", str(2**31),
    str(2**30), str(2**30 + 1), "-1", "-0", "74.0", "74.5", " 7 ", "", "nan", "inf", "1e3",
    "0x10", "+5", "7.", ".0", "x" * 100_000,
]  # fmt: skip
SECONDS_CELLS = [
    "1_0", "\uff11", BIG, "-" + BIG, "1e400", "1e300", "-1e300", "nan", "inf", "1e15", "-5",
    "4294967297", "0.5", " 3 ", "1e-400", "", ".5", "5.", "1.2.3",
]  # fmt: skip
TIMESTAMPS = [
    "2023-11-16 99:15:46.6805900", "2023-11-16 18:60:46", "2023-11-16 18:15:60",
    "2023-11-16 18:15:46+25:00", "2023-11-16 18:15:46-12:99", "2023-02-30 18:15:46",
    "\uff12\uff10\uff12\uff13-11-16 18:15:46", "2023-11-16 18:15:46.1234567890",
    "0001-01-01 00:00:00", "9999-12-31 23:59:59.999999999", "2023-11-16T18:15:46Z",
    "2023-11-16 18:15:46 +0530", "", "x" * 10_000,
]  # fmt: skip

_CASES = itertools.count()


@pytest.fixture(scope="module")
def _base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile_imports")


@pytest.fixture
def case_dir(_base: Path) -> Path:
    folder = _base / f"case{next(_CASES)}"
    folder.mkdir()
    return folder


def _import_and_save(
    folder: Path, source: Path, importer: Callable[..., ImportResult], **options: Any
) -> ImportResult | WorkloadError:
    """What ``kvsim import`` does: import, then save; a failure must leave only the source."""
    out = folder / "out.jsonl"

    def run() -> ImportResult:
        result = importer(source, **options)
        save_trace(result.trace, out)
        return result

    result = outcome(run)
    if isinstance(result, WorkloadError):
        assert files_in(folder) == {source.name}, files_in(folder)
    else:
        check_trace(result.trace, folder)
    return result


def _check_row_error(result: ImportResult | WorkloadError, path: Path, column: str) -> None:
    if isinstance(result, WorkloadError):
        assert isinstance(result, TraceFormatError), result
        if result.field == "arrival_time_s":
            # after the shift to 0 the other row may be the one that lies too far away
            check_located(result, path, fields=("arrival_time_s",))
            assert result.line in (2, 3)
        else:
            check_located(result, path, line=3, fields=(column, None, "hash_ids"))


@pytest.mark.parametrize("cell", COUNT_CELLS, ids=lambda v: v[:20])
@pytest.mark.parametrize("column", ["ContextTokens", "GeneratedTokens"])
def test_azure_counts(case_dir: Path, column: str, cell: str) -> None:
    row = {"TIMESTAMP": "2023-11-16 18:15:47.0", "ContextTokens": "5", "GeneratedTokens": "5"}
    row[column] = cell
    path = case_dir / "azure.csv"
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,1,1\n"
    path.write_text(text + ",".join(row.values()) + "\n", encoding="utf-8")
    _check_row_error(_import_and_save(case_dir, path, import_azure), path, column)


@pytest.mark.parametrize("stamp", TIMESTAMPS, ids=lambda v: v[:20])
def test_azure_timestamps(case_dir: Path, stamp: str) -> None:
    path = case_dir / "azure.csv"
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,1,1\n"
    path.write_text(text + f"{stamp},5,5\n", encoding="utf-8")
    _check_row_error(_import_and_save(case_dir, path, import_azure), path, "TIMESTAMP")


def test_azure_hour_99_is_refused(case_dir: Path) -> None:
    path = case_dir / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 99:15:46,5,5\n")
    with pytest.raises(TraceFormatError, match="invalid time of day 99:15:46") as info:
        import_azure(path)
    assert (info.value.line, info.value.field) == (2, "TIMESTAMP")


@pytest.mark.parametrize("cell", COUNT_CELLS[::2] + SECONDS_CELLS, ids=lambda v: v[:20])
@pytest.mark.parametrize("column", ["Timestamp", "Request tokens", "Response tokens"])
def test_burstgpt_cells(case_dir: Path, column: str, cell: str) -> None:
    row = {"Timestamp": "7", "Model": "ChatGPT", "Request tokens": "5", "Response tokens": "5"}
    row[column] = cell
    path = case_dir / "burst.csv"
    text = "Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,1,1\n"
    path.write_text(text + ",".join(row.values()) + "\n", encoding="utf-8")
    _check_row_error(_import_and_save(case_dir, path, import_burstgpt), path, column)


MOONCAKE_VALUES = [
    BIG, "-" + BIG, "1e400", "1e300", "NaN", "-1", "0", "5.5", "7.0", str(2**31), str(2**70),
    '"5"', "true", "null", "[]", "{}", "[" * 100_000, '"\\ud800"', "[" + BIG + "]", "[1, 2]",
]  # fmt: skip


@pytest.mark.parametrize("value", MOONCAKE_VALUES, ids=lambda v: v[:20])
@pytest.mark.parametrize("key", ["timestamp", "input_length", "output_length", "hash_ids"])
def test_mooncake_values(case_dir: Path, key: str, value: str) -> None:
    row = {"timestamp": "10", "input_length": "5", "output_length": "5", "hash_ids": "[7]"}
    row[key] = value
    path = case_dir / "mooncake.jsonl"
    good = '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1]}\n'
    record = "{" + ", ".join(f'"{k}": {v}' for k, v in row.items()) + "}\n"
    path.write_text(good + "\n" + record, encoding="utf-8")
    _check_row_error(_import_and_save(case_dir, path, import_mooncake), path, key)


@pytest.mark.parametrize("cell", COUNT_CELLS, ids=lambda v: v[:20])
def test_lengths_cells(case_dir: Path, cell: str) -> None:
    path = case_dir / "lengths.csv"
    path.write_text(f"num_prefill_tokens,num_decode_tokens\n5,5\n{cell},4\n", encoding="utf-8")
    arrivals = ArrivalProcess(rate_per_s=2.0)
    result = _import_and_save(case_dir, path, import_lengths, arrivals=arrivals)
    _check_row_error(result, path, "num_prefill_tokens")


@pytest.mark.parametrize(
    "options",
    [
        {"seed": -1}, {"seed": 1.5}, {"seed": True}, {"seed": "7"}, {"seed": 2**200},
        {"num_requests": 10**14}, {"num_requests": 1e14}, {"num_requests": 0},
        {"num_requests": -1}, {"num_requests": True}, {"num_requests": 2.0}, {"num_requests": 3},
    ],
    ids=str,
)  # fmt: skip
def test_lengths_options(case_dir: Path, options: dict[str, Any]) -> None:
    path = case_dir / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n5,5\n6,6\n", encoding="utf-8")
    arrivals = ArrivalProcess(rate_per_s=2.0)
    result = _import_and_save(case_dir, path, import_lengths, arrivals=arrivals, **options)
    if isinstance(result, WorkloadError):
        check_message(result)
    else:
        assert result.trace.requests[0].arrival_time_s == 0.0


def test_every_importer_refuses_files_that_are_not_files(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    folder = tmp_path / "dir.csv"
    folder.mkdir()
    importers: list[tuple[Callable[..., ImportResult], dict[str, Any]]] = [
        (import_azure, {}),
        (import_burstgpt, {}),
        (import_mooncake, {}),
        (import_lengths, {"arrivals": ArrivalProcess(rate_per_s=1.0)}),
    ]
    for (importer, options), path in itertools.product(importers, [fifo, folder]):
        result = outcome(lambda importer=importer, path=path, o=options: importer(path, **o))
        assert isinstance(result, TraceFormatError), result
        check_message(result, path)


# --- generators -------------------------------------------------------------------------------

SPECS = [
    "fixed:1e23", "fixed:100000000000000000000000", "fixed:" + BIG, "fixed:-5", "fixed:0",
    "fixed:\uff11\uff12", "fixed:1_000", "fixed:", "", "7", "-7", "uniform:1:1e30",
    f"uniform:1:{2**30 + 1}", "uniform:5:2", "uniform:1:2:3", "lognormal:1e300:1",
    "lognormal:1000:1e200", "lognormal:1000:nan", "lognormal:0.5:1", "lognormal:1000:1:0",
    "lognormal:1000:100", "lognormal:1e9:100", "lognormal:1000:0:5", "normal:5:1", "trace:",
    "trace:/dev/zero", "trace:/nonexistent.jsonl", "trace:" + "x" * 5000, "fixed:" + "1" * 40,
    "x" * 100_000,
]  # fmt: skip


@pytest.mark.parametrize("spec", SPECS, ids=lambda v: v[:24])
def test_length_specs(case_dir: Path, spec: str) -> None:
    def run() -> Trace:
        trace = generate_trace(
            arrivals=ArrivalProcess(rate_per_s=5.0), prompt=spec, output="fixed:3", num_requests=50
        )
        save_trace(trace, case_dir / "out.jsonl")
        return trace

    result = outcome(run)
    if isinstance(result, WorkloadError):
        check_message(result)
        assert files_in(case_dir) == set()
    else:
        check_trace(result, case_dir)


ARRIVALS: list[dict[str, Any]] = [
    {"rate_per_s": 0}, {"rate_per_s": -1}, {"rate_per_s": math.nan}, {"rate_per_s": math.inf},
    {"rate_per_s": 1e-300}, {"rate_per_s": 5e-324}, {"rate_per_s": 1e300}, {"rate_per_s": True},
    {"rate_per_s": "5"}, {"rate_per_s": 1, "kind": "gamma", "cv": 1e200},
    {"rate_per_s": 1, "kind": "gamma", "cv": 1e-200}, {"rate_per_s": 1, "kind": "gamma", "cv": 0},
    {"rate_per_s": 1, "kind": "gamma", "cv": -1}, {"rate_per_s": 1, "kind": "gamma", "cv": 100},
    {"rate_per_s": 1, "kind": "gamma", "cv": 0.001}, {"rate_per_s": 1, "kind": "bogus"},
    {"rate_per_s": 1, "cv": 2}, {"rate_per_s": np.float64(3.0)},
]  # fmt: skip
COUNTS: list[dict[str, Any]] = [
    {"num_requests": 10**14}, {"num_requests": 1e14}, {"num_requests": 0}, {"num_requests": -1},
    {"num_requests": True}, {"num_requests": 20}, {"duration_s": 1e300}, {"duration_s": math.nan},
    {"duration_s": 0}, {"duration_s": -1}, {"duration_s": 1e-300}, {"duration_s": 2.0**32},
    {"duration_s": 10.0}, {"num_requests": 5, "duration_s": 5.0}, {},
]  # fmt: skip


@pytest.mark.parametrize("arrival", ARRIVALS, ids=str)
def test_generator_options(case_dir: Path, arrival: dict[str, Any]) -> None:
    def check(count: dict[str, Any]) -> None:
        def run() -> Trace:
            trace = generate_trace(
                arrivals=ArrivalProcess(**arrival), prompt="fixed:4", output="fixed:2", **count
            )
            save_trace(trace, case_dir / "out.jsonl")
            return trace

        result = outcome(run)
        if isinstance(result, WorkloadError):
            check_message(result)
            assert files_in(case_dir) == set()
        else:
            check_trace(result, case_dir)
            assert len(result) <= MAX_GENERATED_REQUESTS
            (case_dir / "out.jsonl").unlink()

    each_case(COUNTS, check)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "7", 2**200, np.int64(3), None], ids=str)
def test_seeds(seed: object) -> None:
    result = outcome(
        lambda: generate_trace(
            arrivals=ArrivalProcess(rate_per_s=1.0),
            prompt="fixed:4",
            output="fixed:2",
            num_requests=3,
            seed=seed,  # type: ignore[arg-type]
        )
    )
    if isinstance(result, WorkloadError):
        assert isinstance(result, SpecError) and "seed must be an integer >= 0" in str(result)
    else:
        assert len(result) == 3


@pytest.mark.parametrize(
    "call",
    [
        lambda t: scale_time(t, 1e300), lambda t: scale_time(t, math.nan),
        lambda t: scale_time(t, 0), lambda t: scale_time(t, "2"),
        lambda t: rescale_to_rate(t, 1e-300),
        lambda t: rescale_to_rate(t, 1e300), lambda t: rescale_to_rate(t, True),
        lambda t: truncate(t, max_requests=2.5), lambda t: truncate(t, max_requests=0),
        lambda t: truncate(t, max_duration_s=math.nan), lambda t: truncate(t, max_duration_s="1"),
        lambda t: truncate(t, max_requests=10**30, max_duration_s=math.inf),
    ],
)  # fmt: skip
def test_rescaling_options(case_dir: Path, call: Callable[[Trace], Trace]) -> None:
    trace = generate_trace(
        arrivals=ArrivalProcess(rate_per_s=1.0), prompt="fixed:4", output="fixed:2", num_requests=5
    )
    result = outcome(lambda: call(trace))
    if isinstance(result, WorkloadError):
        check_message(result)
    else:
        check_trace(result, case_dir)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"arrivals": ArrivalProcess(rate_per_s=1.0), "num_requests": 10**14}, "num_requests"),
        ({"prompt": "fixed:1e23"}, "is not an integer"),
        ({"prompt": "lognormal:1e300:1"}, "MEAN must be from 1 to"),
        ({"prompt": "fixed:100000000000000000000000"}, "lengths must be >= 1 and <= 1073741824"),
        ({"arrivals": ArrivalProcess(rate_per_s=1e-12), "num_requests": 10}, "past the"),
    ],
)
def test_issue_option_cases_are_spec_errors(options: dict[str, Any], words: str) -> None:
    arguments: dict[str, Any] = {
        "arrivals": ArrivalProcess(rate_per_s=1.0),
        "prompt": "fixed:4",
        "output": "fixed:2",
        "num_requests": 3,
        **options,
    }
    with pytest.raises(SpecError, match=words):
        generate_trace(**arguments)


def test_cv_1e200_is_refused_naming_cv() -> None:
    with pytest.raises(SpecError, match=r"cv must be from 0\.001 to 100"):
        ArrivalProcess(rate_per_s=1.0, kind="gamma", cv=1e200)  # type: ignore[arg-type]
