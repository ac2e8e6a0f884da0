"""A sweep over the CPU offload tier's size (docs/sweeps.md, "CPU offload tier"): the points run
with their tiers, sweep.csv has their offload columns, and the advice names the smallest tier
within 1 point of the largest's hit rate (all tiers) with its TTFT against no tier."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvsim.config import RunConfig
from kvsim.sweep.offload_advice import table_rows, tier_advice
from kvsim.sweep.spec import SweepError, SweepSpec
from tests.kvsim.test_offload_run import MODEL, kvsim, write_trace


def spec(*axes: tuple[str, tuple[object, ...]]) -> SweepSpec:
    return SweepSpec(base=RunConfig(trace="t.jsonl"), axes=tuple(axes))


def points(rows: list[tuple[float, float, float, float]], **extra: object) -> pd.DataFrame:
    """A sweep table by hand: (size GiB, hit rate all tiers, TTFT p50, TTFT p99) per point;
    the GPU's own hit rate 0.30 everywhere."""
    frame = pd.DataFrame(
        [
            {"point": i, "label": f"kv_offloading_size={size:g}", "status": "ok",
             "kv_offloading_size": size, "hit_rate_all_tiers": rate,
             "prefix_cache_hit_rate": 0.30, "offload_loaded_tokens": 0 if size == 0 else 1000,
             "ttft_s_p50": p50, "ttft_s_p99": p99}
            for i, (size, rate, p50, p99) in enumerate(rows)
        ]
    )  # fmt: skip
    for name, value in extra.items():
        frame[name] = value
    return frame


SIZES = spec(("kv_offloading_size", (0.0, 16.0, 64.0, 256.0)))


def test_the_smallest_tier_within_one_point_of_the_largest_is_named() -> None:
    # 64 GiB is 0.7 points below 256 GiB's hit rate; 16 GiB is 5.9 points below
    frame = points([(0, 0.30, 2.0, 9.0), (16, 0.40, 1.5, 8.0), (64, 0.452, 1.0, 6.0),
                    (256, 0.459, 0.9, 5.0)])  # fmt: skip
    [advice] = tier_advice(frame, SIZES)
    assert advice.pick is not None and advice.pick["kv_offloading_size"] == 64
    assert (
        "The smallest CPU tier within 1 point of the largest's hit rate is 64 GiB: 45.2% of "
        "prompt tokens from GPU and CPU (its GPU cache alone: 30.0%) against 45.9% with 256 GiB"
    ) in advice.sentence
    assert "TTFT p50 2 s → 1 s (-50%), p99 9 s → 6 s (-33%) against no CPU tier" in (
        advice.sentence
    )
    rows = table_rows(advice)
    assert [r[0] for r in rows] == ["0 GiB", "16 GiB", "64 GiB (recommended)", "256 GiB"]
    assert rows[2][1:] == ["45.2%", "30.0%", "1,000", "1 s", "6 s"]


def test_exactly_one_point_below_the_largest_still_counts_as_within() -> None:
    frame = points([(0, 0.30, 2.0, 9.0), (16, 0.45, 1.5, 8.0), (64, 0.46, 1.0, 6.0)])
    [advice] = tier_advice(frame, spec(("kv_offloading_size", (0.0, 16.0, 64.0))))
    assert advice.pick is not None and advice.pick["kv_offloading_size"] == 16


def test_no_tier_is_needed_when_the_gpu_alone_is_within_one_point() -> None:
    frame = points([(0, 0.300, 2.0, 9.0), (64, 0.305, 2.0, 9.0), (256, 0.309, 2.0, 9.0)])
    [advice] = tier_advice(frame, spec(("kv_offloading_size", (0.0, 64.0, 256.0))))
    assert advice.pick is not None and advice.pick["kv_offloading_size"] == 0
    assert advice.sentence.startswith("No CPU tier is needed")


def test_a_failed_point_is_left_out_and_each_other_axis_value_gets_its_advice() -> None:
    frame = pd.concat(
        [
            points([(0, 0.30, 2.0, 9.0), (64, 0.45, 1.0, 6.0), (256, 0.46, 0.9, 5.0)], rate=1.0),
            points([(0, 0.20, 3.0, 9.0), (64, 0.25, 2.0, 6.0), (256, 0.50, 0.9, 5.0)], rate=2.0),
        ],
        ignore_index=True,
    )
    frame.loc[2, "status"] = "failed"  # rate 1's 256 GiB point: its largest is then 64 GiB
    sizes = ("kv_offloading_size", (0.0, 64.0, 256.0))
    advice = tier_advice(frame, spec(("rate", (1.0, 2.0)), sizes))
    assert [a.group for a in advice] == [{"rate": 1.0}, {"rate": 2.0}]
    assert [a.pick["kv_offloading_size"] for a in advice if a.pick is not None] == [64, 256]
    assert advice[0].sentence.startswith("rate=1: the largest tier swept, 64 GiB, is the only")
    assert len(advice[0].rows) == 2


def test_a_sweep_without_the_axis_gives_no_advice() -> None:
    frame = points([(0, 0.30, 2.0, 9.0)])
    assert tier_advice(frame, spec(("max_num_seqs", (8, 16)))) == []


def test_kvsim_sweep_runs_tier_sizes_and_reports_the_smallest(tmp_path: Path) -> None:
    # the GPU (7 blocks) loses r0's prompt before r2 repeats it: a 1 GiB tier serves it, a
    # 0.01 GiB one (5 chunks) has evicted it too
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5], [1, 2, 3, 4, 5], [11, 12, 13, 14, 15],
               [1, 2, 3, 4, 5]]  # fmt: skip
    trace = write_trace(tmp_path / "t.jsonl", prompts)
    out = tmp_path / "sweep"
    result = kvsim(
        "sweep", trace, *MODEL, "--num-blocks", "7", "--param",
        "kv_offloading_size=0,0.01,1,2", "--jobs", "1", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "sweep.csv").set_index("kv_offloading_size")
    assert table.loc[0.0, "hit_rate_all_tiers"] == table.loc[0.0, "prefix_cache_hit_rate"]
    assert table.loc[0.0, "offload_loaded_tokens"] == 0
    assert table.loc[1.0, "offload_loaded_tokens"] > 0
    assert table.loc[1.0, "hit_rate_all_tiers"] > table.loc[0.0, "hit_rate_all_tiers"]
    point = json.loads((out / "points" / table.loc[1.0, "folder"] / "summary.json").read_text())
    assert point["offload"]["capacity_chunks"] == 512  # the point ran with its 1 GiB tier
    report = (out / "report.md").read_text()
    assert "## CPU offload tier" in report
    assert "| 1 GiB (recommended) |" in report
    assert "The smallest CPU tier within 1 point of the largest's hit rate is 1 GiB" in (
        result.output
    )
    assert "<h2>CPU offload tier</h2>" in (out / "report.html").read_text()


def test_the_axis_is_sweepable_and_checked() -> None:
    assert spec(("kv_offloading_size", (0.0, 64.0))).axis_names == ("kv_offloading_size",)
    with pytest.raises(SweepError, match="repeated"):
        spec(("kv_offloading_size", (64.0, 64.0)))
