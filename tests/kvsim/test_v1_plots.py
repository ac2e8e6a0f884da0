"""The pictures of a v1 run with prefix caching: cached-evictable blocks on the occupancy map,
the free-blocks plot and the breakdown, evictions marked, the hit rate and cached prompt
tokens over time — each checked against the run's own tables."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvsim.analysis.occupancy import cached_intervals
from kvsim.config import RunConfig
from kvsim.plots import (
    PICTURES,
    breakdown_shares,
    is_v1,
    plot_free_blocks,
    plot_occupancy,
    plot_prefix_hit_rate,
    plot_prompt_tokens,
    write_pictures,
)
from kvsim.plots.standard import OFFLOAD_PICTURE_NAMES
from kvsim.runner import RunResult, run

# A v1 run's pictures (without a KV offload tier).
V1_RUN_PICTURES = {n: f for n, f in PICTURES.items() if n not in OFFLOAD_PICTURE_NAMES}


@pytest.fixture(scope="module")
def v1_run(conversation_trace: Path) -> RunResult:
    config = RunConfig(
        trace=str(conversation_trace), model="llama-3.1-8b", gpu="h100-sxm", num_blocks=40
    )
    return run(config)


def legend_labels(fig: plt.Figure) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_cached_intervals_count_the_steps_cached_blocks(v1_run: RunResult) -> None:
    assert v1_run.events is not None
    steps = v1_run.steps
    iv = cached_intervals(v1_run.events, v1_run.summary["num_blocks"])
    # mid-step nothing happens to blocks: the state is the one after scheduling the step
    mid = (steps["time_s"] + steps["duration_s"] / 2).to_numpy()
    start, end = iv["start_s"].to_numpy(), iv["end_s"].to_numpy()
    covering = ((start[None, :] <= mid[:, None]) & (end[None, :] > mid[:, None])).sum(axis=1)
    assert (covering == steps["cached_blocks"].to_numpy()).all()
    assert steps["cached_blocks"].max() > 0


def test_the_occupancy_map_tells_cached_blocks_from_held_ones(v1_run: RunResult) -> None:
    assert v1_run.events is not None
    for by_request in (False, True):
        fig = plot_occupancy(v1_run.events, v1_run.summary["num_blocks"], by_request=by_request)
        assert "cached, evictable" in legend_labels(fig)
        plt.close(fig)


def test_free_blocks_shade_cached_ones_and_mark_evictions(v1_run: RunResult) -> None:
    fig = plot_free_blocks(v1_run.steps, v1_run.events, num_blocks=40)
    labels = legend_labels(fig)
    evictions = v1_run.summary["prefix_cache_evictions"]
    assert f"eviction ({evictions:,} blocks)" in labels
    assert "of which cached, evictable" in labels
    plt.close(fig)


def test_the_breakdown_draws_cached_slots(v1_run: RunResult) -> None:
    shares = breakdown_shares(v1_run.steps, 40 * 16)
    assert list(shares)[-2:] == ["cached, evictable", "free"]
    total = sum(shares.values())
    assert np.allclose(total.to_numpy(), 1.0)


def test_the_cumulative_hit_rate_ends_at_the_summarys(v1_run: RunResult) -> None:
    fig = plot_prefix_hit_rate(v1_run.requests)
    (line,) = fig.axes[0].get_lines()
    assert line.get_ydata()[-1] == pytest.approx(v1_run.summary["prefix_cache_hit_rate"])
    plt.close(fig)


def test_cached_and_computed_prompt_tokens_add_up(v1_run: RunResult) -> None:
    fig = plot_prompt_tokens(v1_run.steps, v1_run.requests, bins=10)
    share = v1_run.summary["prompt_tokens_cached"] / (
        v1_run.summary["prompt_tokens_cached"] + v1_run.steps["num_prefill_tokens"].sum()
    )
    assert f"({share:.1%} of" in fig.axes[0].get_title()
    plt.close(fig)


def test_a_v1_run_writes_the_prefix_cache_pictures(v1_run: RunResult, tmp_path: Path) -> None:
    assert is_v1(v1_run)
    paths = write_pictures(v1_run, tmp_path)
    assert sorted(p.name for p in paths) == sorted(V1_RUN_PICTURES.values())


def test_a_classic_run_draws_a_note_instead(toy_sim: object) -> None:
    result = toy_sim([(0.0, 13, 2)], num_blocks=16, block_size=4)  # type: ignore[operator]
    fig = plot_prefix_hit_rate(result.requests)
    assert any("no prefix cache" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_the_report_of_a_v1_run_shows_its_prefix_cache(v1_run: RunResult) -> None:
    from kvsim.outputs.report import build_report

    page = build_report(v1_run)
    s = v1_run.summary
    assert f"{s['prefix_cache_hit_rate']:.1%} ({s['prefix_cache_hits']:,} of" in page
    assert page.count("data:image/png") == len(V1_RUN_PICTURES)
    assert "<th>prefill</th>" in page and "cached, evictable" in page


def requests_with_hits(hit_share: float) -> pd.DataFrame:
    """100 requests of 1,000 prompt tokens admitted over 100 s, each hitting ``hit_share``."""
    return pd.DataFrame(
        {
            "admit_time_s": np.arange(100.0),
            "prompt_tokens": np.full(100, 1000),
            "prefix_hit_tokens": np.full(100, round(1000 * hit_share)),
        }
    )


def test_the_hit_rate_axis_fits_a_small_rate() -> None:
    fig = plot_prefix_hit_rate(requests_with_hits(0.04))
    bottom, top = fig.axes[0].get_ylim()
    assert bottom == 0 and 0.04 < top <= 0.05  # 4% fills the axis, not 4% of 0-100%
    assert "4.0% of prompt tokens" in fig.axes[0].get_title()
    plt.close(fig)
    fig = plot_prefix_hit_rate(requests_with_hits(0.9))
    assert fig.axes[0].get_ylim()[1] == 1.0  # never past 100%
    plt.close(fig)


def test_a_run_without_hits_says_so() -> None:
    fig = plot_prefix_hit_rate(requests_with_hits(0.0))
    assert any("no prefix-cache hits" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
