"""kvsim's v1 scheduler makes vLLM 0.33.0's decisions, step for step.

Each golden file (golden/v1/, recorded with vLLM's own Scheduler and KVCacheManager; see
golden/v1/README.md) is replayed through kvsim with the reference's logical clock, and every
non-empty step is compared: tokens per request in batch order, preemptions, new and resumed
requests with their prefix-cache hits, finished requests, free blocks before and after
scheduling and after the update, block ids of admitted requests and of appended blocks
(kvsim id = vLLM id - 1), and the running / waiting counts.
"""

from __future__ import annotations

import pytest
from v1_replay import GOLDEN, load_golden, replay

NAMES = sorted(p.name.removesuffix(".steps.jsonl.gz") for p in GOLDEN.glob("*.steps.jsonl.gz"))


def test_goldens_cover_the_issue_configs() -> None:
    assert {
        "pressure",
        "prefix_tokens",
        "prefix_hash_ids",
        "block_size_1",
        "block_size_64",
        "long_prefill",
        "priority",
        "no_chunked_prefill",
        "no_caching",
        "mooncake",
    } <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_replay_matches_vllm_every_step(name: str) -> None:
    _, steps, summary = load_golden(GOLDEN / f"{name}.steps.jsonl.gz")
    result = replay(name)
    assert result.differences == []
    assert (
        result.steps_compared
        == summary["nonempty_steps"]
        == sum(1 for s in steps if s["num_scheduled_tokens"])
    )
    result.scheduler.block_manager.check_invariants()
    assert not result.scheduler.has_unfinished()


def test_goldens_exercise_what_they_are_for() -> None:
    """The configs really preempt, hit the prefix cache, resume with hits."""
    summaries = {name: load_golden(GOLDEN / f"{name}.steps.jsonl.gz")[2] for name in NAMES}
    assert all(summaries[n]["total_preemptions"] > 0 for n in ("pressure", "priority"))
    assert summaries["prefix_hash_ids"]["prefix_hit_rate"] > 0.3
    assert summaries["no_caching"]["prefix_hit_rate"] == 0
    assert sum(s["vllm_preempted_hits"] for s in summaries.values()) > 0
