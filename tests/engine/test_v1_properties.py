"""Property tests of the v1 scheduler: random arrivals, steps, aborts (between steps and
between schedule() and update()) and multi-step decode windows, under random pools, block
sizes, budgets, thresholds, policies, caching, chunking, watermarks and max_model_len.

Every step checks the BlockManager's v1 invariants (reference counts, the prefix-cache map,
the free queue with its evictable blocks, each holder's chunk progress), and the cost-mode
FastV1Scheduler must give exactly the plain V1Scheduler's steps, events, block ids, cache
keys and final sequences.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from v1_drive import drive, op, v1_setups

from engine import SequenceStatus


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
def test_fast_v1_matches_the_plain_v1_scheduler(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    plain = drive(False, ops, setup, check=True)
    fast = drive(True, ops, setup, check=True)
    assert fast.trace == plain.trace
    assert fast.events == plain.events
    assert fast.block_ids == plain.block_ids
    assert fast.block_hashes == plain.block_hashes
    for a, b in zip(fast.sequences, plain.sequences):
        assert (a.status, a.generated_token_ids, a.num_preemptions, a.finish_reason) == (
            b.status,
            b.generated_token_ids,
            b.num_preemptions,
            b.finish_reason,
        )
    bm = plain.scheduler.block_manager
    assert bm.get_num_free_blocks() == setup["num_blocks"]  # cached blocks are free
    assert bm.reset_prefix_cache()
    bm.check_invariants()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), setup=v1_setups())
def test_every_request_ends_and_outputs_are_consistent(
    ops: list[tuple[str, int, int, int, int]], setup: dict[str, Any]
) -> None:
    result = drive(False, ops, setup, check=True)
    budget = setup["max_num_batched_tokens"]
    for step in result.trace:
        if step[0] == "abort":
            continue
        _, batch, tokens, preempted, _, admitted, _, _, _ = step
        assert sum(tokens) <= budget
        assert len(batch) == len(set(batch)) <= setup["max_num_seqs"]
        assert not set(preempted) & set(batch)
        if preempted:
            assert not admitted  # nothing is admitted in a step that preempts
        if setup["threshold"] and len(batch) > 1:
            assert all(t <= setup["threshold"] for t in tokens)
    for seq in result.sequences:
        assert seq.status.is_finished
        if seq.status is SequenceStatus.FINISHED_LENGTH:
            max_len = setup["max_model_len"]
            assert seq.num_generated_tokens == seq.sampling_params.max_tokens or (
                max_len is not None and seq.num_tokens == max_len
            )
        assert seq.block_table == []
