"""The v1 scheduler's behaviour, case by case (the goldens check it against vLLM at large)."""

from __future__ import annotations

import pytest
from conftest import run_to_completion, seq_ids

from engine import (
    BlockManager,
    EventKind,
    EventRecorder,
    FastV1Scheduler,
    InvariantError,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    Sequence,
    SequenceStatus,
    StepKind,
    V1Scheduler,
)
from engine.fast.decode import FastDecodeScheduler


def v1(num_blocks=64, block_size=4, caching=True, sink=None, watermark=0.0, **cfg):
    bm = BlockManager(
        num_blocks, block_size, watermark, event_sink=sink, enable_prefix_caching=caching
    )
    return Scheduler(SchedulerConfig(scheduler="v1", **cfg), bm), bm


def seq(seq_id, prompt, max_tokens=4, **kw):
    tokens = list(prompt) if not isinstance(prompt, int) else list(range(1, prompt + 1))
    return Sequence(seq_id, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), **kw)


def step(sched, token=7):
    out = sched.schedule()
    finished = sched.update(out, [token] * out.num_seqs)
    sched.block_manager.check_invariants()
    return out, finished


def test_the_config_picks_the_scheduler():
    bm = BlockManager(8, 4)
    assert type(Scheduler(SchedulerConfig(), bm)) is Scheduler
    assert type(Scheduler(SchedulerConfig(scheduler="v1"), BlockManager(8, 4))) is V1Scheduler
    fast = FastDecodeScheduler(SchedulerConfig(scheduler="v1"), BlockManager(8, 4), token=3)
    assert type(fast) is FastV1Scheduler and fast.token == 3
    with pytest.raises(ValueError, match="scheduler"):
        SchedulerConfig(scheduler="v2")
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(policy="lifo")
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        SchedulerConfig(long_prefill_token_threshold=-1)


def classic_events(**options):
    recorder = EventRecorder()
    bm = BlockManager(12, 4, event_sink=recorder, enable_prefix_caching=options.pop("pc", False))
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, **options), bm)
    for i in range(6):
        sched.add_request(seq(i, [1, 2, 3, 4, 5, 6, 7][: 3 + i % 4], max_tokens=9, priority=-i))
    run_to_completion(sched)
    cols, blocks = recorder.columns()
    return {k: v.tolist() for k, v in cols.items()}, blocks.tolist()


def test_classic_ignores_every_v1_option():
    baseline = classic_events()
    assert baseline == classic_events(
        enable_chunked_prefill=False, long_prefill_token_threshold=2, policy="priority", pc=True
    )
    kinds = set(baseline[0]["kind"])
    assert not kinds & {EventKind.PREFIX_HIT, EventKind.CACHE, EventKind.EVICT}


