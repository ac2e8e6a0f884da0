"""What every hostile-input test asserts: a call succeeds, or it raises the project's error as
one short printable line that names the file, the line (or record) and the field."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from workloads import Trace, TraceFormatError, WorkloadError, load_trace, save_trace
from workloads.limits import MAX_INT64, MAX_TIME_S, MAX_TOKENS, MAX_UINT64, MIN_INT64

T = TypeVar("T")

# A message is one line; it may quote a value, shortened, but never echo a whole hostile input.
MAX_MESSAGE_CHARS = 400


def outcome(call: Callable[[], T]) -> T | WorkloadError:
    """The call's result or its WorkloadError; any other exception fails the test, as a
    traceback would be what the user sees."""
    try:
        return call()
    except WorkloadError as err:
        return err
    except BaseException as err:
        raise AssertionError(f"{type(err).__name__} escaped: {err!r:.300}") from err


def check_message(err: WorkloadError, path: Path | None = None) -> str:
    """Assert the message is one short printable line (starting with the file when given)."""
    message = str(err)
    assert "\n" not in message and "\r" not in message, message
    assert message.isprintable(), ascii(message)
    budget = MAX_MESSAGE_CHARS + (len(str(path)) if path else 0)
    assert len(message) <= budget, message[:200]
    if path is not None:
        assert message.startswith(f"{path}"), message
    return message


def check_located(
    err: WorkloadError,
    path: Path,
    *,
    line: int | None = None,
    record: int | None = None,
    fields: tuple[str | None, ...] = (),
) -> TraceFormatError:
    """Assert ``err`` is a TraceFormatError at ``path`` and ``line``/``record`` whose field is
    one of ``fields`` (when given); a named field must appear in the reason."""
    assert isinstance(err, TraceFormatError), repr(err)
    check_message(err, path)
    assert err.path == str(path)
    if line is not None:
        assert err.line == line, str(err)
        assert str(err).startswith(f"{path}:{line}: "), str(err)
    if record is not None:
        assert err.record == record, str(err)
        assert str(err).startswith(f"{path}: requests[{record}]: "), str(err)
    if fields:
        assert err.field in fields, (err.field, str(err))
    if err.field is not None and err.field.isprintable():
        assert err.field in err.reason, str(err)
    return err


def check_trace(trace: Trace, tmp: Path) -> None:
    """An accepted trace holds only values every later stage can use, and survives a save."""
    assert trace.requests
    for request in trace.requests:
        assert 1 <= request.prompt_tokens <= MAX_TOKENS
        assert 1 <= request.output_tokens <= MAX_TOKENS
        assert 0.0 <= request.arrival_time_s <= MAX_TIME_S
        assert request.cancel_after_s is None or 0.0 <= request.cancel_after_s <= MAX_TIME_S
        assert MIN_INT64 <= request.priority <= MAX_INT64
        for text in (request.request_id, request.session_id):
            if text is not None:
                text.encode("utf-8")  # Parquet and every file format need valid UTF-8
        assert all(MIN_INT64 <= h <= MAX_UINT64 for h in request.hash_ids or ())
    trace.name.encode("utf-8")
    for suffix in (".jsonl", ".csv"):  # CSV has its own limits (a cell's size); .json as .jsonl
        copy = tmp / f"roundtrip{suffix}"
        save_trace(trace, copy)
        assert load_trace(copy) == trace
        copy.unlink()


def files_in(folder: Path) -> set[str]:
    """Names in ``folder``, hidden temporaries included."""
    return {path.name for path in folder.iterdir()}


def each_case(cases: Iterable[T], check: Callable[[T], None]) -> int:
    """Run ``check`` on every case (many cases per test: pytest's per-test cost would dominate),
    then fail naming every case that failed. Returns the number of cases."""
    failures = []
    count = 0
    for case in cases:
        count += 1
        try:
            check(case)
        except AssertionError as err:
            failures.append(f"{ascii(case)[:80]}: {str(err)[:300]}")
    assert not failures, f"{len(failures)} of {count} cases failed:\n" + "\n".join(failures)
    return count
