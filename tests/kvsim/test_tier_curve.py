"""Two-tier (GPU + CPU) cache curves: kvsim.analysis.tier_curve and ``kvsim cache-curve --tiers``.

The one-pass grid is checked against a plain replay with two explicit LRU lists written here
(a GPU prefix cache, and a CPU tier fed every prompt block, extending the GPU hit); the
block-by-block replay of vLLM's rule (a request that loads does not touch its GPU-hit chunks
in the CPU tier) against the same lists with that rule; both against the optimal bound, the
1-D curve, and traces whose numbers are worked out by hand in the comments.
"""

from __future__ import annotations

import csv
import math
from collections import OrderedDict
from pathlib import Path

import pytest
from cache_curve_replays import block_keys, small_traces
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner, Result

from kvsim.analysis.cache_curve import cache_curve
from kvsim.analysis.tier_curve import TIER_COLUMNS, replay_tiers, tier_curve
from kvsim.cli import app
from kvsim.commands.tiers import TierSpecError, parse_tiers
from workloads import Request, Trace, load_trace, shipped_trace_path

INF = math.inf
SAMPLE = "mooncake_fast25_conversation_first_1000"


def replay_two_lists(trace: Trace, block_size: int, gpu: float, cpu: float, *, vllm: bool) -> int:
    """Hit blocks of a GPU LRU list plus a CPU LRU list, block by block. Each request hits
    its GPU prefix (capped at (prompt - 1) // b), then the consecutive blocks after it that
    the CPU list holds (up to its last full block); the GPU list takes all its blocks, the CPU
    list all of them too, or with ``vllm`` only those from the GPU hit on when it loaded."""
    gpu_list: OrderedDict[object, None] = OrderedDict()
    cpu_list: OrderedDict[object, None] = OrderedDict()
    total = 0
    for request in trace.requests:
        keys, lookup = block_keys(request, trace.hash_block_size or 1, block_size)
        hit = 0
        while hit < lookup and keys[hit] in gpu_list:
            hit += 1
        run = hit
        while cpu and run < len(keys) and keys[run] in cpu_list:
            run += 1
        total += run
        for key in reversed(keys):
            gpu_list[key] = None
            gpu_list.move_to_end(key)
        while len(gpu_list) > gpu:
            gpu_list.popitem(last=False)
        for key in reversed(keys[hit if vllm and run > hit else 0 :]):
            cpu_list[key] = None
            cpu_list.move_to_end(key)
        while len(cpu_list) > cpu:
            cpu_list.popitem(last=False)
    return total


GPU = [0, 1, 2, 3, 5, 8, INF]
CPU = [0, 1, 2, 4, 7, 12, INF]


@settings(max_examples=40, deadline=None)
@given(trace=small_traces(), block_size=st.sampled_from([1, 2, 3, 4, 8]))
def test_grid_equals_two_lru_lists_and_stays_under_the_optimal_bound(
    trace: Trace, block_size: int
) -> None:
    check_grid(trace, block_size)


@pytest.mark.slow  # the full-strength twin of the test above
@settings(max_examples=150, deadline=None)
@given(trace=small_traces(), block_size=st.sampled_from([1, 2, 3, 4, 8]))
def test_grid_equals_two_lru_lists_and_stays_under_the_optimal_bound_slow(
    trace: Trace, block_size: int
) -> None:
    check_grid(trace, block_size)


def check_grid(trace: Trace, block_size: int) -> None:
    curve = tier_curve(trace, GPU, CPU, block_size)
    one_tier = cache_curve(trace, block_size, [g * block_size for g in GPU[1:]])  # tokens
    lru_1d = [0] + [r["hit_tokens"] for r in one_tier.rows if r["policy"] == "lru"]
    opt_1d = [0] + [r["hit_tokens"] for r in one_tier.rows if r["policy"] == "optimal"]
    total = curve.gpu_hit_blocks + curve.cpu_hit_blocks
    for i, g in enumerate(GPU):
        # No CPU tier: exactly the 1-D curve (LRU and optimal) at the GPU's capacity.
        assert total[i, 0] * block_size == lru_1d[i]
        assert curve.optimal_blocks[i, 0] * block_size == opt_1d[i]
        for j, c in enumerate(CPU):
            assert total[i, j] == replay_two_lists(trace, block_size, g, c, vllm=False)
            replayed = replay_tiers(trace, g, c, block_size)
            assert replayed.total_blocks == replay_two_lists(trace, block_size, g, c, vllm=True)
            assert replayed.gpu_blocks == curve.gpu_hit_blocks[i, j]
            # Two tiers hold at most g + c blocks: no policy beats Belady's for that many.
            assert curve.optimal_blocks[i, j] >= max(total[i, j], replayed.total_blocks)
            # More capacity in either tier never hits less.
            if i:
                assert total[i, j] >= total[i - 1, j]
                assert curve.optimal_blocks[i, j] >= curve.optimal_blocks[i - 1, j]
            if j:
                assert total[i, j] >= total[i, j - 1]
                assert curve.optimal_blocks[i, j] >= curve.optimal_blocks[i, j - 1]


