"""The v1 scheduler with a CPU offload tier (engine/offload), on hand-made cases whose every
decision follows from vLLM 0.33's OffloadingConnector rules (docs/offload.md), and as a
property: an empty tier changes no decision, and any tier keeps every invariant."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offload_drive import drive

PROMPT = list(range(100, 124))  # 24 tokens: 6 blocks of 4


def _admissions(d):  # type: ignore[no-untyped-def]
    return {seq: (hit, loaded) for step in d.steps for seq, hit, loaded in step.admitted}


def test_a_prompt_evicted_from_the_gpu_is_loaded_back_from_the_tier() -> None:
    # A 7-block pool: request 1 (unrelated, 6 blocks) evicts request 0's cached blocks from
    # the GPU, tail first (vLLM frees a table in reverse), so only its first block survives;
    # request 2 repeats request 0's prompt: 1 block from the GPU, the other 5 from the tier.
    other = list(range(500, 524))
    d = drive(
        [(PROMPT, 1, 0.0), (other, 1, 0.1), ([*PROMPT, 1, 2, 3, 4], 1, 0.2)],
        num_blocks=7,
        max_num_batched_tokens=64,
    )
    adm = _admissions(d)
    assert adm[0] == (0, 0)
    assert adm[1] == (0, 0)
    assert adm[2] == (4, 20)
    loads = [load for step in d.steps for load in step.loads]
    assert [(seq, len(keys)) for seq, keys in loads] == [(2, 5)]
    # it computed only its 4 new tokens after the load
    assert next(n for step in d.steps for seq, n in step.tokens if seq == 2) == 4


def test_a_request_waits_for_its_load_before_it_computes() -> None:
    other = list(range(500, 524))
    # slow link: 5 blocks x 1000 bytes at 1e4 B/s = 0.5 s
    d = drive(
        [(PROMPT, 1, 0.0), (other, 1, 0.1), ([*PROMPT, 1, 2, 3, 4], 1, 0.2)],
        num_blocks=7,
        bandwidth=1e4,
    )
    run_step = next(s for s in d.steps if any(q == 2 for q, _ in s.tokens))
    load_job = next(
        j
        for j in d.worker.timings.values()
        if not j.job.is_store  # type: ignore[union-attr]
    )
    assert load_job.completed_s is not None
    assert abs(load_job.completed_s - load_job.submitted_s - 0.5) < 1e-9
    assert run_step.time_s >= load_job.completed_s


def test_a_whole_prompt_loaded_still_computes_its_last_token() -> None:
    other = list(range(500, 524))
    d = drive([(PROMPT, 1, 0.0), (other, 1, 0.1), (PROMPT, 2, 0.2)], num_blocks=7)
    assert _admissions(d)[2] == (4, 20)
    # vLLM: a load covering num_tokens leaves num_tokens - 1 computed
    assert next(n for step in d.steps for seq, n in step.tokens if seq == 2) == 1


def test_the_gpu_hit_comes_first_and_the_tier_extends_it() -> None:
    # Request 1 shares request 0's first 3 blocks; a third request repeats request 0 after
    # request 1 has evicted request 0's tail from the GPU (but not the shared head).
    shared = PROMPT[:12]
    d = drive(
        [(PROMPT, 1, 0.0), (shared + list(range(600, 612)), 1, 0.1), (PROMPT, 1, 0.2)],
        num_blocks=7,
    )
    hit, loaded = _admissions(d)[2]
    assert hit >= 12 and loaded > 0 and hit + loaded == 24


def test_stores_are_prompt_chunks_once_each() -> None:
    d = drive([(PROMPT, 9, 0.0), (PROMPT, 9, 0.1)], num_blocks=40)
    stored = [k for step in d.steps for seq, keys in step.stores for k in keys]
    assert len(stored) == len(set(stored)) == 6  # prompt only, nothing twice
    assert all(seq == 0 for step in d.steps for seq, _ in step.stores)


def test_a_store_the_tier_cannot_make_room_for_stores_nothing() -> None:
    # vLLM's prepare_store is all or nothing: 6 chunks offered to a 2-chunk tier with
    # nothing evictable store none (offered again every step, in vain).
    d = drive([(PROMPT, 1, 0.0), (list(range(300, 324)), 1, 1.0)], num_blocks=40, num_chunks=2)
    assert d.sched.connector is not None
    assert d.sched.connector.manager.num_held == 0
    assert not [job for step in d.steps for job in step.stores]
    # a 6-chunk tier takes them
    d = drive([(PROMPT, 1, 0.0)], num_blocks=40, num_chunks=6)
    assert d.sched.connector is not None and d.sched.connector.manager.num_held == 6


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(
            st.integers(0, 3),  # which shared prefix
            st.integers(1, 20),  # own tokens
            st.integers(1, 12),  # output tokens
            st.floats(0, 0.05),  # gap before it
        ),
        min_size=1,
        max_size=25,
    ),
    num_blocks=st.integers(12, 40),
    num_chunks=st.integers(0, 30),
    blocks_per_chunk=st.sampled_from([1, 2]),
    policy=st.sampled_from(["lru", "arc"]),
    bandwidth=st.sampled_from([1e4, 1e5, 1e7]),
)
def test_offload_keeps_the_invariants_and_finishes_everything(
    requests: list[tuple[int, int, int, float]],
    num_blocks: int,
    num_chunks: int,
    blocks_per_chunk: int,
    policy: str,
    bandwidth: float,
) -> None:
    prefixes = [list(range(1000 * p, 1000 * p + 16)) for p in range(4)]
    rows, t = [], 0.0
    for i, (p, own, out, gap) in enumerate(requests):
        t += gap
        rows.append((prefixes[p] + [10_000 + 100 * i + j for j in range(own)], out, t))
    d = drive(
        rows,
        num_blocks=num_blocks,
        num_chunks=num_chunks,
        blocks_per_chunk=blocks_per_chunk,
        policy=policy,
        bandwidth=bandwidth,
    )
    assert not d.sched.has_unfinished()
    assert all(s.is_finished for s in d.seqs)
    connector = d.sched.connector
    assert connector is not None and not connector.has_pending_work()
    # every load read chunks the tier held; nothing pinned is left
    manager = connector.manager
    assert manager.num_write_pending == 0
    assert manager.num_evictable == manager.num_held


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 20), st.integers(1, 12), st.floats(0, 0.05)),
        min_size=1,
        max_size=25,
    ),
    num_blocks=st.integers(12, 40),
)
def test_an_empty_tier_changes_no_decision(
    requests: list[tuple[int, int, int, float]], num_blocks: int
) -> None:
    prefixes = [list(range(1000 * p, 1000 * p + 16)) for p in range(4)]
    rows, t = [], 0.0
    for i, (p, own, out, gap) in enumerate(requests):
        t += gap
        rows.append((prefixes[p] + [10_000 + 100 * i + j for j in range(own)], out, t))
    plain = drive(rows, num_blocks=num_blocks, num_chunks=None)
    empty = drive(rows, num_blocks=num_blocks, num_chunks=0)
    assert [(s.tokens, s.admitted, s.preempted) for s in empty.steps if s.tokens] == [
        (s.tokens, s.admitted, s.preempted) for s in plain.steps if s.tokens
    ]
