"""EventRecorder: whatever the chunking, the packed columns are the events in recording order
(an APPEND run expanded into one event per block, one step row per STEP event)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EventKind, EventRecorder, StepKind

# ("event", seq_id, num_blocks) | ("appends", run length) | ("step", num_seqs)
# | ("decode", appends, num_seqs): a whole decode step in one call
# | ("blocks", pattern, 0): a block run (record_block_events) of takes, evictions and caches
action = st.one_of(
    st.tuples(st.just("blocks"), st.integers(0, 3**6 - 1), st.just(0)),
    st.tuples(st.just("event"), st.integers(0, 9), st.integers(0, 3)),
    st.tuples(st.just("appends"), st.integers(1, 6), st.just(0)),
    st.tuples(st.just("step"), st.integers(1, 9), st.just(0)),
    st.tuples(st.just("decode"), st.integers(0, 6), st.integers(1, 9)),
)


def replay(
    actions: list[tuple[str, int, int]], chunk_size: int, **options: object
) -> tuple[EventRecorder, list]:
    """Record ``actions``; also return the events as plain tuples, written out one by one."""
    time = [0.0]
    recorder = EventRecorder(clock=lambda: time[0], chunk_size=chunk_size, **options)
    expected: list[tuple] = []  # (time, step, kind, seq_id, free, tokens, blocks, block ids)
    next_block = 0
    for i, (what, a, b) in enumerate(actions):
        time[0] = 0.5 * i
        recorder.begin_step(i // 3)
        free = 100 - i
        if what == "event":
            ids = list(range(next_block, next_block + b))
            next_block += b
            recorder.record(EventKind.ALLOCATE, a, free, ids, 7)
            expected.append((time[0], i // 3, EventKind.ALLOCATE, a, free, 7, b, ids))
        elif what == "appends":
            seqs = [10 + k for k in range(a)]
            ids = list(range(next_block, next_block + a))
            next_block += a
            recorder.record_appends(seqs, ids, free)
            expected += [
                (time[0], i // 3, EventKind.APPEND_BLOCK, s, free - k, 1, 1, [blk])
                for k, (s, blk) in enumerate(zip(seqs, ids))
            ]
        elif what == "decode":
            seqs = [20 + k for k in range(a)]
            ids = list(range(next_block, next_block + a))
            next_block += a
            # free after the step's appends: the first append left a - 1 more
            recorder.record_decode_step(i // 3, b, free, seqs, ids)
            expected += [
                (time[0], i // 3, EventKind.APPEND_BLOCK, s, free + a - 1 - k, 1, 1, [blk])
                for k, (s, blk) in enumerate(zip(seqs, ids))
            ]
            # a decode step's token count is its batch size
            expected.append((time[0], i // 3, EventKind.STEP, -1, free, b, 0, []))
        elif what == "blocks":
            # pattern's base-3 digits: 0 a take, 1 a take of a cached block (EVICT first),
            # 2 a cache; each take leaves one block fewer, its EVICT sees the count after it
            kinds, seqs, ids, tokens = [], [], [], []
            left = free
            for k in range(1 + a % 6):
                digit = (a // 3**k) % 3
                blk, seq = next_block, 30 + k
                next_block += 1
                if digit < 2:
                    left -= 1
                if digit == 1:
                    kinds.append(EventKind.EVICT)
                    seqs.append(-1), ids.append(blk), tokens.append(0)
                    expected.append((time[0], i // 3, EventKind.EVICT, -1, left, 0, 1, [blk]))
                kind = EventKind.CACHE if digit == 2 else EventKind.APPEND_BLOCK
                num_tokens = k if digit == 2 else 1
                kinds.append(kind)
                seqs.append(seq), ids.append(blk), tokens.append(num_tokens)
                expected.append((time[0], i // 3, kind, seq, left, num_tokens, 1, [blk]))
            recorder.record_block_events(kinds, seqs, ids, tokens, free)
        else:
            recorder.record_step(StepKind.DECODE, a, 2 * a, free)
            expected.append((time[0], i // 3, EventKind.STEP, -1, free, 2 * a, 0, []))
    return recorder, expected


@settings(max_examples=150, deadline=None)
@given(actions=st.lists(action, max_size=30), chunk_size=st.integers(1, 8))
def test_columns_are_the_events_in_order_whatever_the_chunking(
    actions: list[tuple[str, int, int]], chunk_size: int
) -> None:
    recorder, expected = replay(actions, chunk_size)
    assert len(recorder) == len(expected)
    cols, block_ids = recorder.columns()
    got = list(
        zip(
            cols["time_s"].tolist(),
            cols["step"].tolist(),
            cols["kind"].tolist(),
            cols["seq_id"].tolist(),
            cols["free_blocks"].tolist(),
            cols["num_tokens"].tolist(),
            cols["num_blocks"].tolist(),
        )
    )
    assert got == [e[:7] for e in expected]
    assert block_ids.tolist() == [b for e in expected for b in e[7]]
    steps = recorder.step_columns()
    step_events = [e for e in expected if e[2] == EventKind.STEP]
    assert steps["time_s"].tolist() == [e[0] for e in step_events]
    assert steps["step"].tolist() == [e[1] for e in step_events]
    assert steps["num_batched_tokens"].tolist() == [e[5] for e in step_events]
    assert steps["num_seqs"].tolist() == [
        e[5] if what == "decode" else e[5] // 2
        for e, what in zip(step_events, [a[0] for a in actions if a[0] in ("step", "decode")])
    ]
    assert steps["free_blocks"].tolist() == [e[4] for e in step_events]
    assert (steps["kind"] == StepKind.DECODE).all()


@settings(max_examples=100, deadline=None)
@given(
    actions=st.lists(action, max_size=30),
    chunk_size=st.integers(1, 8),
    kinds=st.sets(st.sampled_from([EventKind.ALLOCATE, EventKind.APPEND_BLOCK, EventKind.STEP])),
)
def test_a_lean_recorder_keeps_the_kinds_asked_with_their_first_block(
    actions: list[tuple[str, int, int]], chunk_size: int, kinds: set[EventKind]
) -> None:
    # What a streamed run keeps in memory: only some kinds, and each event's first block id.
    recorder, expected = replay(actions, chunk_size, keep_kinds=kinds, keep_block_ids=False)
    cols, block_ids = recorder.columns()
    kept = [e for e in expected if e[2] in kinds]
    assert cols["kind"].tolist() == [e[2] for e in kept]
    assert cols["seq_id"].tolist() == [e[3] for e in kept]
    assert cols["first_block"].tolist() == [e[7][0] if e[7] else -1 for e in kept]
    assert len(block_ids) == 0


def test_chunks_handed_out_carry_expanded_appends() -> None:
    chunks: list[dict[str, np.ndarray]] = []
    recorder = EventRecorder(chunk_size=2, on_chunk=lambda cols, ids: chunks.append(cols))
    recorder.record_appends([4, 5, 6], [7, 8, 9], 20)  # 3 appends >= chunk_size: packed
    recorder.record_step(StepKind.DECODE, 3, 3, 17)
    recorder.record_decode_step(5, 3, 15, [4, 6], [10, 11])
    recorder.flush()
    assert [c["kind"].tolist() for c in chunks] == [[4, 4, 4], [10, 4, 4, 10]]
    assert [c["free_blocks"].tolist() for c in chunks] == [[20, 19, 18], [17, 16, 15, 15]]
    assert chunks[1]["step"].tolist() == [0, 5, 5, 5]
    assert len(recorder) == 7


def test_a_chunk_holds_at_most_chunk_size_appends_beyond_its_rows() -> None:
    # A decode step at block size 1 appends a block for every running sequence: the chunk
    # must close on appends too, or one chunk of rows could hold millions of events.
    sizes: list[int] = []
    recorder = EventRecorder(chunk_size=100, on_chunk=lambda cols, ids: sizes.append(len(ids)))
    for step in range(1, 51):
        recorder.record_decode_step(step, 64, 1000, list(range(64)), list(range(64)))
    recorder.flush()
    assert sum(sizes) == 50 * 64 and max(sizes) < 2 * 100


def test_dropped_events_are_refused_and_steps_stay() -> None:
    recorder = EventRecorder(chunk_size=4)
    for step in range(6):
        recorder.begin_step(step)
        recorder.record(EventKind.ARRIVE, step, 10)
        recorder.record_step(StepKind.DECODE, 1, 1, 9)
    steps = recorder.step_columns()
    assert recorder.step_columns() is steps  # merged once, then handed out as is
    recorder.drop_kept()
    assert recorder.step_columns()["step"].tolist() == list(range(6))
    with pytest.raises(RuntimeError, match="dropped"):
        recorder.columns()
