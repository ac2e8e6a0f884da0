"""What ``kvsim cache-curve TRACE --tiers ... --out DIR`` leaves on disk: tiers.csv and
tiers.png, written into a temporary folder renamed into place with kvsim's manifest, as
curve.csv (kvsim.outputs.curve_folder: the same "cache-curve folder" kind, so ``--force``
replaces either with the other, and never a folder kvsim did not write).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvsim.analysis.tier_curve import TIER_COLUMNS
from kvsim.atomic import output_folder
from kvsim.outputs.curve_folder import CURVE_FOLDER, TIERS_CSV, TIERS_PNG, _number
from kvsim.outputs.curve_folder import check_out_folder as check_out_folder

Mark = tuple[float, str]  # a capacity (blocks) and its label
_CAPACITIES = TIER_COLUMNS[:6]


def _cell(column: str, value: object) -> str:
    number = float(value)  # type: ignore[arg-type]
    if column in _CAPACITIES:
        return "" if math.isnan(number) else _number(number)
    if column.endswith("_rate"):
        return repr(number)
    return str(int(number))


def tiers_csv(rows: Sequence[Mapping[str, object]]) -> bytes:
    """tiers.csv's bytes (columns TIER_COLUMNS, docs/formats.md)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TIER_COLUMNS)
    for row in rows:
        writer.writerow([_cell(column, row[column]) for column in TIER_COLUMNS])
    return buffer.getvalue().encode()


def write_tier_folder(
    rows: Sequence[Mapping[str, object]],
    out: Path,
    *,
    gpu_labels: Sequence[str] | None = None,
    cpu_labels: Sequence[str] | None = None,
    gpu_mark: Mark | None = None,
    cpu_mark: Mark | None = None,
    title: str | None = None,
    force: bool = False,
) -> Path:
    """Write ``out``/tiers.csv and ``out``/tiers.png (the marks drawn) atomically.

    Raises:
        kvsim.atomic.OutputError: ``out`` exists and may not be replaced.
    """
    import pandas as pd

    from kvsim.plots._common import png_bytes
    from kvsim.plots.tier_curve import plot_tier_curve

    out = Path(out)
    check_out_folder(out, force=force)
    extra = {} if title is None else {"title": title}
    frame = pd.DataFrame(list(rows), columns=list(TIER_COLUMNS))
    fig = plot_tier_curve(frame, gpu_labels=gpu_labels, cpu_labels=cpu_labels,
                          gpu_mark=gpu_mark, cpu_mark=cpu_mark, **extra)  # fmt: skip
    try:
        image = png_bytes(fig)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    with output_folder(out, CURVE_FOLDER, force=force) as tmp:
        (tmp / TIERS_CSV).write_bytes(tiers_csv(rows))
        (tmp / TIERS_PNG).write_bytes(image)
    return out
