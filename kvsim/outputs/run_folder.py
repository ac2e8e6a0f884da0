"""A run folder: config.json, summary.json, requests/steps/events.parquet, plots/.

Written into a temporary folder and swapped into place (kvsim.atomic.output_folder), so a
crash or a bad option never leaves a half-written run behind, and only a folder kvsim wrote is
ever replaced: config.json's ``kvsim_run`` field marks a run folder. Reading it back gives the
same tables.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from kvsim.atomic import FolderKind, output_folder
from kvsim.config import RunConfig
from kvsim.errors import KvsimError
from kvsim.runner import RunResult

TABLES = ("requests", "steps", "events")
# Above this many event rows (blocks included) a run's pictures skip the occupancy map and
# Gantt chart rather than read the whole stream back; `kvsim plot --from --to` draws a window.
MAX_PLOTTED_EVENT_ROWS = 5_000_000
FORMAT_VERSION = 1
# What kvsim writes in a run folder (kvsim run, kvsim plot / report / export-trace defaults).
RUN_FOLDER = FolderKind(
    what="run folder",
    marker_file="config.json",
    marker_key="kvsim_run",
    entries=frozenset(
        {"config.json", "summary.json", *(f"{t}.parquet" for t in TABLES), "plots",
         "report.html", "run.perfetto.json"}
    ),
)  # fmt: skip


class RunFolderError(KvsimError):
    """A run folder is missing a file or holds one that cannot be read."""


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n").encode()


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    return value


def write_run(result: RunResult, out: Path, *, plots: bool = True, force: bool = False) -> Path:
    """Write ``result`` to the folder ``out``, atomically. ``out`` must not exist, or be a run
    folder kvsim wrote, replaced only with ``force`` (else ``kvsim.atomic.OutputError``)."""
    with output_folder(Path(out), RUN_FOLDER, force=force) as tmp:
        write_run_files(result, tmp, plots=plots)
    return Path(out)


def write_run_files(result: RunResult, folder: Path, *, plots: bool = True) -> None:
    """Write the run folder's files into the empty folder ``folder``. Events streamed to
    ``folder/events.parquet`` stay there; streamed elsewhere, they are moved in."""
    tmp = Path(folder)
    config = {
        "kvsim_run": FORMAT_VERSION,
        "options": result.config.to_dict(),
        "resolved": result.resolved,
    }
    (tmp / "config.json").write_bytes(_json_bytes(config))
    (tmp / "summary.json").write_bytes(_json_bytes(_nan_to_none(result.summary)))
    for name in ("requests", "steps"):
        frame: pd.DataFrame = getattr(result, name)
        frame.to_parquet(tmp / f"{name}.parquet", index=False, compression="zstd")
    events_file = tmp / "events.parquet"
    if result.events is not None:
        result.events.to_parquet(events_file, index=False, compression="zstd")
    elif result.events_path is not None and Path(result.events_path) != events_file:
        shutil.move(result.events_path, events_file)
    # else: streamed into the folder already, or run(keep_events=False) kept no events.
    if plots:
        _write_pictures(result, tmp)


def _write_pictures(result: RunResult, folder: Path) -> None:
    """plots/*.png and report.html. The occupancy map and Gantt chart need the whole event
    stream; a streamed run reads it back unless it is too long to plot in reasonable time."""
    from kvsim.outputs.report import build_report
    from kvsim.plots import PICTURES, write_run_plots

    events = result.events
    if events is None and (folder / "events.parquet").exists():
        rows = pq.ParquetFile(folder / "events.parquet").metadata.num_rows
        events = (
            pd.read_parquet(folder / "events.parquet") if rows <= MAX_PLOTTED_EVENT_ROWS else None
        )
    if events is None:
        events = result.marks
    paths = write_run_plots(result.steps, result.requests, result.summary, folder / "plots", events)
    by_file = {file: name for name, file in PICTURES.items()}
    pngs = {by_file[p.name]: p.read_bytes() for p in paths if p.name in by_file}
    names = [name for name in PICTURES if name in pngs]
    tables = _Tables(result.summary, result.requests, result.steps, events)
    title = f"kvsim run: {result.resolved.get('trace_name', '')}"
    html = build_report(tables, title=title, names=names, pngs=pngs)
    (folder / "report.html").write_text(html, encoding="utf-8")


@dataclass(slots=True)
class _Tables:
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame | None


@dataclass(slots=True)
class RunFolder:
    """A run folder read back from disk."""

    path: Path
    config: RunConfig
    resolved: dict[str, Any]
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame


def read_run(path: Path) -> RunFolder:
    """Read a run folder written by ``write_run``."""
    path = Path(path)
    if not path.is_dir():
        raise RunFolderError(f"{path}: not a run folder (no such directory)")
    missing = [n for n in ("config.json", "summary.json") if not (path / n).is_file()]
    missing += [f"{t}.parquet" for t in TABLES if not (path / f"{t}.parquet").is_file()]
    if missing:
        raise RunFolderError(f"{path}: not a run folder (missing {', '.join(missing)})")
    config_path = path / "config.json"
    config = RunConfig.load(config_path)
    resolved = json.loads(config_path.read_text(encoding="utf-8")).get("resolved", {})
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    tables = {t: pd.read_parquet(path / f"{t}.parquet") for t in TABLES}
    return RunFolder(path, config, resolved, summary, **tables)
