"""The folder ``kvsim validate`` writes: per-row errors as CSV, the tables as Markdown, and the
predicted-vs-measured plots, all or nothing (written into a temporary folder, then renamed).

    errors_linear.csv        every profile row x operator (and "sum", the linear_time_s quantity)
    errors_linear_lomo.csv   the same, each model predicted by a fit without it (--lomo)
    errors_extrapolation.csv compute rows past the fitted token range
    errors_attention.csv     attention rows (decode, prefill)
    errors_allreduce.csv     single-node all-reduce rows
    errors_steps.csv         whole engine steps (engine profiles)
    tables.md                every table of kvsim.costmodel.validate.error_tables
    plots/<kind>_<gpu>.png   predicted against measured, one per kind of rows and GPU
    validation.json          what was validated (the folder's marker: kvsim wrote it)

As every kvsim output folder (kvsim.atomic), it replaces only a folder kvsim wrote, and that
only with ``force``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kvsim.atomic import FolderKind, output_folder
from kvsim.costmodel.validate import Validation, markdown_report
from kvsim.plots import save_png
from kvsim.plots.calibration import plot_predicted_vs_measured

# Which frame, drawn coloured by which column, under which file stem.
_FRAMES = (
    ("linear", "model", "linear"),
    ("linear_lomo", "model", "linear_lomo"),
    ("extrapolation", "model", "extrapolation"),
    ("attention", "kind", "attention"),
    ("allreduce", "num_workers", "allreduce"),
    ("steps", "kind", "steps"),
)
_TITLES = {
    "linear": "non-attention time per layer (linear_time_s / layers)",
    "linear_lomo": "non-attention time, each model left out of the fit",
    "extrapolation": "non-attention time past the fitted token range",
    "attention": "attention per layer",
    "allreduce": "all-reduce",
    "steps": "whole engine steps",
}


VALIDATION_FOLDER = FolderKind(
    what="validation folder",
    marker_file="validation.json",
    marker_key="kvsim_validate",
    entries=frozenset(
        {"validation.json", "tables.md"}
        | {f"errors_{stem}.csv" for _, _, stem in _FRAMES}
        | {"plots"}
    ),
)


def write_validation(
    validations: Sequence[Validation],
    tables: Sequence[tuple[str, pd.DataFrame]],
    out_dir: Path,
    *,
    what: dict[str, object],
    force: bool = False,
) -> list[Path]:
    """Write ``out_dir`` (all or nothing; ``what``: the command's inputs, kept in
    validation.json); return its files."""
    with output_folder(out_dir, VALIDATION_FOLDER, force=force) as tmp:
        marker = {"kvsim_validate": 1, **what}
        (tmp / "validation.json").write_text(json.dumps(marker, indent=2) + "\n", "utf-8")
        names: list[str] = ["validation.json"]
        for attribute, color_by, stem in _FRAMES:
            frames = [getattr(v, attribute) for v in validations if len(getattr(v, attribute))]
            if not frames:
                continue
            frame = pd.concat(frames, ignore_index=True)
            frame.to_csv(tmp / f"errors_{stem}.csv", index=False)
            names.append(f"errors_{stem}.csv")
            for gpu, rows in frame.groupby("gpu", sort=True):
                if attribute.startswith("linear") or attribute == "extrapolation":
                    rows = rows[rows["op"] == "sum"]
                title = f"{gpu}: {_TITLES[attribute]}"
                fig = plot_predicted_vs_measured(rows, color_by=color_by, title=title)
                (tmp / "plots").mkdir(exist_ok=True)
                save_png(fig, tmp / "plots" / f"{stem}_{gpu}.png")
                names.append(f"plots/{stem}_{gpu}.png")
        (tmp / "tables.md").write_text(markdown_report(tables), encoding="utf-8")
        names.append("tables.md")
    return [out_dir / name for name in names]
