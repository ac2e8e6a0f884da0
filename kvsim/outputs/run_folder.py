"""A run folder: config.json, summary.json, requests/steps/events.parquet, plots/.

Written into a temporary folder and swapped into place (kvsim.atomic.output_folder), so a
crash or a bad option never leaves a half-written run behind, and only a folder kvsim wrote is
ever replaced: config.json's ``kvsim_run`` field marks a run folder. Reading it back gives the
same tables.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.analysis.events_encoding import parquet_options
from kvsim.analysis.events_io import MAX_PLOTTED_EVENT_ROWS
from kvsim.atomic import FolderKind, output_folder
from kvsim.config import RunConfig
from kvsim.errors import KvsimError
from kvsim.runner import RunResult

if TYPE_CHECKING:
    import pandas as pd

TABLES = ("requests", "steps", "events")
FORMAT_VERSION = 1
# What kvsim writes in a run folder (kvsim run, kvsim plot / report / export-trace defaults).
RUN_FOLDER = FolderKind(
    what="run folder",
    marker_file="config.json",
    marker_key="kvsim_run",
    entries=frozenset(
        {"config.json", "summary.json", *(f"{t}.parquet" for t in TABLES), "routing.parquet",
         "plots", "report.html", "run.perfetto.json"}
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


def write_run_files(
    result: RunResult, folder: Path, *, plots: bool = True, picture_workers: int = 1
) -> None:
    """Write the run folder's files into the empty folder ``folder``. Events streamed to
    ``folder/events.parquet`` stay there; streamed elsewhere, they are moved in. The plots
    are drawn ``picture_workers`` at a time (``kvsim.plots.write_pictures``' workers)."""
    tmp = Path(folder)
    config = {
        "kvsim_run": FORMAT_VERSION,
        "options": result.config.to_dict(),
        "resolved": result.resolved,
    }
    (tmp / "config.json").write_bytes(_json_bytes(config))
    (tmp / "summary.json").write_bytes(_json_bytes(_nan_to_none(result.summary)))
    tables = {"requests": result.requests_table, "steps": result.steps_table}
    for name, table in {**tables, **result.extra_tables}.items():
        pq.write_table(table.to_arrow(), tmp / f"{name}.parquet", compression="zstd")
    # Written while the events writer drained its last chunks (run(finish_events_later=True)):
    # the whole Azure conversation trace's `kvsim run` has ~0.1 s of them left here.
    result.finish_events()
    events_file = tmp / "events.parquet"
    if result.events is not None:
        result.events.to_parquet(
            events_file, index=False, **parquet_options(list(result.events.columns))
        )
    elif result.events_path is not None and Path(result.events_path) != events_file:
        shutil.move(result.events_path, events_file)
    # else: streamed into the folder already, or run(keep_events=False) kept no events.
    if plots:
        _write_pictures(result, tmp, picture_workers)


def _write_pictures(result: RunResult, folder: Path, workers: int = 1) -> None:
    """plots/*.png and report.html. The occupancy map and Gantt chart need the whole event
    stream; a streamed run reads it back unless it is too long to plot in reasonable time."""
    import pandas as pd

    from kvsim.outputs.report import build_report
    from kvsim.plots import read_pngs, write_run_plots

    if "replica" in result.steps_table:  # a fleet: its own pictures (docs/fleet.md)
        from kvsim.plots.fleet import write_fleet_plots

        paths = write_fleet_plots(result.steps, result.requests, result.summary, folder / "plots")
        pngs = {p.stem.replace("_", "-"): p.read_bytes() for p in paths}
        tables = _Tables(
            result.summary, result.requests, result.steps, result.marks, result.config,
            result.resolved,
        )  # fmt: skip
        title = f"kvsim fleet: {result.resolved.get('trace_name', '')}"
        html = build_report(tables, title=title, names=list(pngs), pngs=pngs)
        (folder / "report.html").write_text(html, encoding="utf-8")
        return
    events = result.events
    large = None  # an events file the occupancy map and Gantt chart sample (large_runs.py)
    if events is None and (folder / "events.parquet").exists():
        rows = pq.ParquetFile(folder / "events.parquet").metadata.num_rows
        if rows <= MAX_PLOTTED_EVENT_ROWS:
            events = pd.read_parquet(folder / "events.parquet")
        else:
            large = folder / "events.parquet"
    if events is None:
        events = result.marks
    paths = write_run_plots(
        result.steps, result.requests, result.summary, folder / "plots", events,
        workers=workers, events_path=large, paged=result.config.allocator == "paged",
    )  # fmt: skip
    pngs = read_pngs(paths)
    names = list(pngs)
    tables = _Tables(
        result.summary, result.requests, result.steps, events, result.config, result.resolved
    )
    title = f"kvsim run: {result.resolved.get('trace_name', '')}"
    html = build_report(tables, title=title, names=names, pngs=pngs)
    (folder / "report.html").write_text(html, encoding="utf-8")


@dataclass(slots=True)
class _Tables:
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame | None
    config: RunConfig  # for the report's Options section
    resolved: dict[str, Any]


@dataclass(slots=True)
class RunFolder:
    """A run folder read back from disk (``events`` is None where it has no events.parquet:
    a sweep point run without ``--events``)."""

    path: Path
    config: RunConfig
    resolved: dict[str, Any]
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame | None
    # events.parquet where ``events`` holds only its marks (read_run(whole_events=False) of a
    # file too long to read whole): the occupancy map and Gantt chart read it themselves.
    events_path: Path | None = None


# The rows kept of an events file too long to read whole: the free-blocks plot's marks.
MARK_KINDS = ("PREEMPT", "REJECT", "EVICT")


# The columns every reader of a run folder relies on, by kind: "int", "number" or "text".
COLUMNS: dict[str, dict[str, str]] = {
    "requests": {
        "request_id": "text", "seq_id": "int", "arrival_time_s": "number",
        "prompt_tokens": "int", "output_tokens": "int", "generated_tokens": "number",
        "status": "text", "admit_time_s": "number", "first_token_time_s": "number",
        "finish_time_s": "number", "num_preemptions": "int", "queueing_delay_s": "number",
        "ttft_s": "number", "tpot_s": "number", "e2e_latency_s": "number",
    },
    "steps": {
        "step": "int", "time_s": "number", "duration_s": "number", "kind": "text",
        "num_seqs": "int", "num_running": "int", "num_batched_tokens": "int",
        "free_blocks": "int", "allocated_slots": "int", "filled_slots": "int",
    },
    "events": {
        "time_s": "number", "step": "int", "kind": "text", "seq_id": "int", "block_id": "int",
        "free_blocks": "int", "num_tokens": "int",
    },
}  # fmt: skip
# summary.json fields the pictures and reports read: numbers (None allowed where marked).
SUMMARY_NUMBERS = (
    "num_requests", "num_finished", "num_rejected", "num_aborted", "num_unfinished",
    "num_preemptions", "num_steps", "throughput_requests_per_s",
    "throughput_output_tokens_per_s", "kv_usage_mean", "kv_usage_peak",
    "mean_running_seqs", "mean_batch_size", "max_batch_size",
)  # fmt: skip
SUMMARY_DISTRIBUTIONS = ("queueing_delay_s", "ttft_s", "tpot_s", "e2e_latency_s")


def _arrow_kind(kind: pa.DataType) -> str:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_integer(kind):
        return "int"
    if pa.types.is_floating(kind):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    return str(kind)


def _check_columns(file: Path, table: str) -> None:
    try:
        schema = pq.read_schema(file)
    except (OSError, pa.ArrowException) as exc:
        raise RunFolderError(f"{file}: not a readable Parquet file: {exc}") from None
    for column, want in COLUMNS[table].items():
        if column not in schema.names:
            raise RunFolderError(f"{file}: column {column!r} is missing")
        got = _arrow_kind(schema.field(column).type)
        if not (got == want or (want == "number" and got == "int")):
            raise RunFolderError(f"{file}: column {column!r} holds {got}, not {want} values")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_summary(file: Path, summary: Any) -> None:
    if not isinstance(summary, dict):
        raise RunFolderError(f"{file}: expected a JSON object, got {type(summary).__name__}")
    for name in ("block_size", "num_blocks"):
        value = summary.get(name)
        if type(value) is not int or value < 1:
            raise RunFolderError(f"{file}: {name}: expected a positive integer, got {value!r}")
    duration = summary.get("sim_duration_s")
    if not (isinstance(duration, (int, float)) and 0 <= duration < math.inf) or duration is True:
        raise RunFolderError(f"{file}: sim_duration_s: expected a number >= 0, got {duration!r}")
    for name in SUMMARY_NUMBERS:
        if name in summary and not _is_number(summary[name]) and summary[name] is not None:
            raise RunFolderError(f"{file}: {name}: expected a number, got {summary[name]!r}")
    for name in SUMMARY_DISTRIBUTIONS:
        value = summary.get(name, {})
        if not isinstance(value, dict) or not all(
            v is None or _is_number(v) for v in value.values()
        ):
            raise RunFolderError(f"{file}: {name}: expected an object of numbers, got {value!r}")


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise RunFolderError(f"{file}: not readable JSON: {exc}") from None


def read_run(path: Path, *, whole_events: bool = True) -> RunFolder:
    """Read a run folder written by ``write_run``; ``RunFolderError`` (one line naming the
    file and field) if a file is missing, unreadable, or lacks what the readers need. With
    ``whole_events=False`` (the pictures) an events.parquet of more than
    ``MAX_PLOTTED_EVENT_ROWS`` rows is not read whole: ``events`` holds its ``MARK_KINDS``
    rows and ``events_path`` names it (kvsim/plots/large_runs.py reads what it needs)."""
    path = Path(path)
    if not path.is_dir():
        raise RunFolderError(f"{path}: not a run folder (no such directory)")
    missing = [n for n in ("config.json", "summary.json") if not (path / n).is_file()]
    missing += [f"{t}.parquet" for t in TABLES[:2] if not (path / f"{t}.parquet").is_file()]
    if missing:
        raise RunFolderError(f"{path}: not a run folder (missing {', '.join(missing)})")
    config_path = path / "config.json"
    config = RunConfig.load(config_path)
    resolved = _read_json(config_path).get("resolved", {})
    if not isinstance(resolved, dict):
        raise RunFolderError(f"{config_path}: resolved: expected an object")
    summary = _read_json(path / "summary.json")
    _check_summary(path / "summary.json", summary)
    present = [t for t in TABLES if (path / f"{t}.parquet").is_file()]
    for table in present:
        _check_columns(path / f"{table}.parquet", table)
    import pandas as pd

    tables: dict[str, pd.DataFrame | None] = {t: None for t in TABLES}
    events_path = None
    for table in present:
        file = path / f"{table}.parquet"
        try:
            if table == "events" and not whole_events and _rows(file) > MAX_PLOTTED_EVENT_ROWS:
                tables[table] = pd.read_parquet(file, filters=[("kind", "in", list(MARK_KINDS))])
                events_path = file
            else:
                tables[table] = pd.read_parquet(file)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise RunFolderError(f"{file}: cannot read: {exc}") from None
    return RunFolder(path, config, resolved, summary, **tables, events_path=events_path)


def _rows(file: Path) -> int:
    return int(pq.ParquetFile(file).metadata.num_rows)
