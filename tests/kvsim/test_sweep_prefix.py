"""Block size x prefix caching x KV capacity sweeps: the kv_slots axis (capacity in tokens, the
same bytes at every block size), boolean axes, and the recommended block size's reason, built
from the table's numbers (synthetic tables here; real runs in test_sweep_prefix_run.py)."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.sweep.compare import recommended_block_sizes
from kvsim.sweep.spec import SweepError, command_line, make_spec, parse_param, parse_values
from kvsim.sweep.table import rows_frame

GRID = [
    ("block_size", (16, 64, 256)),
    ("kv_slots", (100_000, 400_000)),
    parse_param("enable_prefix_caching=true,false"),
]


def test_kv_slots_is_capacity_in_tokens_held_across_block_sizes() -> None:
    spec = make_spec(RunConfig(trace="t"), GRID)
    points = spec.points()
    assert len(points) == 12
    for p in points:
        slots = p.values["kv_slots"]
        assert p.config.num_blocks == slots // p.config.block_size
        # the same bytes, up to one block's rounding
        assert slots - p.config.block_size < p.config.num_blocks * p.config.block_size <= slots
    assert points[1].label == "block_size=16 kv_slots=100000 enable_prefix_caching=false"
    assert points[1].config.enable_prefix_caching is False
    assert points[1].folder == "001_block_size=16_kv_slots=100000_enable_prefix_caching=false"


def test_kv_slots_values_parse_as_whole_tokens() -> None:
    assert parse_values("kv_slots", "1e5,200_000,400000") == (100_000, 200_000, 400_000)
    assert parse_param("kv_slots=2e5") == ("kv_slots", (200_000,))
    with pytest.raises(SweepError, match="whole number of tokens"):
        parse_values("kv_slots", "1.5")
    with pytest.raises(SweepError, match="not a number of tokens"):
        parse_values("kv_slots", "lots")


def test_one_kv_slots_value_is_held_and_num_blocks_excludes_it() -> None:
    spec = make_spec(RunConfig(trace="t"), [("block_size", (16, 32)), ("kv_slots", (3200,))])
    assert spec.kv_slots == 3200 and spec.axis_names == ("block_size",)
    assert [p.config.num_blocks for p in spec.points()] == [200, 100]
    with pytest.raises(SweepError, match="kv_slots or num_blocks"):
        make_spec(RunConfig(trace="t", num_blocks=10), GRID)


def test_the_reproduce_command_and_the_cli_rebuild_the_grid() -> None:
    spec = make_spec(RunConfig(trace="t.jsonl"), GRID)
    args = command_line(spec)
    assert args == [
        "kvsim", "sweep", "t.jsonl", "--block-size", "16,64,256", "--kv-slots",
        "100000,400000", "--param", "enable_prefix_caching=true,false",
    ]  # fmt: skip
    result = CliRunner().invoke(app, [*args[1:], "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "12 points" in result.output
    assert "kv_slots=400000 enable_prefix_caching=false" in result.output
    assert "25,000" in result.output  # 400,000 tokens / 16
    bad = CliRunner().invoke(app, ["sweep", "t.jsonl", "--kv-slots", "1,x", "--dry-run"])
    assert bad.exit_code == 2 and "not a number of tokens" in bad.output


def _table(rows: list[dict[str, Any]], spec: Any) -> pd.DataFrame:
    full = []
    for i, r in enumerate(rows):
        queries = 1_000_000
        full.append(
            {
                "point": i, "label": f"p{i}", "folder": f"{i:03d}", "status": "ok", "error": "",
                "allocator": "paged", "num_blocks": 100,
                "throughput_output_tokens_per_s": 100.0, "throughput_requests_per_s": 1.0,
                "normalized_latency_s_per_token": r["lat"], "e2e_latency_s_p50": r["lat"],
                "e2e_latency_s_p99": r["lat"], "ttft_s_p99": r["ttft"], "tpot_s_p99": 0.01,
                "kv_token_state_share_mean": 0.5, "saturated": False,
                "prefix_cache_queries": queries,
                "prefix_cache_hits": round(queries * r["hit"]),
                "prefix_cache_hit_rate": r["hit"],
                "block_walk_share": r["walk"],
                **{k: r[k] for k in spec.axis_names},
            }
        )  # fmt: skip
    return rows_frame(full, spec)


def test_the_reason_cites_the_neighbours_hit_rates_and_walk_costs() -> None:
    spec = make_spec(RunConfig(trace="t"), [("block_size", (16, 64, 256))])
    rows = [
        {"block_size": 16, "hit": 0.470, "walk": 0.098, "lat": 0.030, "ttft": 2.2},
        {"block_size": 64, "hit": 0.462, "walk": 0.026, "lat": 0.020, "ttft": 1.4},
        {"block_size": 256, "hit": 0.410, "walk": 0.007, "lat": 0.025, "ttft": 3.1},
    ]
    [line] = recommended_block_sizes(_table(rows, spec), spec)
    assert line.startswith("recommended block size 64: the lowest normalized latency (0.0200")
    assert (
        "Block size 256 loses hits to coarse blocks: prefix-cache hit rate 41.0% vs 46.2% "
        "(-5.2 points, 52,000 more prompt tokens computed); normalized latency "
        "0.0250 s/token vs 0.0200 s/token (misses the SLO)." in line  # the default: p99 TTFT 2 s
    )
    assert (
        "Block size 16 pays per-block costs: the block-table walk takes 9.8% of busy time "
        "vs 2.6%, for a hit rate of 47.0% (+0.8 points); normalized latency 0.0300 s/token "
        "vs 0.0200 s/token (misses the SLO)." in line
    )


def test_under_an_slo_the_reason_compares_at_the_sustained_rate() -> None:
    spec = make_spec(
        RunConfig(trace="t"), [("block_size", (16, 64)), ("rate", (1.0, 2.0))], slo_ttft_s=2.0
    )
    rows = [
        {"block_size": 16, "rate": 1.0, "hit": 0.5, "walk": 0.02, "lat": 0.1, "ttft": 1.0},
        {"block_size": 16, "rate": 2.0, "hit": 0.5, "walk": 0.02, "lat": 0.1, "ttft": 1.5},
        {"block_size": 64, "rate": 1.0, "hit": 0.3, "walk": 0.01, "lat": 0.1, "ttft": 1.2},
        {"block_size": 64, "rate": 2.0, "hit": 0.3, "walk": 0.01, "lat": 0.1, "ttft": 4.0},
    ]
    [line] = recommended_block_sizes(_table(rows, spec), spec)
    assert line.startswith("recommended block size 16: it sustains 2 requests/s within the SLO")
    # the neighbour at 2 requests/s: its hit rate and p99 TTFT, flagged as missing the SLO
    assert re.search(
        r"Block size 64 loses hits to coarse blocks: prefix-cache hit rate 30\.0% vs 50\.0% "
        r"\(-20\.0 points, 200,000 more prompt tokens computed\); p99 TTFT 4\.00 s vs 1\.50 s "
        r"\(misses the SLO\)\.",
        line,
    ), line


def test_without_prefix_hits_the_coarse_block_sentence_says_so() -> None:
    spec = make_spec(RunConfig(trace="t"), [("block_size", (16, 64))])
    rows = [
        {"block_size": 16, "hit": 0.2, "walk": 0.05, "lat": 0.01, "ttft": 1.0},
        {"block_size": 64, "hit": 0.2, "walk": 0.01, "lat": 0.02, "ttft": 1.0},
    ]
    [line] = recommended_block_sizes(_table(rows, spec), spec)
    assert "Block size 64 loses no prefix hits (hit rate 20.0% vs 20.0%)" in line
