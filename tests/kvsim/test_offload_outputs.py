"""What an offloading run shows its user (docs/visualization.md, docs/metrics.md "KV
offloading"): its own pictures (none for a plain run), the Offload section of report.html, the
offload lines of the terminal summary, the tier's evictions per step, and the transfers rebuilt
from the events."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.analysis.offload_tables import loading_share, transfer_jobs, ttft_split
from kvsim.analysis.table import Table
from kvsim.outputs.run_folder import read_run
from kvsim.plots.occupancy_map import transfer_grids
from tests.kvsim.test_offload_run import MODEL, kvsim, write_trace

BASE_PICTURES = {
    "occupancy.png", "free_blocks.png", "kv_breakdown.png", "gantt.png", "latency_cdfs.png",
    "batch_size.png", "prefix_hit_rate.png", "prompt_tokens.png",
}  # fmt: skip
OFFLOAD_FILES = {
    "offload_tier.png",
    "offload_sources.png",
    "offload_ttft.png",
    "offload_transfers.png",
}
# r1 (unrelated) evicts most of r0's cached blocks from a 7-block pool; r2 repeats r0's prompt
# and loads it back from the CPU tier; r3, r4 do the same again.
PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5], [1, 2, 3, 4, 5], [11, 12, 13, 14, 15], [1, 2, 3, 4, 5]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An offloading run, the same trace without offload, and one with a 5-chunk tier."""
    tmp = tmp_path_factory.mktemp("offload_outputs")
    trace = write_trace(tmp / "t.jsonl", PROMPTS)
    out = {}
    for name, extra in (
        ("offload", ["--kv-offloading-size", "1"]),
        ("plain", []),
        ("small", ["--kv-offloading-size", "0.01", "--no-plots"]),
    ):
        out[name] = tmp / name
        result = kvsim("run", trace, *MODEL, "--num-blocks", "7", *extra, "--out", out[name])
        assert result.exit_code == 0, result.output
        (tmp / f"{name}.stdout").write_text(result.output)
    return out


def test_an_offload_run_draws_its_pictures_and_a_plain_run_none(runs: dict[str, Path]) -> None:
    offload = {p.name for p in (runs["offload"] / "plots").iterdir()}
    plain = {p.name for p in (runs["plain"] / "plots").iterdir()}
    assert offload == BASE_PICTURES | OFFLOAD_FILES
    assert plain == BASE_PICTURES
    assert "Offload" not in (runs["plain"] / "report.html").read_text()


def test_the_report_has_an_offload_section_with_the_summary_numbers(
    runs: dict[str, Path],
) -> None:
    html = (runs["offload"] / "report.html").read_text()
    s = json.loads((runs["offload"] / "summary.json").read_text())
    o = s["offload"]
    section = html[html.index("<h2>Offload</h2>") : html.index("<h2>Pictures</h2>")]
    assert o["requests_loading"] == 2
    assert f"{o['hit_rate_all_tiers']:.1%} / {s['prefix_cache_hit_rate']:.1%}" in section
    by_source = o["prompt_tokens_by_source"]
    tokens = (by_source[k] for k in ("local_compute", "local_cache_hit", "external_kv_transfer"))
    assert " / ".join(f"{n:,}" for n in tokens) in section
    assert f"{o['capacity_chunks']:,} chunks x {o['chunk_tokens']} tokens" in section
    assert f'<td class="num">{o["loads"]["jobs"]} / {o["loads"]["chunks"]} / ' in section
    # the offload pictures sit in that section, not among the others
    for name in ("offload-tier", "offload-sources", "offload-ttft", "offload-transfers"):
        assert f'alt="{name}"' in section


def test_the_terminal_summary_gives_the_offload_lines(runs: dict[str, Path]) -> None:
    stdout = (runs["offload"].parent / "offload.stdout").read_text()
    s = json.loads((runs["offload"] / "summary.json").read_text())
    o = s["offload"]
    assert f"{o['hit_rate_all_tiers']:.1%} / {s['prefix_cache_hit_rate']:.1%}" in stdout
    assert f"{o['loads']['jobs']} ({o['requests_loading']} requests loaded at first" in stdout
    requests = pd.read_parquet(runs["offload"] / "requests.parquet")
    share = loading_share(requests)
    assert share is not None and f"{share:.1%}" in stdout
    plain = (runs["offload"].parent / "plain.stdout").read_text()
    assert "all tiers" not in plain and "offload loads" not in plain


