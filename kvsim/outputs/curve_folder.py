"""What ``kvsim cache-curve --out DIR`` leaves on disk: curve.csv and curve.png (with
``--tiers``: tiers.csv and tiers.png, kvsim.outputs.tier_folder; the same folder kind).

Both are written into a temporary folder renamed into place, so nothing half-written is left,
with kvsim's manifest. An existing DIR is replaced only with ``--force`` and only when its
manifest proves it is a cache-curve folder kvsim wrote, holding nothing else (kvsim.atomic):
nothing of the user's is ever deleted or overwritten.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvsim.analysis.cache_curve import CURVE_COLUMNS, CacheCurve
from kvsim.atomic import FolderKind, check_target, output_folder

CURVE_CSV = "curve.csv"
CURVE_PNG = "curve.png"
TIERS_CSV = "tiers.csv"  # kvsim cache-curve --tiers (kvsim.outputs.tier_folder)
TIERS_PNG = "tiers.png"
CURVE_FOLDER = FolderKind(
    what="cache-curve folder",
    marker_file=CURVE_CSV,
    marker_key="",
    entries=frozenset({CURVE_CSV, CURVE_PNG, TIERS_CSV, TIERS_PNG}),
)


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


def check_out_folder(path: Path, *, force: bool = False) -> None:
    """Raise ``kvsim.atomic.OutputError`` unless ``path`` is absent, or a cache-curve folder
    kvsim wrote and ``force`` is given."""
    check_target(Path(path), CURVE_FOLDER, force=force)


def write_curve_folder(
    curve: CacheCurve,
    out: Path,
    *,
    pool_tokens: float | None = None,
    pool_label: str = "KV pool",
    title: str | None = None,
    force: bool = False,
) -> Path:
    """Write ``out``/curve.csv and ``out``/curve.png (the pool's capacity marked) atomically.

    Raises:
        kvsim.atomic.OutputError: ``out`` exists and may not be replaced (see check_out_folder).
    """
    from kvsim.plots._common import png_bytes
    from kvsim.plots.cache_curve import plot_cache_curve

    out = Path(out)
    check_out_folder(out, force=force)
    extra = {} if title is None else {"title": title}
    fig = plot_cache_curve(curve.frame(), pool_tokens=pool_tokens, pool_label=pool_label, **extra)
    try:
        image = png_bytes(fig)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    with output_folder(out, CURVE_FOLDER, force=force) as tmp:
        (tmp / CURVE_CSV).write_bytes(curve_csv(curve.rows))
        (tmp / CURVE_PNG).write_bytes(image)
    return out
