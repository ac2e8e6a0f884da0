"""Exceptions for bad workload input (files, options, SPEC strings).

All are ``ValueError`` subclasses so library callers can catch them generically; the CLI
turns :class:`WorkloadError` into one red line and exit code 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from workloads.limits import MAX_INTEGER_DIGITS

_MAX_SHOWN_CHARS = 60
_MAX_SHOWN_INT_BITS = 200  # about 60 digits: longer ones would be cut anyway


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


class OversizedInteger:
    """An integer literal too long for any field, kept as its digit count instead of an int.

    Parsers make one instead of calling ``int()`` on more than
    :data:`~workloads.limits.MAX_INTEGER_DIGITS` significant digits (``int()`` itself refuses
    more than 4,300 with a ValueError that names no field); the validator of the field that
    holds it then refuses it with the field's range.
    """

    __slots__ = ("digits", "negative")

    def __init__(self, literal: str) -> None:
        text = literal.strip()
        self.negative = text.startswith("-")
        self.digits = len(text.lstrip("+-").lstrip("0"))

    def __repr__(self) -> str:
        sign = "a negative" if self.negative else "an"
        return f"{sign} integer of {self.digits:,} digits"


def shorten(text: str, limit: int = _MAX_SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters (ending in ``...``), so a message never echoes a
    whole hostile input."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def int_or_oversized(literal: str) -> int | OversizedInteger:
    """``int(literal)`` of an ASCII integer literal (sign, digits, maybe surrounding spaces), or
    an OversizedInteger when it has more than MAX_INTEGER_DIGITS significant digits. Used as the
    ``parse_int`` hook of ``json`` and for CSV cells; the caller checks the literal's syntax."""
    if len(literal) <= MAX_INTEGER_DIGITS:
        return int(literal)
    text = literal.strip()
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > MAX_INTEGER_DIGITS:
        return OversizedInteger(text)
    return int(("-" if text.startswith("-") else "") + (digits or "0"))


def show_value(value: object) -> str:
    """Render a bad value as it looks in JSON (``"7"``, ``true``, ``3.5``), shortened.

    Never raises: values that JSON cannot show (nested too deeply, not JSON types) are shown by
    ``repr`` or, failing that, by their type.
    """
    if isinstance(value, float) and not math.isfinite(value):
        text = repr(value)  # nan / inf, as Python and CSV spell them
    elif isinstance(value, OversizedInteger):
        text = repr(value)
    elif isinstance(value, int) and value.bit_length() > _MAX_SHOWN_INT_BITS:
        # str() of a huge int is slow and refused past 4,300 digits; its size says enough
        digits = math.floor(value.bit_length() * math.log10(2))
        text = f"{'a negative' if value < 0 else 'an'} integer of about {digits:,} digits"
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            try:
                text = repr(value)
            except (ValueError, RecursionError):
                text = f"a {type(value).__name__} that cannot be shown"
    if len(text) > _MAX_SHOWN_CHARS:
        text = text[: _MAX_SHOWN_CHARS - 3] + "..."
    return text
