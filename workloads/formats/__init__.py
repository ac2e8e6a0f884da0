"""kvsim trace files: JSON document (.json), JSON Lines (.jsonl) and CSV (.csv).

The format follows the file's extension. Loading validates every record and raises one
:class:`~workloads.errors.TraceFormatError` naming file, line (or record) and field. Nothing here
evaluates code: only ``json`` and ``csv`` parse input. See docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workloads.errors import TraceFormatError, WorkloadError
from workloads.formats.csvfile import load_csv, save_csv
from workloads.formats.jsondoc import load_json, save_json
from workloads.formats.jsonl import load_jsonl, save_jsonl
from workloads.formats.textio import gc_paused
from workloads.request import Trace

_LOADERS: dict[str, Callable[[str | Path], Trace]] = {
    ".json": load_json,
    ".jsonl": load_jsonl,
    ".csv": load_csv,
}
_SAVERS: dict[str, Callable[[Trace, str | Path], None]] = {
    ".json": save_json,
    ".jsonl": save_jsonl,
    ".csv": save_csv,
}
TRACE_SUFFIXES = tuple(_LOADERS)


def _suffix(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in _LOADERS:
        raise TraceFormatError(
            f"unsupported file extension {suffix or '(none)'!s}; use .json, .jsonl or .csv",
            path=path,
        )
    return suffix


def load_trace(path: str | Path, *, columns: bool = False) -> Trace:
    """Load a kvsim trace, choosing the format by extension (.json, .jsonl, .csv).
    ``columns``: a JSON Lines trace's requests held as columns however few they are
    (workloads/request_columns.py; past 65,536 they always are), for a caller that reads
    whole columns, as a run does: its Requests are never built.

    Raises:
        TraceFormatError: the file breaks a rule (message ``file:line: reason``), or cannot be
            read: missing, unreadable, not a regular file (a directory, FIFO or device), a line
            over 1 MiB, a JSON document over 1 GiB (message ``file: reason``).
    """
    loader = _LOADERS[_suffix(path)]
    with gc_paused():
        return load_jsonl(path, columns=True) if columns and loader is load_jsonl else loader(path)


def save_trace(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` in the format of ``path``'s extension, atomically (temp file + rename).

    Raises:
        WorkloadError: the trace has no requests (such a file could not be loaded back).
        TraceFormatError: unsupported extension.
        OSError: the folder does not exist or is not writable.
    """
    saver = _SAVERS[_suffix(path)]
    if not trace.requests:
        raise WorkloadError(f"{path}: refusing to write a trace with no requests")
    saver(trace, path)


__all__ = ["TRACE_SUFFIXES", "load_trace", "save_trace"]
