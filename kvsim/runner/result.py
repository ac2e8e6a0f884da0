"""What a run leaves in memory: ``RunResult``, everything its run folder holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsim.analysis.table import Table
from kvsim.config import RunConfig

if TYPE_CHECKING:
    import pandas as pd


@dataclass(slots=True)
class RunResult:
    """Everything a run folder holds, in memory. The tables are numpy columns
    (``kvsim.analysis.table.Table``); ``requests``, ``steps`` and ``marks`` give them as
    DataFrames, built (and pandas imported) on first use."""

    config: RunConfig
    resolved: dict[str, Any]  # what the options resolved to (num_blocks, model, gpu, ...)
    summary: dict[str, Any]
    requests_table: Table
    steps_table: Table
    events: pd.DataFrame | None  # None when the events were streamed to ``events_path``
    events_path: Path | None = None
    marks_table: Table | None = None  # PREEMPT and REJECT events, for the plots
    # More tables of the run folder, by name (a fleet's "routing": routing.parquet, an
    # offloading run's "transfers": transfers.parquet)
    extra_tables: dict[str, Table] = field(default_factory=dict)
    _frames: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)
    # run(finish_events_later=True): closes the events writer (see finish_events)
    _finish_events: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def finish_events(self) -> None:
        """Wait for ``events_path`` to be complete (raises the writer's error, if any), where
        ``run(finish_events_later=True)`` left it being written; idempotent."""
        finish, self._finish_events = self._finish_events, None
        if finish is not None:
            finish()

    def _frame(self, name: str, table: Table) -> pd.DataFrame:
        if name not in self._frames:
            self._frames[name] = table.to_pandas()
        return self._frames[name]

    @property
    def requests(self) -> pd.DataFrame:
        """requests.parquet's rows: one per submitted request."""
        return self._frame("requests", self.requests_table)

    @property
    def steps(self) -> pd.DataFrame:
        """steps.parquet's rows: one per executed step."""
        return self._frame("steps", self.steps_table)

    @property
    def marks(self) -> pd.DataFrame | None:
        """PREEMPT and REJECT events (time_s, kind, seq_id, free_blocks), for the plots."""
        return None if self.marks_table is None else self._frame("marks", self.marks_table)
