"""`kvsim run --allocator`: the KV memory breakdown of paged and contiguous allocators.

Every slot is in exactly one class at every step; oracle wastes only buddy rounding; max
reserves max_model_len; paging wastes less than a block per sequence.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.contiguous.buddy import order_of
from kvsim.analysis.kv_breakdown import COLUMNS, SUMMARY_FIELDS
from kvsim.cli import app
from kvsim.config import RunConfig
from kvsim.costmodel import CostModel, resolve_gpu, resolve_model
from kvsim.option_spec import ConfigError
from kvsim.runner import RunResult, run, simulate
from kvsim.sim.allocators import ContiguousCostExecutor
from tests.kvsim.conftest import ToyExecutor
from workloads import DEFAULT_TRACE_NAME, Request, Trace

ALLOCATORS = ("paged", "max", "pow2", "oracle")


def toy_run(
    lengths: list[tuple[float, int, int]],
    allocator: str,
    *,
    num_blocks: int = 64,
    block_size: int = 16,
    max_model_len: int | None = 256,
    max_num_seqs: int = 8,
) -> RunResult:
    """``lengths``: (arrival_s, prompt, output) per request, through the ToyExecutor."""
    requests = [
        Request(request_id=f"r{i}", arrival_time_s=a, prompt_tokens=p, output_tokens=o)
        for i, (a, p, o) in enumerate(lengths)
    ]
    trace = Trace(name="toy", hash_block_size=None, requests=requests)
    config = RunConfig(
        trace="toy",
        block_size=block_size,
        num_blocks=num_blocks,
        watermark=0.0,
        max_num_seqs=max_num_seqs,
        allocator=allocator,
        scheduler="classic",  # the paper's comparison: paging and contiguous, 2023 scheduler
    )
    return simulate(config, trace, num_blocks, max_model_len, ToyExecutor(), {})


LENGTHS = [(0.0, 37, 20), (0.0, 5, 3), (0.5, 100, 60), (1.0, 17, 33), (1.0, 64, 64), (2.0, 9, 1)]


@pytest.fixture(scope="module")
def default_runs() -> dict[str, RunResult]:
    return {
        a: run(RunConfig(trace=DEFAULT_TRACE_NAME, allocator=a, scheduler="classic"))
        for a in ALLOCATORS
    }


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_breakdown_sums_to_every_slot_at_every_step(
    default_runs: dict[str, RunResult], allocator: str
) -> None:
    r = default_runs[allocator]
    steps = r.steps
    total = r.summary["num_blocks"] * r.summary["block_size"]
    parts = steps[list(COLUMNS)].to_numpy()
    assert (parts >= 0).all()
    assert (parts.sum(axis=1) == total).all()
    shares = [r.summary[f] for f in SUMMARY_FIELDS]
    assert sum(shares) == pytest.approx(1.0, abs=1e-9)
    assert all(0 <= s <= 1 for s in shares)
    assert r.summary["kv_token_state_share_mean"] > 0.05


def test_every_allocator_gets_the_same_kv_memory(default_runs: dict[str, RunResult]) -> None:
    slots = {a: r.summary["num_blocks"] * r.summary["block_size"] for a, r in default_runs.items()}
    assert len(set(slots.values())) == 1, slots
    paged = default_runs["paged"].summary
    assert default_runs["max"].summary["block_size"] == 1  # contiguous: slot granularity
    assert slots["max"] == paged["num_blocks"] * paged["block_size"]


def test_contiguous_reservations_waste_more_than_paging(default_runs: dict[str, RunResult]) -> None:
    # The vLLM paper's Fig. 2: the share of KV memory holding token states, paging first
    # (OPT-13B: vLLM 96.3%, Orca oracle 38.2%, pow2 26.8%, max 20.4%).
    share = {a: r.summary["kv_token_state_share_mean"] for a, r in default_runs.items()}
    waste = {
        a: r.summary["kv_internal_frag_share_mean"] + r.summary["kv_reservation_share_mean"]
        for a, r in default_runs.items()
    }
    assert share["paged"] > share["oracle"] >= share["pow2"] > share["max"]
    assert waste["max"] > waste["pow2"] >= waste["oracle"] > waste["paged"]
    assert default_runs["paged"].summary["kv_external_frag_share_mean"] == 0.0


def test_paging_batches_more_requests_than_contiguous_reservations(
    default_runs: dict[str, RunResult],
) -> None:
    # The vLLM paper's Fig. 13: with the same KV memory, paging batches the most requests, then
    # Orca's oracle, pow2 and max reservations (OPT-13B; vLLM several times Orca (Max)).
    batch = {a: r.summary["mean_batch_size"] for a, r in default_runs.items()}
    assert batch["paged"] > batch["oracle"] >= batch["pow2"] > batch["max"], batch
    assert batch["paged"] > 2 * batch["max"], batch


def test_oracle_has_no_internal_fragmentation_beyond_buddy_rounding() -> None:
    # Every prompt + output is a power of two: the buddy rounds nothing.
    exact = [(0.0, 24, 8), (0.0, 60, 4), (0.5, 1, 15), (1.0, 100, 28), (1.0, 2, 2)]
    r = toy_run(exact, "oracle", num_blocks=32)
    assert (r.steps["internal_frag_slots"] == 0).all()
    assert r.steps["reserved_slots"].max() > 0
    # Otherwise internal fragmentation is exactly the rounding of the live regions.
    r = toy_run(LENGTHS, "oracle", num_blocks=32)
    rounding = {i: (1 << order_of(p + o)) - (p + o) for i, (_, p, o) in enumerate(LENGTHS)}
    assert r.steps["internal_frag_slots"].tolist() == expected_per_step(r, rounding)


def expected_per_step(r: RunResult, per_seq: dict[int, int]) -> list[int]:
    """Σ per_seq over the sequences holding memory at each step, replayed from the events."""
    ev = r.events  # contiguous allocators: one row per event (a region is one id)
    live: set[int] = set()
    out = []
    for kind, seq_id in zip(ev["kind"].astype(str), ev["seq_id"]):
        if kind == "ALLOCATE":
            live.add(int(seq_id))
        elif kind == "FREE":
            live.discard(int(seq_id))
        elif kind == "STEP":
            out.append(sum(per_seq[s] for s in live))
    return out[: len(r.steps)]


def test_max_reserves_max_model_len_slots() -> None:
    r = toy_run(LENGTHS, "max", num_blocks=64, max_model_len=256)
    ev = r.events
    free_before = np.concatenate([[64 * 16], ev["free_blocks"].to_numpy()[:-1]])
    taken = (free_before - ev["free_blocks"].to_numpy())[(ev["kind"] == "ALLOCATE").to_numpy()]
    assert taken.tolist() == [256] * len(LENGTHS)
    # max_model_len 200: 200 reserved, the buddy block is 256, a sequence uses prompt + output.
    r = toy_run(LENGTHS, "max", num_blocks=64, max_model_len=200)
    waste = {i: 256 - (p + o) for i, (_, p, o) in enumerate(LENGTHS)}
    assert r.steps["internal_frag_slots"].tolist() == expected_per_step(r, waste)


@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
def test_paged_internal_fragmentation_is_below_a_block_per_sequence(block_size: int) -> None:
    r = toy_run(LENGTHS, "paged", num_blocks=4096 // block_size, block_size=block_size)
    steps = r.steps
    assert (steps["internal_frag_slots"] <= (block_size - 1) * steps["num_running"]).all()
    assert (steps["external_frag_slots"] == 0).all()
    # The unfilled tail of a last block counts as reservation while the sequence will fill it.
    unfilled = steps["allocated_slots"] - steps["filled_slots"]
    assert (steps["reserved_slots"] + steps["internal_frag_slots"] == unfilled).all()
    if block_size == 1:
        assert (steps["internal_frag_slots"] == 0).all()


def test_external_fragmentation_counts_holes_too_small_for_the_waiting_head() -> None:
    # 64 slots; oracle reservations 30 -> 32 (a), 8 (b), 16 (c) and 32 (d, which waits).
    lengths = [(0.0, 20, 10), (0.0, 4, 4), (0.0, 10, 6), (0.0, 20, 12)]
    r = toy_run(lengths, "oracle", num_blocks=4, block_size=16, max_model_len=None)
    steps = r.steps
    first = steps.iloc[0]
    # a at 0 (32), b at 32 (8), c at 48 (16); 8 free slots at 40 are too small for d's 32.
    assert first["allocated_slots"] == 56
    assert first["external_frag_slots"] == 8 and first["free_slots"] == 0


def test_contiguous_cost_charges_one_block_table_entry_per_sequence() -> None:
    cm = CostModel(resolve_model("llama-2-7b"), resolve_gpu("a100-80gb"))
    ex = ContiguousCostExecutor(cm)
    assert ex.decode_step_time(10, 5000, 99_999) == cm.step_time_of(10, 10, 10, 5000, 0, 0, 0, 10)
    assert ex.decode_step_timer()(10, 5000, 99_999) == cm.step_time_of(
        10, 10, 10, 5000, 0, 0, 0, 10
    )


def test_a_contiguous_run_is_charged_per_sequence_through_execute() -> None:
    # What the simulator calls each step: a decode step of a max-reservation run walks one
    # block-table entry per sequence, not one per reserved slot.
    from engine import SamplingParams, SchedulerConfig, Sequence
    from engine.fast.decode import FastDecodeScheduler
    from kvsim.sim.allocators import build_allocator

    cm = CostModel(resolve_model("llama-2-7b"), resolve_gpu("a100-80gb"))
    alloc = build_allocator("max", 64, 16, 0.0, 256)
    sched = FastDecodeScheduler(SchedulerConfig(max_model_len=256), alloc)
    for i in range(3):
        sched.add_request(Sequence(i, range(20), SamplingParams(max_tokens=5, ignore_eos=True)))
    ex = ContiguousCostExecutor(cm)
    sched.update(sched.schedule(), [0, 0, 0])  # prefill
    out = sched.schedule()  # decode of 3 sequences holding 3 x 256 reserved slots
    dt, tokens = ex.execute(out, sched)
    assert tokens == [0, 0, 0]
    assert dt == cm.step_time_of(3, 3, 3, sched.num_cached_tokens + 3, 0, 0, 0, 3)


def test_config_rejects_unknown_allocators_and_contiguous_engine_mode() -> None:
    with pytest.raises(ConfigError, match="allocator must be one of"):
        RunConfig(trace="t", allocator="slab")
    with pytest.raises(ConfigError, match="cost mode only"):
        RunConfig(trace="t", allocator="max", mode="engine")


def test_cli_run_allocator_writes_the_breakdown(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["run", "--allocator", "pow2", "--no-plots", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["allocator"] == "pow2"
    assert sum(summary[f] for f in SUMMARY_FIELDS) == pytest.approx(1.0)
    assert summary["kv_external_frag_share_mean"] > 0


@pytest.mark.parametrize("allocator", ["paged", "oracle"])
def test_breakdown_means_use_the_summary_weights_even_when_until_cuts_a_step(
    allocator: str,
) -> None:
    r = run(
        RunConfig(trace=DEFAULT_TRACE_NAME, allocator=allocator, until=30.3, scheduler="classic")
    )
    s = r.summary
    held = s["kv_token_state_share_mean"] + s["kv_reservation_share_mean"]
    held += s["kv_internal_frag_share_mean"]
    assert held == pytest.approx(s["kv_usage_mean"], rel=1e-9)
    assert s["kv_reservation_share_mean"] + s["kv_internal_frag_share_mean"] == pytest.approx(
        s["internal_fragmentation_mean"], rel=1e-9
    )
