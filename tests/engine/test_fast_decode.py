"""FastDecodeScheduler gives exactly the plain Scheduler's events, outputs and counters."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import (
    BlockManager,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    Sequence,
    StepKind,
)
from engine.fast.decode import FastDecodeScheduler

op = st.one_of(
    # Short prompts in small pools: most requests fit, and growth keeps preempting.
    st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 40)),
    st.tuples(st.just("step"), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("abort"), st.integers(0, 30), st.just(0)),
    st.tuples(st.just("abort_mid_step"), st.integers(0, 30), st.just(0)),
    # up to N steps through run_plain_decodes (plain steps back to back), the rest as "step"
    st.tuples(st.just("run"), st.integers(1, 12), st.just(0)),
)


def drive(scheduler_class, ops, num_blocks, block_size, max_num_seqs, watermark, plain=False):
    """Run ``ops``; with ``plain`` every step that is plain goes through begin_plain_decode
    / end_plain_decode, or run_plain_decodes for "run", instead of schedule / update."""
    recorder = EventRecorder()
    bm = BlockManager(num_blocks, block_size, watermark, event_sink=recorder)
    sched = scheduler_class(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256), bm
    )
    trace = []
    next_id = 0
    for kind, a, b in ops:
        if kind == "add":
            params = SamplingParams(max_tokens=b, ignore_eos=True)
            sched.add_request(Sequence(next_id, range(a), params))
            next_id += 1
        elif kind == "abort":
            trace.append(("abort", a, sched.abort(a)))
        elif kind == "abort_mid_step":
            if plain and sched.begin_plain_decode():
                trace.append(("abort", a, sched.abort(a)))
                finished = sched.end_plain_decode()
            else:
                out = sched.schedule()
                trace.append(("abort", a, sched.abort(a)))
                finished = sched.update(out, [0] * out.num_seqs)
            trace.append(([s.seq_id for s in finished], sched.num_cached_tokens))
        elif kind == "run" and plain:
            a -= run_plain(sched, bm, a, trace)
            kind = "step"
        if kind in ("step", "run"):
            # Each step is traced as (kind, batch, tokens, preempted, rejected, finished,
            # cached tokens after it, blocks in use while it runs).
            for _ in range(a):
                batch = [s.seq_id for s in sched.running]
                n = sched.begin_plain_decode() if plain else 0
                if n:
                    used = bm.num_used_blocks
                    finished = sched.end_plain_decode()
                    trace.append(
                        (
                            StepKind.DECODE,
                            batch,
                            n,
                            [],
                            [],
                            [s.seq_id for s in finished],
                            sched.num_cached_tokens,
                            used,
                        )
                    )
                    continue
                out = sched.schedule()
                used = bm.num_used_blocks
                finished = sched.update(out, [0] * out.num_seqs)
                trace.append(
                    (
                        out.kind,
                        [s.seq_id for s in out.seqs],
                        out.num_batched_tokens,
                        [s.seq_id for s in out.preempted],
                        [s.seq_id for s in out.rejected],
                        [s.seq_id for s in finished],
                        sched.num_cached_tokens,
                        used,
                    )
                )
    while sched.has_unfinished():
        out = sched.schedule()
        finished = sched.update(out, [0] * out.num_seqs)
        trace.append((out.kind, [s.seq_id for s in out.seqs], [s.seq_id for s in finished]))
    cols, blocks = recorder.columns()
    return trace, {k: v.tolist() for k, v in cols.items()}, blocks.tolist(), sched


def run_plain(sched, bm, max_steps, trace) -> int:
    """Up to ``max_steps`` plain steps through run_plain_decodes, traced as ``drive`` traces
    a step; returns how many ran."""
    steps = []

    def close_last() -> None:
        # a step's cached tokens are final once the next one is scheduled (or none is)
        if steps and steps[-1][-2] is None:
            steps[-1][-2] = sched.num_cached_tokens

    def on_step(num_seqs, context_tokens, num_used_blocks) -> bool:
        close_last()
        assert context_tokens == sched.num_cached_tokens + num_seqs
        assert num_used_blocks == bm.num_used_blocks
        batch = [s.seq_id for s in sched.running]
        steps.append([StepKind.DECODE, batch, num_seqs, [], [], [], None, num_used_blocks])
        return len(steps) < max_steps

    def on_finished(seqs) -> None:
        steps[-1][5] = [s.seq_id for s in seqs]

    if sched.run_plain_decodes(on_step, on_finished):
        on_finished(sched.end_plain_decode())
    close_last()
    trace.extend(tuple(step) for step in steps)
    return len(steps)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(op, min_size=1, max_size=40),
    num_blocks=st.integers(2, 40),
    block_size=st.sampled_from([1, 2, 3, 4, 8, 16]),
    max_num_seqs=st.integers(1, 8),
    watermark=st.sampled_from([0.0, 0.1]),
)
def test_fast_decode_matches_the_plain_scheduler(
    ops, num_blocks, block_size, max_num_seqs, watermark
):
    plain = drive(Scheduler, ops, num_blocks, block_size, max_num_seqs, watermark)
    for use_plain_steps in (False, True):
        fast = drive(
            FastDecodeScheduler, ops, num_blocks, block_size, max_num_seqs, watermark,
            plain=use_plain_steps,
        )  # fmt: skip
        assert fast[0] == plain[0]
        assert fast[1] == plain[1]
        assert fast[2] == plain[2]
        fast[3].block_manager.check_invariants()
        assert fast[3].block_manager.get_num_free_blocks() == num_blocks


def test_plain_decode_steps_refuse_what_would_change_the_batch():
    # 4 blocks of 4 slots; two 3-token prompts take a block each
    _, _, _, sched = drive(FastDecodeScheduler, [], 4, 4, 8, 0.0)
    bm = sched.block_manager
    assert sched.begin_plain_decode() == 0  # nothing running
    for seq_id in (0, 1):
        sched.add_request(Sequence(seq_id, range(3), SamplingParams(max_tokens=10)))
    assert sched.begin_plain_decode() == 0  # a waiting sequence can be admitted
    out = sched.schedule()
    sched.update(out, [0] * out.num_seqs)
    assert out.kind is StepKind.PREFILL and sched.num_running == 2

    def plain_step() -> int:
        """Run one plain step; the blocks it appended."""
        used = bm.num_used_blocks
        assert sched.begin_plain_decode() == 2
        with pytest.raises(SchedulerError):
            sched.schedule()  # the plain step is pending
        with pytest.raises(SchedulerError):
            sched.begin_plain_decode()
        assert sched.end_plain_decode() == []
        return bm.num_used_blocks - used

    assert plain_step() == 0  # token 3 lands in each sequence's first block
    assert plain_step() == 2  # token 4 starts a second block: the last 2 free ones
    assert [plain_step() for _ in range(3)] == [0, 0, 0]
    assert bm.get_num_free_blocks() == 0
    step = sched.step
    assert sched.begin_plain_decode() == 0  # token 8 needs blocks: preemption
    assert sched.step == step  # nothing was scheduled
    out = sched.schedule()
    assert [s.seq_id for s in out.preempted] == [1]
    with pytest.raises(SchedulerError):
        sched.end_plain_decode()  # nothing plain is pending
    sched.update(out, [0] * out.num_seqs)


def test_a_victim_preempted_for_an_earlier_sequence_gets_no_block():
    # Block size 1: all three need a block each decode step. With one block free, 0 takes
    # it, 1 preempts 2 (the most recently admitted) and takes one of its blocks; 2, also due
    # a block this step, must not get one.
    ops = [("add", 3, 10), ("add", 3, 10), ("add", 3, 10), ("step", 4, 0)]
    plain = drive(Scheduler, ops, 10, 1, 8, 0.0)
    fast = drive(FastDecodeScheduler, ops, 10, 1, 8, 0.0)
    assert plain[0][1][3] == [2]  # the second step preempted sequence 2
    assert fast[:3] == plain[:3]


def test_sync_brings_running_sequences_up_to_date():
    bm = BlockManager(64, 4)
    sched = FastDecodeScheduler(SchedulerConfig(), bm)
    seq = Sequence(0, range(6), SamplingParams(max_tokens=10, ignore_eos=True))
    sched.add_request(seq)
    for _ in range(4):  # prefill + 3 decodes
        out = sched.schedule()
        sched.update(out, [0] * out.num_seqs)
    sched.sync()
    assert seq.cached_token_count == 9 and len(seq.generated_token_ids) == 4
    assert seq.block_table == [0, 1, 2]
    bm.check_invariants()


def test_fast_decode_refuses_sequences_a_token_could_stop():
    sched = FastDecodeScheduler(SchedulerConfig(), BlockManager(8, 4))
    with pytest.raises(SchedulerError, match="placeholder"):
        sched.add_request(Sequence(0, range(3), SamplingParams(eos_token_id=2)))


def test_a_sequence_outgrowing_the_pool_alone_is_rejected_with_its_exact_token_count():
    # It decodes lazily until it needs a third block of two: the rejection's reason counts
    # its real tokens (prompt 4 + 5 generated), as the plain Scheduler's does, not those of
    # its last mark.
    reasons = []
    for scheduler_class in (Scheduler, FastDecodeScheduler):
        sched = scheduler_class(SchedulerConfig(), BlockManager(2, 4))
        seq = Sequence(0, range(4), SamplingParams(max_tokens=100, ignore_eos=True))
        sched.add_request(seq)
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update(out, [0] * out.num_seqs)
        reasons.append(seq.finish_reason)
    assert reasons == ["exceeds KV capacity: 9 tokens do not fit in 2 blocks of 4"] * 2
