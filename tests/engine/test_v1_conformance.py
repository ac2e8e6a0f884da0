"""kvsim's v1 scheduler makes vLLM 0.33.0's decisions, step for step, on both paths.

Each golden file (golden/v1/, recorded with vLLM's own Scheduler and KVCacheManager; see
golden/v1/README.md) is replayed through kvsim with the reference's logical clock, and every
non-empty step is compared: tokens per request in batch order, preemptions, new and resumed
requests with their prefix-cache hits, finished requests, free blocks before and after
scheduling and after the update, block ids of admitted requests and of appended blocks
(kvsim id = vLLM id - 1), and the running / waiting counts.

Every golden replays twice: through the readable Python V1Scheduler over a BlockManager (the
specification) and through the compiled V1Core (engine/compiled; skipped, with the reason,
where the extension is not built). Both are compared with the golden steps themselves, by the
same loop (v1_replay.replay, ``backend=``). The compiled replay's events must also be the
Python replay's, row for row, with each step stamped with the golden's time.
"""

from __future__ import annotations

import numpy as np
import pytest
from v1_replay import BACKENDS, GOLDEN, Backend, load_golden, replay

import engine.compiled
from engine import EventRecorder

NAMES = sorted(p.name.removesuffix(".steps.jsonl.gz") for p in GOLDEN.glob("*.steps.jsonl.gz"))
SLOW = {"mooncake"}  # 89k events: its event comparison runs under -m slow


def skip_without_the_compiled_core() -> None:
    if engine.compiled.load() is None:
        pytest.skip(str(engine.compiled.unavailable_reason()))


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
@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_matches_vllm_every_step(backend: Backend, name: str) -> None:
    if backend == "compiled":
        skip_without_the_compiled_core()
    _, steps, summary = load_golden(GOLDEN / f"{name}.steps.jsonl.gz")
    result = replay(name, backend=backend)
    assert result.differences == []
    assert (
        result.steps_compared
        == summary["nonempty_steps"]
        == sum(1 for s in steps if s["num_scheduled_tokens"])
    )
    assert not result.scheduler.has_unfinished()
    result.backend.check_end()  # Python: the BlockManager invariants; both: every block free


def test_goldens_exercise_what_they_are_for() -> None:
    """The configs really preempt, hit the prefix cache, resume with hits."""
    summaries = {name: load_golden(GOLDEN / f"{name}.steps.jsonl.gz")[2] for name in NAMES}
    assert all(summaries[n]["total_preemptions"] > 0 for n in ("pressure", "priority"))
    assert summaries["prefix_hash_ids"]["prefix_hit_rate"] > 0.3
    assert summaries["no_caching"]["prefix_hit_rate"] == 0
    assert sum(s["vllm_preempted_hits"] for s in summaries.values()) > 0


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in NAMES]
)
def test_compiled_replay_records_the_python_events(name: str) -> None:
    """Every event row (kind, step, request, free blocks, tokens, blocks), block id, CACHE /
    EVICT key and STEP row of the compiled replay is the Python replay's; the STEP row of
    every non-empty step carries the golden step's time."""
    skip_without_the_compiled_core()
    recorder = EventRecorder(keep_block_hashes=True)
    assert replay(name, event_sink=recorder).differences == []
    compiled = replay(name, backend="compiled")
    assert compiled.differences == []
    columns, block_ids, block_hashes, steps = compiled.scheduler.take_events()
    want, want_ids = recorder.columns()
    assert len(columns["kind"]) == len(want["kind"]) > 0
    for column in ("kind", "step", "seq_id", "free_blocks", "num_tokens", "num_blocks"):
        np.testing.assert_array_equal(columns[column], want[column], err_msg=column)
    np.testing.assert_array_equal(block_ids, want_ids)
    np.testing.assert_array_equal(block_hashes, recorder.block_hashes())
    want_steps = recorder.step_columns()
    for column in want_steps.keys() - {"time_s"}:  # the Python recorder has no clock here
        np.testing.assert_array_equal(steps[column], want_steps[column], err_msg=column)
    _, golden_steps, _ = load_golden(GOLDEN / f"{name}.steps.jsonl.gz")
    times = np.round(steps["time_s"][steps["num_batched_tokens"] > 0], 9)
    assert times.tolist() == [s["time"] for s in golden_steps if s["num_scheduled_tokens"]]
