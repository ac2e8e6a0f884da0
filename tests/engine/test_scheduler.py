"""Scheduler policy: admission, decode, preemption, finishing, abort and rejection."""

import pytest

from engine import (
    BlockManager,
    EventKind,
    EventRecorder,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    Sequence,
    SequenceStatus,
    StepKind,
)
from tests.engine.conftest import EOS, run_to_completion, seq_ids


def make(
    num_blocks: int = 64,
    block_size: int = 4,
    recorder: EventRecorder | None = None,
    **config: int,
) -> Scheduler:
    bm = BlockManager(num_blocks=num_blocks, block_size=block_size, event_sink=recorder)
    return Scheduler(SchedulerConfig(**config), bm)


def req(seq_id: int, prompt: int, max_tokens: int = 4, **params: object) -> Sequence:
    return Sequence(
        seq_id, list(range(10, 10 + prompt)), SamplingParams(max_tokens=max_tokens, **params)
    )


def test_prefill_then_decode_follow_the_token_semantics():
    sched = make()
    seq = req(0, 6, max_tokens=3)
    sched.add_request(seq)
    out = sched.schedule()
    assert out.kind is StepKind.PREFILL
    assert out.slot_mapping == [0, 1, 2, 3, 4, 5]
    assert out.context_lengths == [6]
    sched.update(out, [100])
    assert seq.cached_token_count == 6
    assert seq.generated_token_ids == [100] and seq.last_token_id == 100
    out = sched.schedule()
    assert out.kind is StepKind.DECODE
    assert out.slot_mapping == [6]  # token 100 is written at index 6
    assert out.context_lengths == [7]
    sched.update(out, [101])
    out = sched.schedule()
    sched.update(out, [102])
    assert seq.status is SequenceStatus.FINISHED_LENGTH
    assert seq.generated_token_ids == [100, 101, 102]
    assert sched.block_manager.get_num_free_blocks() == 64
    assert not sched.has_unfinished()


def test_admission_is_fcfs_and_stops_at_the_first_request_that_does_not_fit():
    sched = make(num_blocks=10, block_size=4, max_num_batched_tokens=64)
    sched.add_request(req(0, 16))  # 4 blocks
    sched.add_request(req(1, 40))  # 10 blocks: does not fit beside 0
    sched.add_request(req(2, 4))  # would fit, but may not overtake 1
    out = sched.schedule()
    assert seq_ids(out.seqs) == [0]
    assert seq_ids(sched.waiting) == [1, 2]


def test_token_budget_and_max_num_seqs_limit_a_prefill_batch():
    sched = make(max_num_batched_tokens=10, max_num_seqs=8)
    for i in range(4):
        sched.add_request(req(i, 4))
    assert seq_ids(sched.schedule().seqs) == [0, 1]  # 8 tokens; a third would make 12
    sched = make(max_num_seqs=3)
    for i in range(4):
        sched.add_request(req(i, 4))
    assert seq_ids(sched.schedule().seqs) == [0, 1, 2]


def test_eos_stop_tokens_and_ignore_eos():
    sched = make()
    a = req(0, 3, max_tokens=10, eos_token_id=EOS)
    b = req(1, 3, max_tokens=10, eos_token_id=EOS, ignore_eos=True)
    c = req(2, 3, max_tokens=10, stop_token_ids=(9,))
    for s in (a, b, c):
        sched.add_request(s)
    out = sched.schedule()
    finished = sched.update(out, [EOS, EOS, 9])
    assert seq_ids(finished) == [0, 2]
    assert a.status is SequenceStatus.FINISHED_STOPPED and a.generated_token_ids == [EOS]
    assert c.status is SequenceStatus.FINISHED_STOPPED
    assert b.status is SequenceStatus.RUNNING
    assert seq_ids(sched.running) == [1]


def test_preemption_picks_the_most_recently_admitted_and_it_still_finishes_with_max_tokens():
    recorder = EventRecorder()
    # 3 sequences of 4-token prompts at block size 4 fill 3 of 4 blocks, then all need
    # a second block on their first decode: 0 takes the free one, and 1 gets the block
    # freed by preempting 2, the most recently admitted.
    sched = make(num_blocks=4, block_size=4, recorder=recorder)
    seqs = [req(i, 4, max_tokens=6) for i in range(3)]
    for s in seqs:
        sched.add_request(s)
    sched.update(sched.schedule(), [1, 1, 1])
    out = sched.schedule()
    assert out.kind is StepKind.DECODE
    assert seq_ids(out.preempted) == [2]
    assert seq_ids(out.seqs) == [0, 1]
    assert seq_ids(sched.waiting) == [2]
    assert seqs[2].cached_token_count == 0 and seqs[2].block_table == []
    sched.update(out, [1, 1])
    run_to_completion(sched)
    for s in seqs:
        assert s.status is SequenceStatus.FINISHED_LENGTH
        assert len(s.generated_token_ids) == 6
    assert seqs[2].num_preemptions >= 1
    assert EventKind.PREEMPT in recorder.kinds_of(2)
    assert EventKind.RESUME in recorder.kinds_of(2)
    assert sched.block_manager.get_num_free_blocks() == 4


def test_resumed_sequence_recomputes_prompt_plus_generated_tokens():
    sched = make(num_blocks=4, block_size=4)
    a, b = req(0, 4, max_tokens=8), req(1, 7, max_tokens=8)
    sched.add_request(a)
    sched.add_request(b)
    sched.update(sched.schedule(), [50, 60])  # a: 1 block, b: 2 blocks, 1 free
    sched.update(sched.schedule(), [51, 61])  # a needs block 2: takes the free one
    out = sched.schedule()  # b needs a block at token 8, none free: b is preempted
    assert seq_ids(out.preempted) == [1]
    sched.update(out, [52])
    assert b.generated_token_ids == [60, 61]
    while b.status is SequenceStatus.WAITING:
        out = sched.schedule()
        sched.update(out, [9] * out.num_seqs)
    assert out.kind is StepKind.PREFILL and b in out.seqs
    assert out.num_new_tokens[out.seqs.index(b)] == 7 + 2
    assert b.cached_token_count == 9 and b.generated_token_ids == [60, 61, 9]


