"""The shipped KV-offload goldens (vLLM 0.33.0's OffloadingConnector, golden/offload/) load,
are self-consistent, and exercise what their README says. No vLLM needed."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from offload_golden import (
    GOLDEN,
    OffloadGolden,
    check_consistency,
    chunk_name,
    load_offload_golden,
    parse_chunk,
)

FILES = sorted(GOLDEN.glob("*.steps.jsonl.gz"))


def test_the_goldens_ship() -> None:
    names = {p.name.removesuffix(".steps.jsonl.gz") for p in FILES}
    assert names == {
        "handmade",
        "mooncake_lru",
        "mooncake_arc",
        "mooncake_chunk4",
        "handmade_disk",
        "mooncake_disk",
    }


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.split(".")[0])
def test_golden_is_self_consistent(path: Path) -> None:
    golden = load_offload_golden(path)
    assert golden.steps and golden.summary["num_unfinished"] == 0
    assert check_consistency(golden) == []
    trace = GOLDEN / golden.config["trace"]
    with trace.open() as f:
        assert golden.config["num_requests"] == sum(1 for line in f if line.strip())


def test_chunk_names_round_trip() -> None:
    assert parse_chunk("r12:3") == ("r12", 3)
    assert parse_chunk("a:b:7") == ("a:b", 7)
    assert chunk_name(*parse_chunk("r0:15")) == "r0:15"


@pytest.fixture(scope="module")
def handmade() -> OffloadGolden:
    return load_offload_golden(GOLDEN / "handmade.steps.jsonl.gz")


def test_handmade_exercises_its_documented_cases(handmade: OffloadGolden) -> None:
    steps = handmade.steps
    loads = [(s, j) for s in steps for j in s.load_jobs]
    assert loads and all(s.waiting_for_kv for s, _ in loads)
    assert any(s.cpu_evicted for s in steps)
    reasons = {r for s in steps for r in s.kv_lookup_delayed.values()}
    assert reasons == {"chunks_being_loaded", "store_pending"}
    preempt_flush = [s for s in steps if s.jobs_to_flush and s.raw["preempted"]]
    realloc_flush = [s for s in steps if s.jobs_to_flush and not s.raw["preempted"]]
    assert preempt_flush and realloc_flush
    assert all(s.forward_start_s > s.start_s for s in preempt_flush + realloc_flush)
    # r8's prompt is exactly the 8 chunks of S: 7 blocks from the GPU cache (a local hit
    # stops at prompt - 1 tokens), the 8th loaded, then the last token recomputed
    (s8,) = [s for s in steps if "r8" in s.external_hit_tokens]
    assert (s8.local_hit_tokens["r8"], s8.external_hit_tokens["r8"]) == (112, 16)
    assert [s.raw["new"]["r8"] for s in steps if "r8" in s.raw["new"]] == [127]
    # a load after a partial local hit: r5 finds 3 of r2's blocks on the GPU, loads 5
    (s5,) = [s for s in steps if "r5" in s.external_hit_tokens]
    assert (s5.local_hit_tokens["r5"], s5.external_hit_tokens["r5"]) == (48, 80)


def test_policies_decide_differently() -> None:
    lru = load_offload_golden(GOLDEN / "mooncake_lru.steps.jsonl.gz")
    arc = load_offload_golden(GOLDEN / "mooncake_arc.steps.jsonl.gz")
    assert lru.config["offload"]["policy_cls"] == "LRUCachePolicy"
    assert arc.config["offload"]["policy_cls"] == "ARCCachePolicy"
    assert [s.cpu_evicted for s in lru.steps] != [s.cpu_evicted for s in arc.steps]


def test_checker_flags_a_load_of_a_chunk_never_stored(handmade: OffloadGolden) -> None:
    broken = copy.deepcopy(handmade)
    load_step = next(s for s in broken.steps if s.load_jobs)
    chunk = load_step.load_jobs[0].chunks[0]
    for s in broken.steps:
        if chunk in s.cpu_added:
            s.cpu_added.discard(chunk)
            break
    problems = check_consistency(broken)
    assert any("not ready" in p for p in problems), problems


def test_checker_flags_a_completion_never_issued(handmade: OffloadGolden) -> None:
    broken = copy.deepcopy(handmade)
    broken.steps[-1].completed_jobs.append(10_000)
    assert any("never issued" in p for p in check_consistency(broken))


def test_checker_flags_a_tier_over_capacity(handmade: OffloadGolden) -> None:
    broken = copy.deepcopy(handmade)
    broken.config = json.loads(json.dumps(broken.config))
    broken.config["offload"]["num_cpu_chunks"] = 10
    assert any("tier holds" in p for p in check_consistency(broken))


def replay_clock(golden: OffloadGolden) -> list[str]:
    """Re-derive every step's forward start and reported completions from the recorded jobs
    with the spec's transfer model (the driver's pure-Python transfer_model.Link): stores
    submitted at the next step's start (flushed ones at their own step's start), loads at the
    forward's start, completions reported by the step's end. Returns the mismatches."""
    path = GOLDEN.parents[3] / "benchmarks" / "vllm_reference" / "transfer_model.py"
    spec = importlib.util.spec_from_file_location("transfer_model", path)
    assert spec is not None and spec.loader is not None
    transfer_model = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("transfer_model", transfer_model)  # its dataclasses look it up
    spec.loader.exec_module(transfer_model)
    Link = transfer_model.Link
    off = golden.config["offload"]
    link = Link(off["read_bytes_per_s"], off["write_bytes_per_s"], off["link_latency_s"])
    nbytes = int(off["kv_bytes_per_block"])
    deferred: list[tuple[int, int]] = []
    problems = []
    for s in golden.steps:
        flush = set(s.jobs_to_flush)
        for job, blocks in deferred:
            link.submit(job, "write", blocks * nbytes, s.start_s)
        deferred = []
        for j in s.store_jobs:
            if j.job in flush:
                link.submit(j.job, "write", j.gpu_blocks * nbytes, s.start_s)
            else:
                deferred.append((j.job, j.gpu_blocks))
        forward = max(link.wait(flush), s.start_s) if flush else s.start_s
        if abs(forward - s.forward_start_s) > 1e-8:
            problems.append(f"step {s.step}: forward at {forward}, golden {s.forward_start_s}")
        for j in s.load_jobs:
            link.submit(j.job, "read", j.gpu_blocks * nbytes, forward)
        if s.num_scheduled_tokens:
            end = forward + float(s.raw["dt"])
            if abs(end - s.end_s) > 1e-8:
                problems.append(f"step {s.step}: ends at {end}, golden {s.end_s}")
        # vLLM polls right after launching the forward; a step without tokens at its end
        poll = forward if s.num_scheduled_tokens else s.end_s
        done = sorted(j.job_id for j in link.collect(poll + 1e-9))
        if done != sorted(s.completed_jobs):
            problems.append(f"step {s.step}: completes {done}, golden {s.completed_jobs}")
    return problems


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.split(".")[0])
def test_recorded_times_follow_the_transfer_model(path: Path) -> None:
    assert replay_clock(load_offload_golden(path)) == []


def test_clock_replay_flags_a_completion_reported_late(handmade: OffloadGolden) -> None:
    broken = copy.deepcopy(handmade)
    i = next(i for i, s in enumerate(broken.steps) if s.completed_jobs)
    job = broken.steps[i].completed_jobs.pop(0)
    broken.steps[i + 1].completed_jobs.append(job)
    assert len(replay_clock(broken)) >= 2
