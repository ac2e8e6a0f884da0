"""Exceptions for bad workload input (files, options, SPEC strings).

All are ``ValueError`` subclasses so library callers can catch them generically; the CLI
turns :class:`WorkloadError` into one red line and exit code 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

_MAX_SHOWN_CHARS = 60


class WorkloadError(ValueError):
    """Base class for user-facing workload errors."""


class SpecError(WorkloadError):
    """A malformed option value, e.g. a length SPEC such as ``uniform:5``."""


class TraceFormatError(WorkloadError):
    """A trace file (or a Request/Trace built in code) breaks the kvsim trace rules.

    Attributes:
        reason: the message without location,
            e.g. ``output_tokens must be a positive integer, got -3``.
        path: the file as given by the caller, or None for objects built in code.
        line: 1-based physical line in the file (JSON Lines, CSV, malformed JSON), or None.
        record: 0-based index into ``requests`` of a JSON document, or None.
        field: the offending field or column name, or None when the whole record/file is wrong.
    """

    def __init__(
        self,
        reason: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        record: int | None = None,
        field: str | None = None,
    ) -> None:
        self.reason = reason
        self.path = None if path is None else str(path)
        self.line = line
        self.record = record
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        if self.path is None:
            return self.reason
        if self.line is not None:
            return f"{self.path}:{self.line}: {self.reason}"
        if self.record is not None:
            return f"{self.path}: requests[{self.record}]: {self.reason}"
        return f"{self.path}: {self.reason}"

    def located(
        self, path: str | Path, *, line: int | None = None, record: int | None = None
    ) -> TraceFormatError:
        """Return a copy of this error that names the file and line (or record)."""
        return TraceFormatError(self.reason, path=path, line=line, record=record, field=self.field)


def show_value(value: object) -> str:
    """Render a bad value as it looks in JSON (``"7"``, ``true``, ``3.5``), shortened."""
    if isinstance(value, float) and not math.isfinite(value):
        text = repr(value)  # nan / inf, as Python and CSV spell them
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = repr(value)
    if len(text) > _MAX_SHOWN_CHARS:
        text = text[: _MAX_SHOWN_CHARS - 3] + "..."
    return text