def trace_of(hash_block: int, *prompts: tuple[int, list[int]]) -> Trace:
    requests = [
        Request(
            request_id=str(i),
            arrival_time_s=float(i),
            prompt_tokens=p,
            output_tokens=1,
            hash_ids=tuple(ids),
        )
        for i, (p, ids) in enumerate(prompts)
    ]
    return Trace(name="hand", hash_block_size=hash_block, requests=requests)


def test_a_hand_made_trace_gives_the_numbers_worked_out_by_hand() -> None:
    # 1-token blocks; R0 = A B C, R1 = D E, R2 = A B C (query 3 + 2 + 3 = 8 tokens). The GPU
    # never serves a prompt's last token (it may hit A B of R2), the CPU may (all of it).
    trace = trace_of(1, (3, [1, 2, 3]), (2, [4, 5]), (3, [1, 2, 3]))
    curve = tier_curve(trace, [2, 3], [0, 4, 5], 1)
    # GPU of 2: B A after R0 (head last), E D after R1: R2 hits nothing on the GPU. A CPU of
    # 4 held C B A, then (R1 stored E D) B A E D: R2 loads A and B, not C. A CPU of 5 still
    # holds C: R2 loads all three.
    assert curve.gpu_hit_blocks[0].tolist() == [0, 0, 0]
    assert curve.cpu_hit_blocks[0].tolist() == [0, 2, 3]
    assert curve.hit_rate()[0].tolist() == [0, 2 / 8, 3 / 8]
    # GPU of 3 holds A E D before R2: it hits A there; the CPU of 4 adds B, that of 5 B C.
    assert curve.gpu_hit_blocks[1].tolist() == [1, 1, 1]
    assert curve.cpu_hit_blocks[1].tolist() == [0, 1, 2]
    # Optimal: without a CPU tier, keep A B through R1 (D E never come back), and the GPU
    # may hit only those two; with one, 2 + 4 blocks or more keep all 5 and R2 hits A B C.
    assert curve.optimal_blocks.tolist() == [[2, 3, 3], [2, 3, 3]]


def test_a_cpu_tier_smaller_than_the_gpu_adds_only_the_last_block_the_gpu_may_not_hit() -> None:
    # 4-token blocks, prompts of exactly two blocks: the GPU never serves the last prompt
    # token, so it hits 1 block; the CPU lookup runs to the prompt's end (vLLM loads it and
    # recomputes the last token). The CPU tier must hold both blocks: one chunk holds only
    # the head, the most recently used.
    trace = trace_of(4, (8, [1, 2]), (8, [1, 2]))
    curve = tier_curve(trace, [INF], [0, 1, 2], 4)
    assert (curve.gpu_hit_blocks + curve.cpu_hit_blocks).tolist() == [[1, 1, 2]]


def test_on_the_mooncake_sample_a_cpu_tier_no_larger_than_the_gpu_adds_next_to_nothing() -> None:
    trace = load_trace(shipped_trace_path(SAMPLE))
    gpu = [2_000, 20_000, 60_000]
    curve = tier_curve(trace, gpu, [0, 1_000, 2_000, 20_000, 60_000, 200_000], 16)
    # Inclusive tiers hold the same blocks: a CPU tier up to the GPU's size adds at most the
    # last block of the prompts that end on a block boundary, which the GPU may not hit.
    aligned = sum(r.prompt_tokens % 16 == 0 for r in trace.requests)
    rate = curve.hit_rate()
    for i, g in enumerate(gpu):
        for j, c in enumerate(curve.cpu_blocks):
            if c <= g:
                assert curve.cpu_hit_blocks[i, j] <= aligned
                assert rate[i, j] - rate[i, 0] < 0.001
    # A CPU tier beyond the GPU's adds what a GPU of that size would hit.
    assert rate[0, 4] == pytest.approx(rate[2, 0], abs=0.001)
    assert rate[0, 5] > rate[2, 0] + 0.01


