"""The named pictures of one run, drawn from its tables: what ``kvsim plot``, ``kvsim run`` and
``kvsim report`` draw. A run is anything with ``summary``, ``requests``, ``steps`` and
``events`` (a ``RunFolder`` read back from disk or a ``RunResult`` in memory)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.plots._common import save_png, window
from kvsim.plots.large_runs import is_large, plot_gantt_of_file, plot_sampled_occupancy
from kvsim.plots.occupancy_map import plot_occupancy
from kvsim.plots.offload import (
    OFFLOAD_PICTURES,
    is_offload,
    plot_offload_tier,
    plot_offload_transfers,
    plot_offload_ttft,
    plot_prompt_sources,
)
from kvsim.plots.prefix_cache import plot_prefix_hit_rate, plot_prompt_tokens
from kvsim.plots.requests import MAX_GANTT_REQUESTS, plot_gantt, plot_latency_cdfs
from kvsim.plots.side_by_side import run_jobs
from kvsim.plots.timeseries import plot_batch_size, plot_free_blocks, plot_kv_breakdown

# Picture name -> file name in a run folder's plots/.
PICTURES = {
    "occupancy": "occupancy.png",
    "free-blocks": "free_blocks.png",
    "kv-breakdown": "kv_breakdown.png",
    "gantt": "gantt.png",
    "latency": "latency_cdfs.png",
    "batch": "batch_size.png",
    "hit-rate": "prefix_hit_rate.png",
    "prompt-tokens": "prompt_tokens.png",
    **OFFLOAD_PICTURES,
}
# Pictures of a v1 run only (requests with prefix_hit_tokens); a classic run draws none.
V1_PICTURES = ("hit-rate", "prompt-tokens")
# Pictures of a KV offloading run only (kvsim/plots/offload.py); a run without offload draws none.
OFFLOAD_PICTURE_NAMES = tuple(OFFLOAD_PICTURES)
# Pictures drawn from the event stream; the others need only the steps and requests tables
# (a run folder without events.parquet, e.g. a sweep point, still gets those).
NEEDS_EVENTS = ("occupancy", "gantt", "offload-transfers")


class RunTables(Protocol):
    """What the pictures read from a run."""

    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame | None  # None: streamed to ``events_path`` (a RunResult)


def gantt_default_seq_ids(requests: pd.DataFrame, n: int = MAX_GANTT_REQUESTS) -> np.ndarray:
    """``n`` consecutive requests worth a look: around the first preempted one, if any,
    else the first ``n``."""
    seq_ids = requests["seq_id"].to_numpy()
    preempted = np.flatnonzero(requests["num_preemptions"].to_numpy() > 0)
    start = max(0, int(preempted[0]) - n // 4) if len(preempted) else 0
    return np.asarray(seq_ids[start : start + n])


def is_v1(run: RunTables) -> bool:
    """Whether ``run`` ran under the v1 scheduler (its requests carry prefix-cache columns)."""
    return "prefix_hit_tokens" in run.requests


def is_offload_run(run: RunTables) -> bool:
    """Whether ``run`` offloaded KV to a CPU tier (its requests carry offload columns)."""
    return is_offload(run.requests)


def default_names(run: RunTables) -> list[str]:
    """The pictures drawn of ``run`` when none are named: those it has the tables for (events,
    a v1 scheduler, an offload tier)."""
    names = [n for n in PICTURES if has_events(run) or n not in NEEDS_EVENTS]
    if not is_v1(run):
        names = [n for n in names if n not in V1_PICTURES]
    if not is_offload_run(run):
        names = [n for n in names if n not in OFFLOAD_PICTURE_NAMES]
    return names


def offload_events(run: RunTables) -> pd.DataFrame:
    """The ``OFFLOAD_*`` rows of ``run``'s events: from memory, or read from its events file
    (only those rows, so a long file is never read whole)."""
    from kvsim.analysis.offload_tables import OFFLOAD_KINDS, has_offload_events

    if run.events is not None and has_offload_events(run.events):
        return run.events
    path = getattr(run, "events_path", None)
    if path is not None:
        return pd.read_parquet(path, filters=[("kind", "in", list(OFFLOAD_KINDS))])
    return run_events(run)


def has_events(run: RunTables) -> bool:
    """Whether ``run`` has its event stream, in memory or in a file."""
    return run.events is not None or getattr(run, "events_path", None) is not None


def run_events(run: RunTables) -> pd.DataFrame:
    """``run.events``, or the events file of a run that streamed them to disk."""
    if run.events is not None:
        return run.events
    path = getattr(run, "events_path", None)
    if path is None:
        raise ValueError("the run has neither events in memory nor an events file")
    return pd.read_parquet(path)


def large_events(run: RunTables) -> Path | None:
    """The events file of ``run`` when it is too long to read back whole for the occupancy
    map and Gantt chart (kvsim/plots/large_runs.py), else None."""
    path = getattr(run, "events_path", None)
    return None if path is None or not is_large(Path(path)) else Path(path)


def _paged(run: RunTables) -> bool:
    """Whether ``run``'s allocator is paged (its own flag, else its config's allocator)."""
    paged = getattr(run, "paged", None)
    if paged is None:
        paged = getattr(getattr(run, "config", None), "allocator", "paged") == "paged"
    return bool(paged)


def draw(
    run: RunTables, name: str, *, t_from: float | None = None, t_to: float | None = None
) -> Figure:
    """The picture ``name`` (a key of ``PICTURES``) of ``run`` over [t_from, t_to] (s)."""
    s = run.summary
    num_blocks, end_s = int(s["num_blocks"]), float(s["sim_duration_s"])
    window_given = t_from is not None or t_to is not None
    large = large_events(run) if name in NEEDS_EVENTS else None
    if name == "occupancy" and large is not None:  # a sample of blocks, said in the title
        return plot_sampled_occupancy(
            large, num_blocks, t_from=t_from, t_to=t_to, end_s=end_s, paged=_paged(run),
        )  # fmt: skip
    if name == "occupancy":
        return plot_occupancy(run_events(run), num_blocks, t_from=t_from, t_to=t_to, end_s=end_s)
    if name == "free-blocks":  # preemptions and rejections marked when the events are there
        events = run_events(run) if has_events(run) else None
        return plot_free_blocks(run.steps, events, num_blocks=num_blocks, t_from=t_from, t_to=t_to)
    if name == "kv-breakdown":
        total_slots = num_blocks * int(s["block_size"])
        return plot_kv_breakdown(run.steps, total_slots, t_from=t_from, t_to=t_to)
    if name == "gantt":
        seq_ids = None if window_given else gantt_default_seq_ids(run.requests)
        if large is not None:  # the drawn requests' own rows: exact
            return plot_gantt_of_file(
                large, run.steps, run.requests, seq_ids, t_from=t_from, t_to=t_to, end_s=end_s
            )
        return plot_gantt(
            run_events(run),
            run.steps,
            requests=run.requests,
            seq_ids=seq_ids,
            t_from=t_from,
            t_to=t_to,
            end_s=end_s,
        )
    if name == "latency":
        return plot_latency_cdfs(window(run.requests, t_from, t_to, "arrival_time_s"))
    if name == "batch":
        return plot_batch_size(run.steps, t_from=t_from, t_to=t_to)
    if name == "hit-rate":
        return plot_prefix_hit_rate(run.requests, t_from=t_from, t_to=t_to)
    if name == "prompt-tokens":
        return plot_prompt_tokens(run.steps, run.requests, t_from=t_from, t_to=t_to)
    if name in OFFLOAD_PICTURES:
        return _draw_offload(run, name, t_from, t_to)
    raise KeyError(f"no picture named {name!r}; pictures: {', '.join(PICTURES)}")


def _draw_offload(run: RunTables, name: str, t_from: float | None, t_to: float | None) -> Figure:
    offload = run.summary.get("offload") or {}
    if name == "offload-tier":
        return plot_offload_tier(run.steps, offload, t_from=t_from, t_to=t_to)
    if name == "offload-sources":
        return plot_prompt_sources(run.requests, offload, t_from=t_from, t_to=t_to)
    if name == "offload-ttft":
        return plot_offload_ttft(run.requests, t_from=t_from, t_to=t_to)
    end_s = float(run.summary["sim_duration_s"])
    return plot_offload_transfers(
        offload_events(run), offload, t_from=t_from, t_to=t_to, end_s=end_s
    )


def write_pictures(
    run: RunTables,
    folder: Path,
    names: list[str] | None = None,
    *,
    t_from: float | None = None,
    t_to: float | None = None,
    workers: int = 1,
) -> list[Path]:
    """Draw ``names`` (default all of ``PICTURES`` that ``run`` has tables for:
    ``default_names``) as PNGs into ``folder``, each written atomically; return their paths. With
    ``workers`` > 1, that many are drawn at a time in forked processes where the platform
    forks (kvsim/plots/side_by_side.py), the same bytes as one after another."""
    if names is None:
        names = default_names(run)

    def job(name: str) -> Callable[[], Path]:
        def draw_and_save() -> Path:
            figure = draw(run, name, t_from=t_from, t_to=t_to)
            return save_png(figure, Path(folder) / PICTURES[name])

        return draw_and_save

    return run_jobs([job(name) for name in names], workers)


def read_pngs(paths: list[Path]) -> dict[str, bytes]:
    """The bytes of the pictures at ``paths`` (``PICTURES`` files), by picture name, in
    ``PICTURES`` order: what a report embeds."""
    by_file = {file: name for name, file in PICTURES.items()}
    drawn = {by_file[p.name]: p for p in paths if p.name in by_file}
    return {name: drawn[name].read_bytes() for name in PICTURES if name in drawn}


def write_run_plots(
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    summary: dict[str, Any],
    folder: Path,
    events: pd.DataFrame | None = None,
    *,
    workers: int = 1,
    events_path: Path | None = None,
    paged: bool = True,
) -> list[Path]:
    """``kvsim run``'s pictures as PNGs in ``folder``: free blocks (marks from ``events``), KV
    breakdown, batch size, latency CDFs; the occupancy map and Gantt chart too when
    ``events`` holds the whole stream (block and admission events), or from ``events_path``
    when that file is too long to read whole (a sample of blocks, the drawn requests' rows:
    kvsim/plots/large_runs.py; ``paged``: the run's allocator is); an offloading run's
    pictures (kvsim/plots/offload.py), its transfers where the events hold them. ``workers``
    as in ``write_pictures``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    events = events if events is not None else pd.DataFrame({"kind": [], "time_s": []})
    tables = _Tables(summary, requests, steps, events, events_path, paged)
    names = ["free-blocks", "kv-breakdown", "batch", "latency"]
    if events["kind"].isin(["ALLOCATE", "ADMIT"]).any() or large_events(tables) is not None:
        names += ["occupancy", "gantt"]
    if is_v1(tables):
        names += list(V1_PICTURES)
    if is_offload_run(tables):  # the transfers from the OFFLOAD_* events, where they were kept
        names += [n for n in OFFLOAD_PICTURE_NAMES if n not in NEEDS_EVENTS]
        if _has_offload_rows(events) or large_events(tables) is not None:
            names.append("offload-transfers")
    paths = write_pictures(tables, folder, names, workers=workers)
    plt.close("all")
    return paths


def _has_offload_rows(events: pd.DataFrame) -> bool:
    from kvsim.analysis.offload_tables import has_offload_events

    return has_offload_events(events)


class _Tables:
    __slots__ = ("events", "events_path", "paged", "requests", "steps", "summary")

    def __init__(
        self,
        summary: dict[str, Any],
        requests: pd.DataFrame,
        steps: pd.DataFrame,
        events: pd.DataFrame,
        events_path: Path | None = None,
        paged: bool = True,
    ) -> None:
        self.summary, self.requests, self.steps, self.events = summary, requests, steps, events
        self.events_path, self.paged = events_path, paged
