"""Sweep points compared like with like (kvsim/sweep/compare.py): the best points per rate,
points missing the SLOs left out, one recommended block size with its reason, values as
typed."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvsim.config import RunConfig
from kvsim.sweep.compare import (
    best_by_rate,
    recommendations,
    recommended_block_sizes,
    value_text,
)
from kvsim.sweep.spec import SweepSpec, make_spec
from kvsim.sweep.table import rows_frame


def spec(axes: list[tuple[str, tuple[Any, ...]]], **options: Any) -> SweepSpec:
    return make_spec(RunConfig(trace="t"), axes, **options)


def points(rows: list[dict[str, Any]], sweep: SweepSpec) -> pd.DataFrame:
    """sweep.csv's table of ``rows`` (each: block_size, rate, latency, throughput, saturated)."""
    full = []
    for i, r in enumerate(rows):
        label = " ".join(f"{k}={r[k]}" for k in sweep.axis_names)
        full.append(
            {
                "point": i, "label": label, "folder": f"{i:03d}", "status": "ok", "error": "",
                "allocator": "paged", "num_blocks": 100, "kv_slots": 1600,
                "throughput_output_tokens_per_s": r.get("tput", 100.0),
                "throughput_requests_per_s": 1.0,
                "normalized_latency_s_per_token": r["lat"],
                "e2e_latency_s_p50": r["lat"], "e2e_latency_s_p99": r["lat"],
                "ttft_s_p99": r.get("ttft", 0.1), "tpot_s_p99": r.get("tpot", 0.01),
                "kv_token_state_share_mean": 0.5, "saturated": r.get("sat", False),
                "saturation": r.get("verdict", "stable"),
                "offered_rate_per_s": r.get("rate", 4.0), **{k: r[k] for k in sweep.axis_names},
            }
        )  # fmt: skip
    return rows_frame(full, sweep)


BLOCKS = spec([("block_size", (8, 16, 32))])


def test_the_recommended_block_size_has_the_lowest_latency_of_those_meeting_the_slos() -> None:
    table = points(
        [
            {"block_size": 8, "lat": 0.01, "ttft": 9.0},  # fastest looking, misses the SLO
            {"block_size": 16, "lat": 0.03},
            {"block_size": 32, "lat": 0.02},
        ],
        BLOCKS,
    )
    [line] = recommended_block_sizes(table, BLOCKS)
    assert line.startswith(
        "recommended block size 32: the lowest normalized latency (0.0200 s/token) of 2 block "
        "sizes meeting the SLOs (p99 TTFT ≤ 2 s and p99 TPOT ≤ 200 ms (default; --slo to "
        "change))."
    )
    [comparison] = best_by_rate(table, BLOCKS)
    assert comparison.note is not None and "block_size=8" in comparison.note
    assert all("block_size=8" not in b.label for b in comparison.best)


def test_when_no_point_meets_the_slos_none_is_recommended() -> None:
    table = points(
        [{"block_size": b, "lat": 1.0 / b, "ttft": 3.0 * b} for b in (8, 16, 32)], BLOCKS
    )
    [line] = recommended_block_sizes(table, BLOCKS)
    assert line.startswith("no block size meets the SLOs (p99 TTFT ≤ 2 s")
    [comparison] = best_by_rate(table, BLOCKS)
    assert comparison.best == [] and "no point meets the SLOs" in (comparison.note or "")
    [r] = recommendations(table, BLOCKS)
    assert r.pick is None and r.sentence.startswith("no point meets the SLOs")
    assert r.lost[0] == ("block_size=8", "misses the SLO: p99 TTFT 24 s > 2 s")


def test_points_are_compared_at_the_same_rate() -> None:
    grid = spec([("block_size", (8, 16)), ("rate", (2.0, 8.0))])
    table = points(
        [
            {"block_size": 8, "rate": 2.0, "lat": 0.02, "tput": 50},
            {"block_size": 8, "rate": 8.0, "lat": 0.09, "tput": 200},
            {"block_size": 16, "rate": 2.0, "lat": 0.01, "tput": 51},
            {"block_size": 16, "rate": 8.0, "lat": 0.08, "tput": 199},
        ],
        grid,
    )
    by_rate = {c.group["rate"]: c for c in best_by_rate(table, grid)}
    assert set(by_rate) == {2.0, 8.0}
    lowest = {r: next(b for b in c.best if b.objective == "lowest normalized latency")
              for r, c in by_rate.items()}  # fmt: skip
    assert lowest[2.0].label == "block_size=16 rate=2.0"
    assert lowest[8.0].label == "block_size=16 rate=8.0"
    lines = recommended_block_sizes(table, grid)
    slos = "(p99 TTFT ≤ 2 s and p99 TPOT ≤ 200 ms (default; --slo to change))"
    assert lines == [
        "rate=2: recommended block size 16: the lowest normalized latency (0.0100 s/token) "
        f"of 2 block sizes meeting the SLOs {slos}.",
        "rate=8: recommended block size 16: the lowest normalized latency (0.0800 s/token) "
        f"of 2 block sizes meeting the SLOs {slos}.",
    ]
    # the point at 8 req/s is never compared with one at 2 req/s
    by_load = {r.group["rate"]: r for r in recommendations(table, grid)}
    assert by_load["8"].lost == [
        ("block_size=8 rate=8.0", "normalized latency 0.0900 s/token vs 0.0800 s/token (+12.5%)")
    ]


def test_with_an_slo_the_block_size_sustaining_the_highest_rate_is_recommended() -> None:
    grid = spec([("block_size", (8, 16, 32)), ("rate", (1.0, 2.0, 4.0))], slo_ttft_s=0.5)
    rows = []
    for block, meets_up_to in ((8, 2.0), (16, 4.0), (32, 4.0)):
        for rate in (1.0, 2.0, 4.0):
            rows.append(
                {"block_size": block, "rate": rate, "ttft": 0.1 if rate <= meets_up_to else 9.0,
                 "lat": 0.05 if block == 16 else 0.04}
            )  # fmt: skip
    [line] = recommended_block_sizes(points(rows, grid), grid)
    assert line == (
        "recommended block size 32: it sustains 4 requests/s within the SLO, the highest rate "
        "of any block size (tied with 1 other; lowest normalized latency there, "
        "0.0400 s/token)."
    )


def test_integer_options_print_as_integers() -> None:
    assert value_text("block_size", 16.0) == "16"
    assert value_text("rate", 2.5) == "2.5"
    assert value_text("allocator", "paged") == "paged"
    table = points([{"block_size": 8, "lat": 0.1}], spec([("block_size", (8, 16))]))
    assert str(table["block_size"].dtype) == "Int64"
    assert table.to_csv(index=False).splitlines()[1].split(",")[5] == "8"  # after slo_met