def test_vllm_rule_a_loading_request_does_not_refresh_its_gpu_hit_in_the_cpu() -> None:
    # 1-token blocks, GPU of 1 block, CPU of 2 chunks. R0 = a b (prompt 2): the GPU keeps
    # a; the CPU, fed both, holds b a. R1 = a b c: GPU hit a, then it loads b from the CPU.
    # vLLM stores from the loaded chunk on, so the CPU sees c b (not a): it evicts a. R2 = a
    # (prompt 1: the GPU may not hit it, the CPU may) then misses. Query 2 + 3 + 1 = 6.
    trace = trace_of(1, (2, [0, 2]), (3, [0, 2, 1]), (1, [0]))
    assert replay_tiers(trace, 1, 2, 1).total_blocks == 2
    # The one-pass model refreshes every prompt block in the CPU tier: R2 finds a there.
    curve = tier_curve(trace, [1], [2], 1)
    assert curve.gpu_hit_blocks[0, 0] + curve.cpu_hit_blocks[0, 0] == 3


# ---------------------------------------------------------------- the --tiers spec


def test_tier_spec_takes_tokens_blocks_and_bytes() -> None:
    tiers = parse_tiers("gpu:1e5,30000blocks,inf,cpu:0,64GiB,1.5TB")
    assert [(c.value, c.unit) for c in tiers["gpu"]] == [
        (1e5, "tokens"), (30000, "blocks"), (INF, "tokens")]  # fmt: skip
    assert [(c.value, c.unit) for c in tiers["cpu"]] == [
        (0, "tokens"), (64 * 2**30, "bytes"), (1.5e12, "bytes")]  # fmt: skip
    # 16-token blocks of 2 MiB: 64 GiB holds 32,768 of them.
    assert tiers["cpu"][1].blocks(16, 2 * 2**20) == 32_768
    assert tiers["gpu"][0].blocks(16, 2 * 2**20) == 6_250


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("1e5,cpu:0", "names no tier"),
        ("gpu:1e5", "no cpu tier"),
        ("gpu:1e5,disk:1TiB,cpu:0", "unknown tier 'disk'"),
        ("gpu:1e5,gpu:2e5,cpu:0", "given twice"),
        ("gpu:1e5,,cpu:0", "empty gpu capacity"),
        ("gpu:1e5,cpu:-1", "must be >= 0"),
        ("gpu:12 parsecs,cpu:0", "not a number of tokens"),
        ("gpu:1e400,cpu:0", "too large"),
    ],
)
def test_bad_tier_specs_are_refused(spec: str, fragment: str) -> None:
    with pytest.raises(TierSpecError, match=fragment):
        parse_tiers(spec)


# ---------------------------------------------------------------- kvsim cache-curve --tiers


