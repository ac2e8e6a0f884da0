"""`kvsim sweep`'s grid: option parsing, points, memory held across block sizes, SLO rates and
the command that reproduces a sweep (no simulation runs here; see test_sweep_run.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.sweep.spec import (
    SweepError,
    SweepSpec,
    command_line,
    make_spec,
    parse_param,
    parse_values,
)
from kvsim.sweep.table import WALL_COLUMNS, max_rates
from workloads import DEFAULT_TRACE_NAME, load_trace, resolve_trace, save_trace, truncate

FIGURES = {"throughput", "latency", "normalized_latency", "memory", "batch"}


def write_tiny_trace(folder: Path) -> str:
    """The first 60 requests of the shipped default trace, as a trace file in ``folder``."""
    path = folder / "tiny.jsonl"
    save_trace(truncate(load_trace(resolve_trace(DEFAULT_TRACE_NAME)), max_requests=60), path)
    return str(path)


def grid(trace: str, **options: object) -> SweepSpec:
    """block_size 16, 64 x allocator paged, max: four quick points, events written."""
    axes = [("block_size", (16, 64)), ("allocator", ("paged", "max"))]
    options.setdefault("events", True)
    return make_spec(RunConfig(trace=trace), axes, **options)  # type: ignore[arg-type]


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=list(WALL_COLUMNS))


# --- the grid and its options ------------------------------------------------------------------


def test_values_are_parsed_by_the_run_option_types() -> None:
    assert parse_values("block_size", "1,2,4") == (1, 2, 4)
    assert parse_values("rate", "0.5,2") == (0.5, 2.0)
    assert parse_values("max_model_len", "none,512") == (None, 512)
    assert parse_param("max-num-seqs=64,128") == ("max_num_seqs", (64, 128))
    assert parse_param("fast_decode=true,false") == ("fast_decode", (True, False))
    with pytest.raises(SweepError, match="unknown run option 'max_seqs'"):
        parse_param("max_seqs=1,2")
    with pytest.raises(SweepError, match="'x' is not an integer"):
        parse_values("block_size", "16,x")
    for bad in ("yes", "1", "maybe"):  # RunConfig's JSON booleans only (issue 31)
        with pytest.raises(SweepError, match=f"{bad!r} is not true or false"):
            parse_param(f"fast_decode=true,{bad}")
    for bad in ("1_000", " ", "nan"):
        with pytest.raises(SweepError, match=r"is not a number|empty value"):
            parse_values("rate", f"1,{bad}")
    with pytest.raises(SweepError, match="name=v1,v2"):
        parse_param("block_size")
    with pytest.raises(SweepError, match="empty value"):
        parse_values("block_size", "16,,32")


def test_points_are_the_product_of_the_axes_first_axis_slowest() -> None:
    spec = grid("t")
    labels = [p.label for p in spec.points()]
    assert labels == [
        "block_size=16 allocator=paged",
        "block_size=16 allocator=max",
        "block_size=64 allocator=paged",
        "block_size=64 allocator=max",
    ]
    assert [p.config.block_size for p in spec.points()] == [16, 16, 64, 64]
    assert spec.points()[0].folder == "000_block_size=16_allocator=paged"


def test_gpu_memory_is_held_fixed_across_block_sizes() -> None:
    # Planned pools (num_blocks unset) follow the block size inside each run; a given
    # num_blocks is held as slots: 100 blocks of 16 = 1,600 slots.
    spec = make_spec(RunConfig(trace="t", num_blocks=100), [("block_size", (1, 16, 64))])
    assert spec.kv_slots == 1600 and spec.base.num_blocks is None
    assert [p.config.num_blocks for p in spec.points()] == [1600, 100, 25]
    # One block size is no sweep: --block-size 32 --num-blocks 100 means 100 blocks of 32.
    spec = make_spec(RunConfig(trace="t", num_blocks=100), [("block_size", (32,))])
    assert spec.axes == () and spec.base.block_size == 32 and spec.base.num_blocks == 100


def test_invalid_sweeps_are_refused_before_anything_runs() -> None:
    with pytest.raises(SweepError, match="cannot sweep 'trace'"):
        SweepSpec(base=RunConfig(trace="t"), axes=(("trace", ("a", "b")),))
    with pytest.raises(SweepError, match="repeated"):
        make_spec(RunConfig(trace="t"), [("block_size", (16, 16))])
    with pytest.raises(SweepError, match="block_size=0"):
        make_spec(RunConfig(trace="t"), [("block_size", (0, 16))]).points()
    with pytest.raises(SweepError, match="slo_percentile"):
        grid("t", slo_ttft_s=1.0, slo_percentile=95)


def test_command_line_rebuilds_the_spec() -> None:
    base = RunConfig(trace="tr.jsonl", model="llama-2-13b", max_num_seqs=64, fast_decode=False)
    spec = make_spec(
        base,
        [("rate", (1.0, 2.0)), parse_param("watermark=0,0.05")],
        slo_ttft_s=2.0,
        slo_percentile=90,
    )
    assert command_line(spec) == [
        "kvsim",
        "sweep",
        "tr.jsonl",
        "--model",
        "llama-2-13b",
        "--max-num-seqs",
        "64",
        "--param",
        "fast_decode=false",
        "--rate",
        "1.0,2.0",
        "--param",
        "watermark=0.0,0.05",
        "--slo-ttft",
        "2.0",
        "--slo-percentile",
        "90",
    ]


def test_command_line_gives_a_switch_as_a_switch(tmp_path: Path) -> None:
    """``--no-enable-chunked-prefill``, not ``--enable-chunked-prefill false`` (which the
    sweep command does not parse): the reproduce line runs."""
    base = RunConfig(trace=DEFAULT_TRACE_NAME, enable_chunked_prefill=False, max_model_len=9000,
                     allow_long_max_model_len=True, until=1.0)  # fmt: skip
    args = command_line(make_spec(base, [("block_size", (16, 32))]))
    assert "--no-enable-chunked-prefill" in args and "--allow-long-max-model-len" in args
    assert "false" not in args and "true" not in args
    result = CliRunner().invoke(app, [*args[1:], "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.split("reproduce: ")[1].split() == args


def test_max_rate_is_the_highest_rate_below_the_first_slo_miss() -> None:
    spec = make_spec(
        RunConfig(trace="t"),
        [("allocator", ("paged", "max")), ("rate", (1.0, 2.0, 4.0))],
        slo_ttft_s=1.0,
    )
    frame = pd.DataFrame(
        {
            "allocator": ["paged"] * 3 + ["max"] * 3,
            "rate": [1.0, 2.0, 4.0] * 2,
            "slo_met": [True, True, False, False, True, True],
        }
    )
    rates = max_rates(frame, spec)
    assert rates["allocator"].tolist() == ["paged", "max"]
    assert rates.loc[0, "max_rate"] == 2.0
    assert pd.isna(rates.loc[1, "max_rate"])  # 1 req/s misses: 2 and 4 do not count


def test_dry_run_lists_the_points_and_its_command_rebuilds_the_sweep(tmp_path: Path) -> None:
    args = [
        "sweep",
        "tr.jsonl",
        "--block-size",
        "8,32",
        "--num-blocks",
        "500",
        "--rate",
        "2",
        "--param",
        "max_num_seqs=16,64",
        "--slo-tpot",
        "0.1",
        "--dry-run",
    ]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "4 points" in first.output and "1,000" in first.output  # 8,000 slots / 8
    command = first.output.split("reproduce: ")[1].split()
    assert command[:3] == ["kvsim", "sweep", "tr.jsonl"] and "--kv-slots" in command
    again = CliRunner().invoke(app, [*command[1:], "--dry-run"])
    assert again.exit_code == 0, again.output
    assert again.output == first.output
    assert list(tmp_path.iterdir()) == []