def test_abort_frees_waiting_and_running_sequences_at_once():
    recorder = EventRecorder()
    sched = make(num_blocks=8, block_size=4, recorder=recorder, max_num_seqs=1)
    running, waiting = req(0, 8), req(1, 8)
    sched.add_request(running)
    sched.add_request(waiting)
    sched.update(sched.schedule(), [1])
    assert sched.abort(1) and sched.abort(0)
    assert not sched.abort(0)
    assert not sched.abort(99)
    assert running.status is SequenceStatus.FINISHED_ABORTED
    assert waiting.status is SequenceStatus.FINISHED_ABORTED
    assert sched.block_manager.get_num_free_blocks() == 8
    assert not sched.has_unfinished()
    assert recorder.kinds_of(0)[-2:] == [EventKind.ABORT, EventKind.FREE]


def test_abort_between_schedule_and_update_skips_the_sequence():
    sched = make()
    a, b = req(0, 4), req(1, 4)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    sched.abort(0)
    sched.update(out, [5, 6])
    assert a.generated_token_ids == [] and b.generated_token_ids == [6]
    sched.block_manager.check_invariants()


def test_impossible_prompt_is_rejected_while_later_requests_still_run():
    sched = make(num_blocks=4, block_size=4, max_model_len=100)
    too_big = req(0, 17)  # 5 blocks > the pool
    too_long = req(1, 101)
    fine = req(2, 4, max_tokens=2)
    for s in (too_big, too_long, fine):
        sched.add_request(s)
    out = sched.schedule()
    assert seq_ids(out.rejected) == [0, 1] and seq_ids(out.seqs) == [2]
    finished = sched.update(out, [1])
    assert seq_ids(finished) == [0, 1]
    assert "KV capacity" in (too_big.finish_reason or "")
    assert "max_model_len" in (too_long.finish_reason or "")
    run_to_completion(sched)
    assert fine.status is SequenceStatus.FINISHED_LENGTH


def test_prompt_over_the_token_budget_is_rejected_not_stuck():
    sched = make(max_num_batched_tokens=8)
    sched.add_request(req(0, 9))
    out = sched.schedule()
    assert out.is_empty and seq_ids(out.rejected) == [0]
    assert sched.update(out, [])[0].status is SequenceStatus.FINISHED_REJECTED
    assert not sched.has_unfinished()


def test_sequence_growing_past_the_whole_pool_is_rejected_not_looping():
    sched = make(num_blocks=2, block_size=4)
    seq = req(0, 4, max_tokens=100)
    sched.add_request(seq)
    outputs = run_to_completion(sched, max_steps=50)
    assert seq.status is SequenceStatus.FINISHED_REJECTED
    assert "KV capacity" in (seq.finish_reason or "")
    # The pool's 8 slots held tokens 0..7; token 8 was sampled but has nowhere to go.
    assert seq.num_tokens == 9 and len(seq.generated_token_ids) == 5
    assert len(outputs) == 6 and outputs[-1].is_empty
    assert sched.block_manager.get_num_free_blocks() == 2


def test_max_model_len_finishes_a_sequence_as_length():
    sched = make(max_model_len=8)
    seq = req(0, 6, max_tokens=100)
    sched.add_request(seq)
    run_to_completion(sched)
    assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.num_tokens == 8


def test_update_must_follow_its_own_schedule():
    sched = make()
    sched.add_request(req(0, 4))
    out = sched.schedule()
    with pytest.raises(SchedulerError, match="never updated"):
        sched.schedule()
    with pytest.raises(SchedulerError, match="sampled tokens"):
        sched.update(out, [])
    sched.update(out, [1])
    with pytest.raises(SchedulerError, match="before update"):
        _ = out.slot_mapping


def test_events_trace_one_request_life():
    recorder = EventRecorder()
    sched = make(recorder=recorder)
    sched.add_request(req(0, 4, max_tokens=2))
    run_to_completion(sched)
    assert recorder.kinds_of(0) == [
        EventKind.ARRIVE,
        EventKind.ALLOCATE,
        EventKind.ADMIT,
        EventKind.APPEND_BLOCK,
        EventKind.FINISH,
        EventKind.FREE,
    ]
    cols, _ = recorder.columns()
    assert list(cols["step"][cols["kind"] == EventKind.STEP]) == [1, 2]
    assert cols["free_blocks"][-1] == 64
    steps = recorder.step_columns()
    assert list(steps["kind"]) == [StepKind.PREFILL, StepKind.DECODE]
    assert list(steps["num_batched_tokens"]) == [4, 1]


def test_preempted_sequences_return_to_the_front_of_the_queue_in_admission_order():
    sched = make(num_blocks=5, block_size=4)
    seqs = [req(i, 4, max_tokens=6) for i in range(5)]
    for s in seqs:
        sched.add_request(s)
    sched.update(sched.schedule(), [1] * 5)  # all 5 blocks used, each needs one more
    late = req(9, 4)
    sched.add_request(late)
    out = sched.schedule()
    # 0 needs a block: preempt 4; 1 needs one: preempt 3; 2 needs one: it is the last,
    # so it goes itself.
    assert seq_ids(out.preempted) == [4, 3, 2]
    assert seq_ids(out.seqs) == [0, 1]
    assert seq_ids(sched.waiting) == [2, 3, 4, 9]
