"""Cell checks for profile CSV files: every bad input is a ProfileError of one line naming the
file, the line and the column (line 1 is the header; no quoted newlines in these files)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from kvsim.costmodel.specio import CostModelError

_MAX_INT = 2**53  # counts past this are not exact in the float the CSV cell parses to


class ProfileError(CostModelError):
    """A profile file that is missing, malformed, or holds a value the fitter cannot use."""


def read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProfileError(f"{path}: not a readable CSV file ({first})") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None


def require_columns(frame: pd.DataFrame, columns: tuple[str, ...], path: Path) -> None:
    for column in columns:
        if column not in frame.columns:
            raise ProfileError(f"{path}: missing column {column!r}")
    if frame.empty:
        raise ProfileError(f"{path}: no data rows")


def bad_cells(path: Path, frame: pd.DataFrame, column: str, mask: pd.Series, expected: str) -> None:
    if mask.any():
        row = int(mask.to_numpy().nonzero()[0][0])
        raw = frame[column].iloc[row]
        # Line 1 is the header; data row 0 is line 2 (no quoted newlines in these files).
        raise ProfileError(
            f"{path}: line {row + 2}, column {column!r}: expected {expected}, got {raw!r}"
        )


def int_column(frame: pd.DataFrame, column: str, path: Path, *, minimum: int) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce")
    integral = (
        values.notna() & (values == values.round()) & (values >= minimum) & (values <= _MAX_INT)
    )
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    bad_cells(path, frame, column, ~integral, what)
    return values.astype("int64")


def time_column(
    frame: pd.DataFrame, column: str, path: Path, rows: pd.Series | None = None
) -> pd.Series:
    """Milliseconds in ``column`` (on ``rows`` only, if given) as seconds; finite and > 0."""
    values = pd.to_numeric(frame[column], errors="coerce")
    ok = values.notna() & values.map(lambda v: math.isfinite(v) if v == v else False) & (values > 0)
    if rows is not None:
        ok = ok | ~rows
    bad_cells(path, frame, column, ~ok, "a positive time in ms")
    return values * 1e-3


def bool_column(frame: pd.DataFrame, column: str, path: Path) -> pd.Series:
    lowered = frame[column].str.strip().str.lower()
    truth = {"true": True, "1": True, "false": False, "0": False}
    bad_cells(path, frame, column, ~lowered.isin(list(truth)), "True or False")
    return lowered.map(truth).astype(bool)


def constant_column(frame: pd.DataFrame, column: str, path: Path, values: pd.Series) -> pd.Series:
    """``values`` (parsed from ``column``), which must be one model's: equal on every row."""
    bad_cells(
        path,
        frame,
        column,
        values != values.iloc[0],
        f"the same value on every row ({frame[column].iloc[0]!r})",
    )
    return values


def dtype_bytes_column(frame: pd.DataFrame, path: Path) -> pd.Series:
    # Vidur profiles are fp16 and have no such column; kvsim's engine-mode profiles write it.
    if "dtype_bytes" not in frame.columns:
        return pd.Series(2, index=frame.index, dtype="int64")
    values = int_column(frame, "dtype_bytes", path, minimum=1)
    bad_cells(path, frame, "dtype_bytes", ~values.isin([1, 2, 4]), "1, 2 or 4")
    return values


def head_dim_column(
    frame: pd.DataFrame, path: Path, heads: pd.Series, hidden: pd.Series
) -> pd.Series:
    if "head_dim" in frame.columns:
        return int_column(frame, "head_dim", path, minimum=1)
    bad_cells(
        path,
        frame,
        "n_embd",
        hidden % heads != 0,
        "a multiple of the head count (or a head_dim column)",
    )
    return hidden // heads
