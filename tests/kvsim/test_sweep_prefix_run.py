"""A block size x prefix caching x capacity sweep, run: hit rates fall (or stay) as blocks grow
on a trace with shared prefixes, caching off serves nothing from the cache, and the report's
recommendation names a block size of the grid with numbers from its table."""

from __future__ import annotations

import pandas as pd
import pytest

from kvsim.config import RunConfig
from kvsim.sweep.cache_bound import hit_rate_bounds
from kvsim.sweep.compare import recommended_block_sizes
from kvsim.sweep.execute import run_sweep
from kvsim.sweep.spec import make_spec
from kvsim.sweep.table import SweepResult
from kvsim.sweep.tradeoff import share_text
from workloads import Request, Trace, save_trace

HASH_BLOCK = 16
SHARED_HASH_BLOCKS = 5  # an 80-token shared prefix: 5 blocks of 16, 2 of 32, none of 128
BLOCK_SIZES = (16, 32, 128)


def shared_prefix_trace() -> Trace:
    """30 requests of 200 prompt tokens, one a second: each starts with the same 80 tokens
    (hash ids 0-4), then its own."""
    requests = []
    for i in range(30):
        own = [1000 + 100 * i + k for k in range(8)]  # 200 tokens: 13 hash blocks, last partial
        requests.append(
            Request(
                request_id=str(i),
                arrival_time_s=float(i),
                prompt_tokens=200,
                output_tokens=8,
                hash_ids=(*range(SHARED_HASH_BLOCKS), *own),
            )
        )
    return Trace(name="shared_prefix", hash_block_size=HASH_BLOCK, requests=requests)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[SweepResult, Trace]:
    folder = tmp_path_factory.mktemp("prefix")
    trace = shared_prefix_trace()
    path = folder / "shared.jsonl"
    save_trace(trace, path)
    spec = make_spec(
        RunConfig(trace=str(path)),
        [
            ("block_size", BLOCK_SIZES),
            ("kv_slots", (4096, 65536)),
            ("enable_prefix_caching", (True, False)),
        ],
    )
    return run_sweep(spec, folder / "sweep", executor="serial"), trace


def test_hit_rate_falls_or_stays_as_blocks_grow(swept: tuple[SweepResult, Trace]) -> None:
    table = swept[0].table
    assert (table["status"] == "ok").all()
    on = table[table["enable_prefix_caching"]]
    for _, group in on.groupby("kv_slots"):
        rates = group.sort_values("block_size")["prefix_cache_hit_rate"].astype(float).tolist()
        assert rates == sorted(rates, reverse=True), rates
    # Every request after the first finds the shared blocks: 80 tokens at 16, 64 at 32 (the
    # third block reaches past the prefix), none at 128 (one block longer than the prefix).
    big = on[on["kv_slots"] == 65536].set_index("block_size")
    assert big.loc[16, "prefix_cache_hits"] == 29 * 80
    assert big.loc[32, "prefix_cache_hits"] == 29 * 64
    assert big.loc[128, "prefix_cache_hits"] == 0
    assert (big["prefix_cache_queries"] == 30 * 200).all()


def test_caching_off_serves_nothing_from_the_cache(swept: tuple[SweepResult, Trace]) -> None:
    off = swept[0].table[~swept[0].table["enable_prefix_caching"]]
    assert len(off) == len(BLOCK_SIZES) * 2
    assert (off["prefix_cache_hits"] == 0).all() and (off["prompt_tokens_cached"] == 0).all()
    assert off["prefix_cache_hit_rate"].isna().all()  # vLLM counts no queries


def test_kv_slots_are_the_same_bytes_at_every_block_size(
    swept: tuple[SweepResult, Trace],
) -> None:
    table = swept[0].table
    held = table["num_blocks"] * table["block_size"]
    assert (held <= table["kv_slots"]).all() and (table["kv_slots"] - held < 128).all()
    gib = table.groupby("kv_slots")["kv_cache_gib"]
    assert (gib.max() / gib.min() < 1.05).all()
    # smaller blocks: more block-table entries walked per step
    walk = table[table["kv_slots"] == 65536].groupby("block_size")["block_walk_s"].mean()
    assert walk.is_monotonic_decreasing and walk.iloc[0] > walk.iloc[-1]


def test_the_recommendation_names_a_grid_block_size_with_table_numbers(
    swept: tuple[SweepResult, Trace],
) -> None:
    result, _ = swept
    lines = recommended_block_sizes(result.table, result.spec)
    assert len(lines) == 4  # one per capacity x caching
    for line in lines:
        size = int(line.split("recommended block size ")[1].split(":")[0])
        assert size in BLOCK_SIZES
        slots = int(line.split("kv_slots=")[1].split(",")[0])
        caching = "enable_prefix_caching=true" in line
        t = result.table
        pick = t[
            (t["kv_slots"] == slots)
            & (t["block_size"] == size)
            & (t["enable_prefix_caching"] == caching)
        ].iloc[0]
        if size != BLOCK_SIZES[0]:  # against the next smaller block: its walk share and ours
            assert f"of busy time vs {share_text(pick['block_walk_share'])}" in line, line
        if caching and size != BLOCK_SIZES[-1]:
            assert f"vs {pick['prefix_cache_hit_rate']:.1%}" in line, line
    report = (result.path / "report.md").read_text()
    assert all(line in report for line in lines)
    assert (result.path / "plots" / "prefix_cache.png").is_file()


def test_simulated_hit_rates_sit_on_or_below_the_lru_curve(
    swept: tuple[SweepResult, Trace],
) -> None:
    table, trace = swept[0].table, swept[1]
    bounds = hit_rate_bounds(table, trace)
    assert len(bounds) == len(BLOCK_SIZES) * 2  # the points with caching on
    assert (bounds["optimal_hit_rate"] >= bounds["lru_hit_rate"] - 1e-12).all()
    # one request at a time, arrivals a second apart: nothing crowds the big pool
    big = bounds[bounds["kv_slots"] == 65536]
    pd.testing.assert_series_equal(
        big["prefix_cache_hit_rate"].astype(float),
        big["lru_hit_rate"].astype(float),
        check_names=False,
    )
    assert (bounds["prefix_cache_hit_rate"] <= bounds["lru_hit_rate"] + 1e-12).all()
