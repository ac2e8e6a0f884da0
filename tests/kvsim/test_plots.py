"""kvsim.plots: every picture draws from the run tables, windows and aggregates as documented,
and the files written are PNGs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from kvsim.config import RunConfig
from kvsim.plots import (
    COLORS,
    PICTURES,
    V1_PICTURES,
    draw,
    plot_batch_size,
    plot_free_blocks,
    plot_gantt,
    plot_latency_cdfs,
    plot_occupancy,
    write_pictures,
    write_run_plots,
)
from kvsim.plots.standard import OFFLOAD_PICTURE_NAMES
from kvsim.runner import RunResult, run

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


@pytest.fixture
def preempting_run(toy_sim: Callable[..., RunResult]) -> RunResult:
    """Seq 1 is preempted at 2.5 s (see test_occupancy); seq 2 (40 tokens) is rejected."""
    return toy_sim([(0, 4, 6), (0, 4, 6), (1, 40, 2)], block_size=4, num_blocks=4)


def image_of(fig: Figure) -> np.ndarray:
    images = [image for ax in fig.axes for image in ax.get_images()]
    assert len(images) == 1
    return np.asarray(images[0].get_array())


def synthetic_events(num_blocks: int, num_steps: int, seed: int = 0) -> pd.DataFrame:
    """ALLOCATE/FREE rows: every 20th step a new sequence takes 1-64 blocks for 1-2,000 steps
    of 10 ms (block ids cycle through the pool, so holdings never overlap)."""
    rng = np.random.default_rng(seed)
    starts = np.arange(0, num_steps, 20)
    sizes = rng.integers(1, 65, len(starts))
    seq = np.repeat(np.arange(len(starts)), sizes)
    block = np.arange(sizes.sum()) % num_blocks  # a block comes round again ~60,000 steps later
    step0 = np.repeat(starts, sizes)
    step1 = np.minimum(step0 + np.repeat(rng.integers(1, 2000, len(starts)), sizes), num_steps)
    n = len(seq)
    return pd.DataFrame(
        {
            "time_s": np.concatenate([step0, step1]) * 0.01,
            "step": np.concatenate([step0, step1]),
            "kind": pd.Categorical(["ALLOCATE"] * n + ["FREE"] * n),
            "seq_id": np.concatenate([seq, seq]),
            "block_id": np.concatenate([block, block]),
            "free_blocks": 0,
            "num_tokens": 0,
        }
    ).sort_values("time_s", kind="stable", ignore_index=True)


# --- occupancy map ------------------------------------------------------------------------------


def test_occupancy_of_a_small_pool_colours_blocks_by_request(preempting_run: RunResult) -> None:
    fig = plot_occupancy(preempting_run.events, 4, end_s=4.3125, cols=100)
    image = image_of(fig)
    assert image.shape == (4, 100, 3)  # one row per block, RGB by owner
    free = np.array(to_rgba(COLORS["free"])[:3])
    # At first seq 0 holds block 0 and seq 1 block 1, each in its own colour; 2 and 3 are free.
    assert np.allclose(image[2:, 0], free)
    assert not np.allclose(image[0, 0], free) and not np.allclose(image[1, 0], free)
    assert not np.allclose(image[0, 0], image[1, 0])


def test_occupancy_by_state_is_a_share_per_cell(preempting_run: RunResult) -> None:
    fig = plot_occupancy(preempting_run.events, 4, end_s=4.0, by_request=False, cols=16)
    share = image_of(fig)
    assert share.shape == (4, 16)
    assert share.min() >= 0 and share.max() <= 1
    assert share[:, 8].mean() == 1.0  # 2.0-2.25 s: all four blocks in use


def test_occupancy_of_100k_blocks_aggregates_rows_and_columns() -> None:
    events = synthetic_events(100_000, 100_000)
    fig = plot_occupancy(events, 100_000, max_rows=400, cols=800)
    share = image_of(fig)
    assert share.shape == (400, 800)
    assert 0 < share.mean() < 1
    assert "one row per 250 blocks" in fig.axes[0].get_title()


def test_occupancy_window_sets_the_time_axis(preempting_run: RunResult) -> None:
    fig = plot_occupancy(preempting_run.events, 4, t_from=1.0, t_to=3.0)
    assert fig.axes[0].get_xlim() == (1.0, 3.0)


# --- time series and requests -------------------------------------------------------------------


def test_free_blocks_marks_preemptions_and_rejections(preempting_run: RunResult) -> None:
    fig = plot_free_blocks(preempting_run.steps, preempting_run.events, num_blocks=4)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["free blocks", "pool (4)", "preempt (1)", "reject (1)"]  # all drawn


def test_free_blocks_window(preempting_run: RunResult) -> None:
    fig = plot_free_blocks(preempting_run.steps, t_from=1.5, t_to=2.5)
    assert fig.axes[0].get_xlim() == (1.5, 2.5)
    fig = plot_free_blocks(preempting_run.steps, t_from=100.0, t_to=200.0)
    assert "nothing in this window" in [t.get_text() for t in fig.axes[0].texts]


def test_batch_size_has_sequences_and_batched_tokens(preempting_run: RunResult) -> None:
    fig = plot_batch_size(preempting_run.steps)
    top, bottom = fig.axes
    assert top.get_ylabel() == "sequences" and bottom.get_ylabel().startswith("batched tokens")
    tokens = np.concatenate([c.get_offsets()[:, 1] for c in bottom.collections])
    assert sorted(set(tokens.tolist())) == sorted(set(preempting_run.steps["num_batched_tokens"]))


def bars_by_colour(fig: Figure) -> dict[str, list[tuple[float, float, float]]]:
    """Gantt bars as (row, start, end), by state colour name."""
    names = {to_rgba(COLORS[s]): s for s in ("queued", "prefill", "decode", "preempted")}
    out: dict[str, list[tuple[float, float, float]]] = {}
    for patch in fig.axes[0].patches:
        state = names[patch.get_facecolor()]
        row = round(patch.get_y() + patch.get_height() / 2)
        out.setdefault(state, []).append((row, patch.get_x(), patch.get_x() + patch.get_width()))
    return out


def test_gantt_draws_the_states_of_a_preempted_request(preempting_run: RunResult) -> None:
    fig = plot_gantt(preempting_run.events, preempting_run.steps)
    bars = bars_by_colour(fig)
    assert (1, 2.5, 2.75) in bars["preempted"]
    assert (1, 0.0, 1.5) in bars["prefill"] and (1, 2.75, 4.3125) in bars["prefill"]
    assert (1, 1.5, 2.5) in bars["decode"]
    assert [b for b in bars["queued"] if b[0] == 2] == [(2, 1.0, 1.5)]  # rejected at 1.5 s
    assert [t.get_text() for t in fig.legends[0].get_texts()][-1] == "reject"


def test_gantt_limits_and_labels_requests(preempting_run: RunResult) -> None:
    fig = plot_gantt(
        preempting_run.events, preempting_run.steps, requests=preempting_run.requests,
        max_requests=2,
    )  # fmt: skip
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["r0", "r1"]
    fig = plot_gantt(preempting_run.events, preempting_run.steps, t_from=1.2, t_to=1.4)
    assert len(fig.axes[0].get_yticks()) == 3  # all three are alive in that window


def test_latency_cdfs_with_no_finished_requests() -> None:
    empty = pd.DataFrame(
        {c: [np.nan] for c in ("queueing_delay_s", "ttft_s", "tpot_s", "e2e_latency_s")}
    )
    fig = plot_latency_cdfs(empty)
    assert all("no values" in [t.get_text() for t in ax.texts] for ax in fig.axes)


# --- files --------------------------------------------------------------------------------------


def test_write_pictures_writes_every_png(pressured_run: RunResult, tmp_path: Path) -> None:
    # a classic run: every picture but the v1 run's prefix-cache ones and the offload ones
    paths = write_pictures(pressured_run, tmp_path / "plots", t_from=100.0, t_to=130.0)
    classic = [f for name, f in PICTURES.items() if name not in V1_PICTURES + OFFLOAD_PICTURE_NAMES]
    assert sorted(p.name for p in paths) == sorted(classic)
    assert all(p.read_bytes().startswith(PNG) for p in paths)
    assert not [p for p in (tmp_path / "plots").iterdir() if p.name.startswith(".")]


def test_draw_rejects_an_unknown_picture(preempting_run: RunResult) -> None:
    with pytest.raises(KeyError, match="no picture named 'pie'"):
        draw(preempting_run, "pie")


@pytest.mark.slow  # seconds of end-to-end work; a sibling checks the rule by default
def test_write_run_plots_keeps_its_signature(preempting_run: RunResult, tmp_path: Path) -> None:
    r = preempting_run
    marks = r.events[r.events["kind"].isin(["PREEMPT", "REJECT"])]
    names = {p.name for p in write_run_plots(r.steps, r.requests, r.summary, tmp_path / "a", marks)}
    assert names == {"free_blocks.png", "kv_breakdown.png", "batch_size.png", "latency_cdfs.png"}
    full = write_run_plots(r.steps, r.requests, r.summary, tmp_path / "b", r.events)
    # a classic run draws no v1 picture, and a run without a CPU tier no offload picture
    v1_only = {PICTURES[name] for name in V1_PICTURES + OFFLOAD_PICTURE_NAMES}
    assert {p.name for p in full} == set(PICTURES.values()) - v1_only


def test_pictures_of_a_run_that_streamed_its_events(
    pressured_config: RunConfig, tmp_path: Path
) -> None:
    streamed = run(pressured_config.replace(until=60.0), events_path=tmp_path / "events.parquet")
    assert streamed.events is None
    fig = draw(streamed, "occupancy")
    assert image_of(fig).shape == (240, 800)


def test_the_gantt_title_counts_the_requests_in_the_window(pressured_run: RunResult) -> None:
    r = pressured_run.requests
    t_from, t_to = 30.0, 60.0
    end = r["finish_time_s"].fillna(pressured_run.summary["sim_duration_s"])
    alive = int(((r["arrival_time_s"] < t_to) & (end > t_from)).sum())
    assert alive > 40  # more than the chart draws
    fig = plot_gantt(
        pressured_run.events, pressured_run.steps, requests=r, t_from=t_from, t_to=t_to
    )
    assert (
        fig.axes[0].get_title()
        == f"Request states: 40 of the {alive:,} requests alive in this window"
    )
    assert len(fig.axes[0].get_yticks()) == 40
