"""Helpers shared by the importers: the result type, CSV row reading, lenient integers."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.errors import OversizedInteger, TraceFormatError, int_or_oversized, show_value
from workloads.formats.textio import iter_lines
from workloads.limits import MAX_TOKENS
from workloads.request import Request, Trace

# ASCII digits only: int() and float() would also take "1_5" and full-width digits.
_INTEGRAL = re.compile(r"([+-]?[0-9]+)(?:\.0*)?")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


_SHOWN_COLUMNS = 10  # of a header that lacks a column, in the error


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    """An imported trace and what was left out.

    Attributes:
        trace: the converted trace (arrival times start at 0).
        num_rows: data rows read from the source file.
        dropped: rows left out, by reason (e.g. ``{"0 generated tokens": 3}``).
    """

    trace: Trace
    num_rows: int
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def num_dropped(self) -> int:
        """Rows left out, all reasons together."""
        return sum(self.dropped.values())


def parse_count(text: object, column: str) -> int:
    """A token count from 0 to MAX_TOKENS from a cell or JSON value; integral floats like
    ``74.0`` are accepted. Digits are ASCII only (``1_5`` and full-width digits are refused)."""
    value: object = text
    if type(text) is float and text.is_integer():
        value = int(text)
    elif type(text) is str and (match := _INTEGRAL.fullmatch(text.strip())):
        value = int_or_oversized(match.group(1))
    shown = show_value(value)
    if isinstance(value, OversizedInteger):
        value = -1 if value.negative else MAX_TOKENS + 1  # out of range either way
    if type(value) is not int:
        raise TraceFormatError(
            f"{column} must be a whole number of tokens, got {show_value(text)}", field=column
        )
    if value < 0:
        raise TraceFormatError(f"{column} must be >= 0, got {shown}", field=column)
    if value > MAX_TOKENS:
        raise TraceFormatError(
            f"{column} must be at most {MAX_TOKENS} tokens (2^30), got {shown}", field=column
        )
    return value


def parse_seconds(text: str, column: str) -> float:
    """A finite number of seconds from a CSV cell (ASCII decimal or exponent notation)."""
    value = float(text) if _DECIMAL.fullmatch(text.strip()) else math.nan
    if not math.isfinite(value):
        raise TraceFormatError(
            f"{column} must be a finite number of seconds, got {show_value(text)}", field=column
        )
    return value


def iter_csv_rows(path: str | Path, columns: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line, [cell of each named column])`` for each data row; extra columns ignored.

    Raises TraceFormatError for an empty file, a missing column or a short row.
    """
    lines = iter_lines(path)
    reader = csv.reader((text for _, text in lines), strict=True)
    try:
        header = [name.strip() for name in next(reader, [])]
        if not header:
            raise TraceFormatError("file is empty")
        missing = [name for name in columns if name not in header]
        if missing:
            shown = ", ".join(show_value(name) for name in header[:_SHOWN_COLUMNS])
            more = f", ... ({len(header)} in all)" if len(header) > _SHOWN_COLUMNS else ""
            raise TraceFormatError(
                f"missing column {missing[0]} (columns are: {shown}{more})", field=missing[0]
            )
        positions = [header.index(name) for name in columns]
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise TraceFormatError(f"expected {len(header)} columns, got {len(row)}")
            yield reader.line_num, [row[i] for i in positions]
    except csv.Error as err:
        raise TraceFormatError(str(err), path=path, line=reader.line_num) from None
    except TraceFormatError as err:
        if err.path is not None:
            raise
        raise err.located(path, line=max(reader.line_num, 1)) from None


def located(err: TraceFormatError, path: str | Path, line: int) -> TraceFormatError:
    """``err`` with file and line, unless it already has them."""
    return err if err.path is not None else err.located(path, line=line)


def located_request(path: str | Path, line: int, **fields: Any) -> Request:
    """``Request(**fields)``, its TraceFormatError (e.g. an arrival past MAX_TIME_S after the
    shift to 0) naming the source file and line."""
    try:
        return Request(**fields)
    except TraceFormatError as err:
        raise err.located(path, line=line) from None