def test_the_tier_evictions_per_step_add_up_to_the_summary(runs: dict[str, Path]) -> None:
    steps = pd.read_parquet(runs["small"] / "steps.parquet")
    o = json.loads((runs["small"] / "summary.json").read_text())["offload"]
    evicted = steps["offload_tier_evictions"].to_numpy()
    assert (np.diff(evicted) >= 0).all()
    assert evicted[-1] == o["tier_evictions"] > 0
    assert steps["offload_tier_chunks"].max() <= o["capacity_chunks"] == 5
    plain = pd.read_parquet(runs["plain"] / "steps.parquet")
    assert not any(c.startswith("offload") for c in plain.columns)


def test_the_ttft_of_loading_requests_splits_into_queueing_loading_computing(
    runs: dict[str, Path],
) -> None:
    requests = pd.read_parquet(runs["offload"] / "requests.parquet")
    split = ttft_split(requests).set_index("seq_id")
    loaded = requests[requests["offload_hit_tokens"] > 0].set_index("seq_id")
    assert sorted(split.index) == sorted(loaded.index) and len(split) == 2
    total = split["queueing"] + split["loading"] + split["computing"]
    assert np.allclose(total, loaded.loc[split.index, "ttft_s"])
    assert np.allclose(split["loading"], loaded.loc[split.index, "offload_load_wait_s"])
    assert (split[["queueing", "loading", "computing"]] >= 0).all().all()
    assert loading_share(requests) == pytest.approx(split["loading"].sum() / total.sum())


def test_transfers_pair_each_blocks_issue_with_its_completion() -> None:
    rows = [  # (time_s, kind, seq_id, block_id)
        (0.0, "OFFLOAD_STORE", 0, 1), (0.0, "OFFLOAD_STORE", 0, 2),
        (0.5, "OFFLOAD_STORE_DONE", 0, 1), (0.5, "OFFLOAD_STORE_DONE", 0, 2),
        (1.0, "OFFLOAD_STORE", 1, 1), (1.0, "OFFLOAD_LOAD", 2, 3),
        (1.1, "OFFLOAD_LOAD_DONE", 2, 3), (1.2, "OFFLOAD_STORE_DONE", 1, 1),
        (1.3, "OFFLOAD_STORE", 1, 4),  # still in flight when the events stop
    ]  # fmt: skip
    events = pd.DataFrame(rows, columns=["time_s", "kind", "seq_id", "block_id"])
    jobs = transfer_jobs(events, end_s=2.0)
    got = [(j.direction, j.seq_id, j.blocks, round(j.held_s, 6)) for j in jobs.itertuples()]
    assert got == [("store", 0, 2, 0.5), ("store", 1, 1, 0.2), ("load", 2, 1, 0.1),
                   ("store", 1, 1, 0.7)]  # fmt: skip


def test_the_occupancy_map_marks_blocks_being_stored_and_loaded(runs: dict[str, Path]) -> None:
    run = read_run(runs["offload"])
    assert run.events is not None
    end = float(run.summary["sim_duration_s"])
    grids = transfer_grids(run.events, 7, 0.0, end, end_s=end)
    assert grids["store"].sum() > 0 and grids["load"].sum() > 0
    plain = read_run(runs["plain"])
    assert plain.events is not None and transfer_grids(plain.events, 7, 0.0, end) == {}


def test_kvsim_plot_redraws_an_offload_picture_and_refuses_it_on_a_plain_run(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "pics"
    result = kvsim("plot", runs["offload"], "--what", "offload-ttft", "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.glob("*.png")) == ["offload_ttft.png"]
    refused = kvsim("plot", runs["plain"], "--what", "offload-tier", "--out", tmp_path / "no")
    assert refused.exit_code == 2
    assert "no CPU tier" in refused.output


def test_the_loading_share_is_the_same_from_the_table_and_the_dataframe() -> None:
    # `kvsim run` prints it from the run's Table (no pandas); plots and notebooks from a
    # DataFrame: both give ttft_split's sums exactly, its dropped rows (no load, no first
    # token) left out alike
    nan = float("nan")
    table = Table(
        {
            "seq_id": np.arange(5),
            "offload_hit_tokens": np.array([16, 0, 32, 48, 16]),
            "arrival_time_s": np.array([0.0, 0.1, 0.2, 0.3, 0.4]),
            "offload_load_start_s": np.array([0.05, nan, 0.3, 0.35, 0.45]),
            "admit_time_s": np.array([0.25, 0.2, 0.9, 0.5, 0.6]),
            "first_token_time_s": np.array([0.4, 0.3, 1.0, nan, 0.65]),
        }
    )
    split = ttft_split(table.to_pandas())
    assert list(split["seq_id"]) == [4, 0, 2]
    share = loading_share(table)
    assert share == split["loading"].sum() / split["ttft"].sum()
    assert share == loading_share(table.to_pandas())
    no_load = Table({**table.columns, "offload_hit_tokens": np.zeros(5, dtype=np.int64)})
    assert loading_share(no_load) is None