def test_chunked_prefill_samples_only_when_the_prompt_is_complete():
    sched, _bm = v1(max_num_batched_tokens=8)
    s = seq(0, 20, max_tokens=2)
    sched.add_request(s)
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        assert out.context_lengths == [s.cached_token_count + out.num_new_tokens[0]]
        assert out.slot_mapping == [
            s.block_table[p // 4] * 4 + p % 4
            for p in range(s.cached_token_count, s.cached_token_count + out.num_new_tokens[0])
        ]
        chunks.append(out.num_scheduled_tokens)
        sched.update(out, [99])  # ignored until the prompt is complete
    assert chunks == [{0: 8}, {0: 8}, {0: 4}]
    assert s.generated_token_ids == [99] and s.cached_token_count == 20
    out, finished = step(sched)
    assert out.kind is StepKind.DECODE and finished == [s]


def test_decodes_and_chunks_share_one_budget_running_first():
    sched, _ = v1(max_num_batched_tokens=10)
    sched.add_request(seq(0, 3, max_tokens=5))
    step(sched)
    sched.add_request(seq(1, range(100, 130)))
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {0: 1, 1: 9} and out.kind is StepKind.MIXED


def test_long_prefill_threshold_spares_a_lone_request():
    sched, _ = v1(max_num_batched_tokens=64, long_prefill_token_threshold=5)
    sched.add_request(seq(0, 20))
    assert step(sched)[0].num_scheduled_tokens == {0: 20}  # nobody to starve
    sched.add_request(seq(1, range(100, 120)))
    sched.add_request(seq(2, range(200, 220)))
    assert step(sched)[0].num_scheduled_tokens == {0: 1, 1: 5, 2: 5}


def test_a_prefix_hit_is_whole_blocks_and_at_most_all_but_the_last_token():
    recorder = EventRecorder(keep_block_hashes=True)
    sched, _bm = v1(sink=recorder)
    first = seq(0, 12)
    sched.add_request(first)
    out, _ = step(sched)
    assert first.prefix_hit_tokens == 0 and len(first.block_table) == 3
    table = list(first.block_table)
    same = seq(1, 12)  # identical 3-block prompt: the last token is recomputed
    longer = seq(2, [*list(range(1, 13)), 50, 51, 52, 53, 54])
    sched.add_request(same)
    sched.add_request(longer)
    out, _ = step(sched)
    assert (same.prefix_hit_tokens, longer.prefix_hit_tokens) == (8, 12)
    assert out.num_scheduled_tokens == {0: 1, 1: 4, 2: 5}
    assert same.block_table[:2] == table[:2] and longer.block_table[:3] == table
    cols, _blocks = recorder.columns()
    kinds = [EventKind(k) for k in cols["kind"]]
    hit = kinds.index(EventKind.PREFIX_HIT)
    assert cols["seq_id"][hit] == 1 and cols["num_tokens"][hit] == 8
    assert recorder.blocks_of(hit) == table[:2]
    stored = [i for i, k in enumerate(kinds) if k is EventKind.CACHE]
    assert next(recorder.blocks_of(i) for i in stored) == table  # seq 0's 3 full blocks
    assert len(recorder.block_hashes()) == sum(cols["num_blocks"][i] for i in stored)
    run_to_completion(sched)


def test_blocks_in_one_batch_share_and_freed_cached_blocks_stay_evictable():
    sched, bm = v1(num_blocks=6, block_size=4)
    a, b = seq(0, 9, max_tokens=1), seq(1, 9, max_tokens=1)
    sched.add_request(a)
    sched.add_request(b)
    _out, finished = step(sched)
    assert b.prefix_hit_tokens == 8  # a cached its blocks while being scheduled
    assert finished == [a, b] and bm.get_num_free_blocks() == 6  # cached ones count as free
    c = seq(2, 9, max_tokens=1)
    sched.add_request(c)
    step(sched)
    assert c.prefix_hit_tokens == 8
    assert not bm.reset_prefix_cache() or bm.get_num_free_blocks() == 6
    assert bm.reset_prefix_cache()
    d = seq(3, 9, max_tokens=1)
    sched.add_request(d)
    step(sched)
    assert d.prefix_hit_tokens == 0


def test_reset_prefix_cache_waits_for_every_block_to_be_free():
    recorder = EventRecorder()
    sched, bm = v1(sink=recorder)
    sched.add_request(seq(0, 9, max_tokens=3))
    step(sched)
    assert not bm.reset_prefix_cache()
    run_to_completion(sched)
    assert bm.reset_prefix_cache()
    assert recorder.kinds_of(-1)[-1] is EventKind.CACHE_RESET


def test_without_caching_freed_blocks_are_reused_last_in_first_out():
    sched, _bm = v1(num_blocks=8, caching=False)
    first = seq(0, 9, max_tokens=1)
    sched.add_request(first)
    out = sched.schedule()
    assert first.block_table == [0, 1, 2]
    sched.update(out, [7])
    second = seq(1, 5, max_tokens=1)
    sched.add_request(second)
    sched.schedule()
    # freed in reverse (2, 1, 0) to the front of the queue: 2 is taken first
    assert second.block_table == [2, 1]


def test_never_runnable_requests_are_rejected_on_arrival():
    recorder = EventRecorder()
    sched, _bm = v1(num_blocks=4, block_size=4, sink=recorder, max_model_len=10)
    too_long, exactly, too_big = seq(0, 10), seq(1, 11), seq(2, 9, max_tokens=20)
    for s in (too_long, exactly, too_big):
        sched.add_request(s)
    assert too_long.status is SequenceStatus.FINISHED_REJECTED
    assert "max_model_len" in too_long.finish_reason and exactly.is_finished
    assert not too_big.is_finished  # 9 + ... capped at max_model_len 10: 3 blocks fit
    assert sched.has_unfinished()
    out = sched.schedule()
    assert seq_ids(out.rejected) == [0, 1]
    # rejections first; then 2, whose first token reaches max_model_len
    assert seq_ids(sched.update(out, [7] * out.num_seqs)) == [0, 1, 2]
    assert too_big.num_tokens == 10 and too_big.finish_reason == "length"
    sched2, _ = v1(num_blocks=2, block_size=4)
    huge = seq(0, 9)
    sched2.add_request(huge)
    assert "exceeds KV capacity" in huge.finish_reason
    assert seq_ids(run_to_completion(sched2)[0].rejected) == [0]


def test_a_sequence_that_outgrows_the_pool_is_rejected_not_stalled():
    sched, _bm = v1(num_blocks=3, block_size=2, caching=False)
    s = seq(0, 3, max_tokens=10)  # needs 7 blocks by its end; the pool has 3
    sched.add_request(s)
    outs = run_to_completion(sched)
    assert s.status is SequenceStatus.FINISHED_REJECTED and "KV capacity" in s.finish_reason
    assert s.num_preemptions == 1 and s in outs[-1].rejected


def test_preemption_recomputes_and_rehits_its_own_blocks():
    sched, _bm = v1(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    a, b = seq(0, 8, max_tokens=12), seq(1, 8, max_tokens=12)
    sched.add_request(a)
    sched.add_request(b)
    preempted = []
    for out in run_to_completion(sched):
        preempted += seq_ids(out.preempted)
        if b in out.admitted and b.num_preemptions:
            assert b.prefix_hit_tokens > 0  # its freed blocks kept their keys
    assert set(preempted) == {1}  # the last running (FCFS)


def test_priority_orders_waiting_and_picks_the_victim():
    sched, _bm = v1(num_blocks=4, block_size=4, policy="priority", max_num_seqs=1)
    low, high, later = seq(0, 3, priority=5), seq(1, 3, priority=1), seq(2, 3, priority=1)
    later.arrival_time = 1.0
    for s in (low, later, high):
        sched.add_request(s)
    assert seq_ids(sched.waiting) == [1, 2, 0]
    sched2, _ = v1(num_blocks=5, block_size=4, policy="priority", max_num_batched_tokens=64)
    keep, victim, new = seq(0, 8, 20, priority=1), seq(1, 4, 20, priority=3), seq(2, 4, 20)
    for s in (keep, victim, new):
        sched2.add_request(s)
    victims = [seq_ids(o.preempted) for o in run_to_completion(sched2) if o.preempted]
    assert victims[0] == [1]  # the largest (priority, arrival), wherever it runs


def test_abort_between_schedule_and_update_and_while_waiting():
    sched = FastDecodeScheduler(SchedulerConfig(scheduler="v1"), BlockManager(16, 4))
    for i in range(3):
        sched.add_request(seq(i, 5, max_tokens=6))
    out = sched.schedule()
    assert sched.abort(1)
    sched.update(out, [0] * out.num_seqs)
    sched.add_request(seq(3, 5))
    assert sched.abort(3) and not sched.abort(3)
    while sched.has_unfinished():
        out = sched.schedule()
        sched.update(out, [0] * out.num_seqs)
        sched.sync()
        sched.block_manager.check_invariants()
    assert sched.block_manager.get_num_free_blocks() == 16


def test_the_invariant_check_catches_a_broken_pool():
    sched, bm = v1()
    sched.add_request(seq(0, 9))
    step(sched)
    bm._ref_counts[sched.running[0].block_table[0]] += 1
    with pytest.raises(InvariantError, match="ref count"):
        bm.check_invariants()


def test_the_v1_scheduler_needs_a_fresh_paged_pool():
    bm = BlockManager(8, 4)
    bm.allocate_blocks(1)
    with pytest.raises(InvariantError, match="fresh"):
        Scheduler(SchedulerConfig(scheduler="v1"), bm)
    with pytest.raises(SchedulerError, match="scheduler='v1'"):
        V1Scheduler(SchedulerConfig(), BlockManager(8, 4))


def test_prefix_cache_events_can_be_left_out():
    def events(flag):
        recorder = EventRecorder(prefix_cache_events=flag)
        sched, bm = v1(num_blocks=8, sink=recorder)
        for i in range(5):
            sched.add_request(seq(i, 9, max_tokens=6))
        run_to_completion(sched)
        assert bm.reset_prefix_cache()
        cols, _ = recorder.columns()
        return [(EventKind(k), s) for k, s in zip(cols["kind"], cols["seq_id"])]

    full, lean = events(True), events(False)
    skipped = {EventKind.CACHE, EventKind.EVICT, EventKind.CACHE_RESET}
    assert {k for k, _ in full} >= skipped
    assert lean == [e for e in full if e[0] not in skipped]
