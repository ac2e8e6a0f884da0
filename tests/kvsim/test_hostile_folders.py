"""Run folders edited by hand through kvsim plot / report / export-trace / animate: dropped
and retyped columns, broken summaries (the rule every case keeps: hostile_harness.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile_harness import (  # noqa: F401  (one_click_command: an autouse fixture)
    HUGE_INT,
    OSC8,
    QUICK,
    Case,
    check,
    one_click_command,
    run_cases,
)
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.outputs.run_folder import write_run
from kvsim.runner import RunResult, run

# --- run folders edited by hand ----------------------------------------------------------------


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result: RunResult = run(RunConfig(trace="azure_llm_2023_conv_first_2min", until=5.0))
    return write_run(result, tmp_path_factory.mktemp("run") / "run", plots=False)


def _drop_column(table: str, column: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "run" / f"{table}.parquet"
        pq.write_table(pq.read_table(path).drop_columns([column]), path)

    return edit


def _retype_column(table: str, column: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "run" / f"{table}.parquet"
        t = pq.read_table(path)
        i = t.schema.get_field_index(column)
        strings = pa.array(["x"] * len(t), type=pa.string())
        pq.write_table(t.set_column(i, column, strings), path)

    return edit


def _summary(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "run" / "summary.json"
        path.write_text(json.dumps(change(json.loads(path.read_text())), allow_nan=True))

    return edit


def folder_edits() -> dict[str, tuple[Callable[[Path], None], tuple[str, ...]]]:
    from kvsim.outputs.run_folder import COLUMNS

    edits: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {}
    for table, columns in COLUMNS.items():
        for column, kind in columns.items():
            edits[f"drop-{table}-{column}"] = (_drop_column(table, column), (table, column))
            if kind != "text":
                edits[f"retype-{table}-{column}"] = (_retype_column(table, column), (column,))
    for name in ("num_blocks", "block_size", "sim_duration_s", "num_requests", "ttft_s"):
        bad: tuple[Any, ...] = ("x", [], True, {"a": "b"})
        if name in ("num_blocks", "block_size", "sim_duration_s"):
            bad += (-1, float("nan"), None)
        for i, value in enumerate(bad):
            edits[f"summary-{name}-{i}"] = (
                _summary(lambda s, n=name, v=value: {**s, n: v}),
                ("summary.json", name),
            )
    edits["summary-list"] = (_summary(lambda s: [s]), ("summary.json",))
    edits["summary-not-json"] = (lambda f: (f / "run" / "summary.json").write_text("{"), ())
    edits["config-broken"] = (lambda f: (f / "run" / "config.json").write_text("[]"), ())
    edits["parquet-garbage"] = (
        lambda f: (f / "run" / "steps.parquet").write_bytes(b"PAR1 not really"),
        ("steps.parquet",),
    )
    edits["no-summary"] = (lambda f: (f / "run" / "summary.json").unlink(), ("summary.json",))
    return edits


COMMANDS = {
    "plot": lambda f: ["plot", "run", "-o", "pngs", "--what", "free-blocks"],
    "report": lambda f: ["report", "run", "-o", "r.html"],
    "export-trace": lambda f: ["export-trace", "run", "-o", "t.json"],
    "animate": lambda f: ["animate", "run", "-o", "a.gif", "--frames", "2"],
}


def test_hand_edited_run_folders(small_run: Path, tmp_path: Path) -> None:
    cases = []
    for key, (edit, names) in folder_edits().items():
        for command, args in COMMANDS.items():

            def setup(f: Path, edit: Callable[[Path], None] = edit) -> None:
                shutil.copytree(small_run, f / "run")
                edit(f)

            cases.append(Case(f"{key}-{command}", args, names=names, setup=setup, must_fail=True))
    run_cases(cases, tmp_path)


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_a_sweep_point_without_events_is_plotted(small_run: Path, tmp_path: Path) -> None:
    point = tmp_path / "run"
    shutil.copytree(small_run, point)
    (point / "events.parquet").unlink()
    result = CliRunner().invoke(app, ["plot", str(point)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (point / "plots").iterdir()) == [  # a v1 run's pictures
        "batch_size.png", "free_blocks.png", "kv_breakdown.png", "latency_cdfs.png",
        "prefix_hit_rate.png", "prompt_tokens.png",
    ]  # fmt: skip
    assert "skipped occupancy, gantt" in result.stdout
    for args in (["plot", str(point), "--what", "gantt"], ["animate", str(point), "-o", "a.gif"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "kvsim run --config" in result.stderr, result.output
    result = CliRunner().invoke(app, ["report", str(point)])
    assert result.exit_code == 0, result.output


def test_labels_are_one_short_line_and_never_mathtext() -> None:
    from kvsim.plots._common import text_label

    assert text_label("r" * 1000) == "r" * 23 + "\u2026"
    assert text_label("a\nb\tc") == "a b c"
    assert text_label("$x^2$") == r"\$x^2\$"