def kvsim(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_writes_tiers_csv_and_png_with_the_pool_and_cpu_size_marked(tmp_path: Path) -> None:
    out = tmp_path / "tiers"
    args = ["cache-curve", SAMPLE, "--block-size", "16", "--model", "llama-3.1-8b",
            "--tiers", "gpu:0,1000blocks,3000blocks,inf,cpu:0,2GiB,8GiB,inf",
            "--num-blocks", "2000", "--kv-offloading-size", "8", "--out", out]  # fmt: skip
    result = kvsim(*args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "kvsim-manifest.json", "tiers.csv", "tiers.png"]  # fmt: skip
    with open(out / "tiers.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == TIER_COLUMNS
    # llama-3.1-8b: 131,072 bytes a token, 2 MiB a 16-token block: 2 GiB = 1,024 chunks.
    assert [(r["gpu_capacity_blocks"], r["cpu_capacity_blocks"]) for r in rows[:4]] == [
        ("0", "0"), ("0", "1024"), ("0", "4096"), ("0", "inf")]  # fmt: skip
    assert rows[5]["gpu_capacity_tokens"] == "16000"
    assert rows[5]["cpu_capacity_bytes"] == str(2 * 2**30)
    trace = load_trace(shipped_trace_path(SAMPLE))
    curve = tier_curve(trace, [0, 1000, 3000, INF], [0, 1024, 4096, INF], 16)
    assert [float(r["hit_rate"]) for r in rows] == curve.hit_rate().ravel().tolist()
    for r in rows:
        assert int(r["hit_tokens"]) == int(r["gpu_hit_tokens"]) + int(r["cpu_hit_tokens"])
        assert float(r["optimal_hit_rate"]) >= float(r["hit_rate"])
    with Image.open(out / "tiers.png") as image:
        assert image.width > 600 and image.height > 300
    # The marked point, GPU pool 2,000 blocks + 8 GiB (4,096 chunks), is computed exactly.
    both = curve.hits_at(2000, 4096)
    alone = curve.hits_at(2000, 0)
    query = curve.query_tokens
    assert f"LRU {100 * alone.total_blocks * 16 / query:.2f}%" in result.output
    assert f"LRU {100 * both.total_blocks * 16 / query:.2f}%" in result.output
    assert "CPU tier of 8 GiB (4,096 chunks)" in result.output
    # The same folder kind as curve.csv: --force replaces it, and only with --force.
    again = kvsim(*args)
    assert again.exit_code == 2 and "--force" in again.stderr
    assert kvsim(*args, "--force").exit_code == 0


def assert_one_error_line(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--tiers", "gpu:1e5"], ["--tiers", "no cpu tier"]),
        (["--tiers", "gpu:1e5,cpu:lots"], ["--tiers", "'lots'"]),
        (["--tiers", "gpu:16000,1000blocks,cpu:0"], ["16000 and 1000blocks", "1,000 blocks"]),
        (["--tiers", "gpu:1e5,cpu:0", "--capacity-tokens", "1e5"], ["cannot be combined"]),
        (["--kv-offloading-size", "64"], ["needs --tiers"]),
        (["--tiers", "gpu:1e5,cpu:0", "--kv-offloading-size", "-1"], ["--kv-offloading-size"]),
        (["--tiers", "gpu:1e5,cpu:0", "--num-blocks", "0"], ["--num-blocks"]),
        (["--tiers", "gpu:1e5,cpu:0", "--block-size", "0"], ["block size"]),
    ],
)
def test_cli_bad_tiers_input_is_one_line_and_exit_2(args: list[str], fragments: list[str]) -> None:
    assert_one_error_line(kvsim("cache-curve", SAMPLE, "--block-size", "16", *args), *fragments)


def test_cli_num_blocks_gives_the_pool_of_the_one_tier_curve_too() -> None:
    result = kvsim("cache-curve", SAMPLE, "--capacity-tokens", "1e6", "--num-blocks", "100")
    assert result.exit_code == 0, result.output
    # 100 blocks of the trace's 512 tokens, instead of the pool planned from GPU memory.
    assert "GPU pool (--num-blocks): 51,200 tokens" in result.output
    assert "KV pool of" not in result.output


@pytest.mark.slow
def test_whole_mooncake_with_a_64_gib_cpu_tier_behind_30000_gpu_blocks() -> None:
    # Issue 29's acceptance point: llama-3.1-8b (2 MiB a 16-token block), GPU pool of 30,000
    # blocks, 64 GiB CPU tier = 32,768 chunks. The CPU tier, barely larger than the GPU's,
    # adds a little; the block-by-block replay with vLLM's store rule agrees.
    trace = load_trace(shipped_trace_path("mooncake_fast25_conversation"))
    curve = tier_curve(trace, [30_000], [0, 32_768], 16)
    rate = curve.hit_rate()[0]
    assert rate[0] == pytest.approx(0.0453, abs=0.0001)
    assert rate[1] == pytest.approx(0.0459, abs=0.0001)
    replayed = replay_tiers(trace, 30_000, 32_768, 16)
    assert replayed.total_blocks == curve.gpu_hit_blocks[0, 1] + curve.cpu_hit_blocks[0, 1]
