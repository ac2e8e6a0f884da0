"""What ``kvsim cache-curve --out DIR`` leaves on disk: curve.csv and curve.png.

Both are written into a temporary folder renamed into place, so nothing half-written is left.
An existing DIR is replaced only when it is empty or is itself a cache-curve folder (nothing in
it but curve.csv, with curve.csv's header, and curve.png): nothing else of the user's is ever
deleted or overwritten.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvsim.analysis.cache_curve import CURVE_COLUMNS, CacheCurve
from kvsim.atomic import atomic_dir
from kvsim.errors import KvsimError

CURVE_CSV = "curve.csv"
CURVE_PNG = "curve.png"
_OURS = {CURVE_CSV, CURVE_PNG}


class CurveFolderError(KvsimError):
    """The --out folder exists and is not one kvsim cache-curve may replace."""


def _number(value: object) -> str:
    """A capacity as written: ``inf``, an integer without a decimal point (up to 2**53, where
    floats stop holding every integer), else Python's shortest repr (``1e+30``)."""
    number = float(value)  # type: ignore[arg-type]
    if math.isinf(number):
        return "inf"
    return str(int(number)) if number.is_integer() and number < 2**53 else repr(number)


def curve_csv(rows: Sequence[Mapping[str, object]]) -> bytes:
    """curve.csv's bytes for the rows of a CacheCurve (columns CURVE_COLUMNS, docs/formats.md)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CURVE_COLUMNS)
    for row in rows:
        writer.writerow(
            [
                _number(row["capacity_tokens"]),
                _number(row["capacity_blocks"]),
                row["policy"],
                repr(float(row["hit_rate"])),  # type: ignore[arg-type]
                int(row["hit_tokens"]),  # type: ignore[call-overload]
                int(row["query_tokens"]),  # type: ignore[call-overload]
            ]
        )
    return buffer.getvalue().encode()


def is_curve_folder(path: Path) -> bool:
    """Whether ``path`` holds only what kvsim cache-curve writes, curve.csv included."""
    names = {p.name for p in path.iterdir()}
    if CURVE_CSV not in names or not names <= _OURS or not (path / CURVE_CSV).is_file():
        return False
    with open(path / CURVE_CSV, encoding="utf-8", errors="replace") as f:
        return f.readline().rstrip("\n") == ",".join(CURVE_COLUMNS)


def check_out_folder(path: Path) -> None:
    """Raise CurveFolderError unless ``path`` is absent, an empty folder or a cache-curve
    folder (which writing replaces)."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise CurveFolderError(f"{path}: exists and is not a folder; choose another --out")
    if any(path.iterdir()) and not is_curve_folder(path):
        raise CurveFolderError(
            f"{path}: folder is not empty and is not a cache-curve folder (only {CURVE_CSV} "
            f"and {CURVE_PNG}); choose another --out"
        )


def write_curve_folder(
    curve: CacheCurve,
    out: Path,
    *,
    pool_tokens: float | None = None,
    pool_label: str = "KV pool",
    title: str | None = None,
) -> Path:
    """Write ``out``/curve.csv and ``out``/curve.png (the pool's capacity marked) atomically.

    Raises:
        CurveFolderError: ``out`` exists and may not be replaced (see check_out_folder).
    """
    from kvsim.plots._common import png_bytes
    from kvsim.plots.cache_curve import plot_cache_curve

    out = Path(out)
    check_out_folder(out)
    extra = {} if title is None else {"title": title}
    fig = plot_cache_curve(curve.frame(), pool_tokens=pool_tokens, pool_label=pool_label, **extra)
    try:
        image = png_bytes(fig)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    with atomic_dir(out, check_out_folder) as tmp:
        (tmp / CURVE_CSV).write_bytes(curve_csv(curve.rows))
        (tmp / CURVE_PNG).write_bytes(image)
    return out
